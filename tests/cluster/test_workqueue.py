"""WorkQueue: de-duplication, one worker per key, delayed and rate-limited re-adds."""

from __future__ import annotations

import threading
import time

import pytest

from driver.cluster.workqueue import RateLimit, WorkQueue
from tests.cluster.fakes import FakeClock


def test_adding_a_waiting_key_twice_queues_it_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "a", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert [queue.get(timeout=0), queue.get(timeout=0), queue.get(timeout=0)] == ["a", "b", "c"]
    assert queue.get(timeout=0) is None


def test_key_added_while_processing_comes_back_only_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.add("a")
    queue.add("a")
    assert queue.get(timeout=0) is None  # not handed to a second worker meanwhile
    queue.done("a")
    assert queue.get(timeout=0) == "a"
    queue.done("a")
    assert queue.get(timeout=0) is None


def test_concurrent_workers_never_process_one_key_at_the_same_time() -> None:
    queue: WorkQueue[int] = WorkQueue()
    active: set[int] = set()
    overlaps: list[int] = []
    processed: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        while (key := queue.get()) is not None:
            with lock:
                if key in active:
                    overlaps.append(key)
                active.add(key)
            time.sleep(0.0005)
            with lock:
                active.discard(key)
                processed.append(key)
            queue.done(key)

    workers = [threading.Thread(target=worker) for _ in range(4)]
    for thread in workers:
        thread.start()
    for round_ in range(200):
        queue.add(round_ % 5)
        if round_ % 20 == 0:
            time.sleep(0.002)
    deadline = time.monotonic() + 10
    while (len(queue) or queue.processing()) and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.shutdown()
    for thread in workers:
        thread.join(5)
    assert overlaps == []
    assert set(processed) == {0, 1, 2, 3, 4}


def test_get_blocks_until_an_add_and_shutdown_wakes_every_waiter() -> None:
    queue: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    threads = [threading.Thread(target=lambda: got.append(queue.get())) for _ in range(3)]
    for thread in threads:
        thread.start()
    queue.add("x")
    time.sleep(0.05)
    queue.shutdown()
    for thread in threads:
        thread.join(2)
    assert sorted(got, key=lambda key: key or "") == [None, None, "x"]
    queue.add("y")
    assert queue.get(timeout=0) is None


def test_add_after_holds_the_key_until_its_time() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("later", 0.15)
    queue.add_after("later", 5.0)  # a later add does not postpone the earlier one
    assert queue.get(timeout=0.01) is None
    assert queue.pending_delayed() == 1
    started = time.monotonic()
    assert queue.get(timeout=5) == "later"
    assert time.monotonic() - started > 0.05
    assert queue.pending_delayed() == 0


def test_rate_limited_delay_doubles_per_failure_is_capped_and_forget_resets_it() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(
        rate_limit=RateLimit(base_delay=0.01, max_delay=0.05, qps=0, burst=1), clock=clock
    )

    def delay_of_next_retry() -> float:
        queue.add_rate_limited("k")
        waited = 0.0
        while queue.get(timeout=0) is None:
            clock.advance(0.001)
            waited += 0.001
            assert waited < 1.0
        queue.done("k")
        return waited

    observed = [delay_of_next_retry() for _ in range(5)]
    assert observed == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05], abs=0.0015)
    assert queue.num_requeues("k") == 5
    queue.forget("k")
    assert queue.num_requeues("k") == 0
    assert delay_of_next_retry() == pytest.approx(0.01, abs=0.0015)


def test_overall_rate_limit_spaces_out_many_keys() -> None:
    clock = FakeClock()
    queue: WorkQueue[int] = WorkQueue(
        rate_limit=RateLimit(base_delay=0.0, max_delay=0.0, qps=10, burst=2), clock=clock
    )
    for key in range(4):
        queue.add_rate_limited(key)
    ready_now = [queue.get(timeout=0) for _ in range(4)]
    assert ready_now == [0, 1, None, None]  # the burst goes at once, the rest waits for tokens
    clock.advance(0.1)
    assert queue.get(timeout=0) == 2
    assert queue.get(timeout=0) is None
    clock.advance(0.1)
    assert queue.get(timeout=0) == 3


def test_an_ordered_queue_hands_out_the_smallest_order_first_and_keeps_it_on_requeue() -> None:
    orders = {"low": 3, "high": 1, "mid": 2}
    queue: WorkQueue[str] = WorkQueue(order=orders.__getitem__)
    for key in ("low", "high", "mid"):
        queue.add(key)
    assert [queue.get(timeout=1) for _ in range(3)] == ["high", "mid", "low"]
    queue.add("high")  # added again while being processed: handed out again after done
    queue.add("low")
    for key in ("high", "mid", "low"):
        queue.done(key)
    assert [queue.get(timeout=1) for _ in range(2)] == ["high", "low"]
