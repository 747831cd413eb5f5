"""Crash safety and races: two allocators at once, a leader killed mid-burst. Whatever happens, no
placement is used twice and every pod that fits is placed."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import pytest

from api.names import SCHEDULING_GATE
from controller.allocation.sync import Result, SyncConfig
from controller.informers import ClusterInformers
from driver.cluster.kube import KubeClusterApi
from driver.cluster.port import PODS, gate_names
from driver.cluster.views import PodView
from localcluster.apiserver import LocalApiServer
from tests.controller.harness import (
    NS,
    assert_no_overlap,
    cluster_api,
    create_pod_with_claim,
    publish_node,
    start_controller,
    wait_for,
    wait_for_progress,
)

NODES = 20
PODS_AT_ONCE = 500


@pytest.fixture
def api(apiserver: LocalApiServer, stack: ExitStack) -> KubeClusterApi:
    api = cluster_api(apiserver, stack, workers=16)
    for i in range(NODES):
        publish_node(api, f"node-{i:02d}", gpus=8)
    return api


def _create_pods(api: KubeClusterApi, count: int) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: create_pod_with_claim(api, f"p{i:04d}"), range(count)))


class _SlowSync:
    """The informers, whose ``wait_for_sync`` returns only once ``synced`` is set."""

    def __init__(self, informers: ClusterInformers, synced: threading.Event) -> None:
        self._informers = informers
        self._synced = synced

    def __getattr__(self, name: str) -> Any:
        return getattr(self._informers, name)

    def wait_for_sync(self, *, timeout: float) -> bool:
        self._synced.wait(timeout=10)
        return self._informers.wait_for_sync(timeout=timeout)


def _gated(api: KubeClusterApi) -> int:
    pods = api.list_objects(PODS, namespace=NS).items
    return sum(SCHEDULING_GATE in gate_names(p) for p in pods)


def test_two_controllers_racing_never_use_a_placement_twice(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    first = start_controller(apiserver, stack, identity="racer-a")
    second = start_controller(apiserver, stack, identity="racer-b")
    # both allocating before the burst: on a loaded machine one's rebuild could otherwise outlast
    # the burst, and the race this is about would not happen
    wait_for(lambda: first.ready() and second.ready(), timeout=60, what="both allocate")
    _create_pods(api, PODS_AT_ONCE)

    wait_for_progress(lambda: _gated(api), what="every pod ungated")
    assert assert_no_overlap(api) == PODS_AT_ONCE
    written = [
        c.metrics.registry.get_sample_value(
            "instaslice_controller_claims_allocated_total", {"kind": "dra"}
        )
        or 0
        for c in (first, second)
    ]
    assert all(n > 0 for n in written), written  # both really allocated


def test_a_leader_killed_mid_burst_is_replaced_and_nothing_is_allocated_twice(
    apiserver: LocalApiServer, api: KubeClusterApi, stack: ExitStack
) -> None:
    quick = SyncConfig(verify_timeout=0.8, adopt_grace=1.0, overlap_grace=1.0)
    first = start_controller(
        apiserver, stack, identity="leader-1", leader_election=True, sync=quick
    )
    wait_for(first.is_leader, what="the first controller leads")
    second = start_controller(
        apiserver, stack, identity="leader-2", leader_election=True, sync=quick
    )
    wait_for(lambda: first.ready() and second.ready(), timeout=60, what="leader and standby up")
    _create_pods(api, PODS_AT_ONCE)
    # progress, not a deadline: two controllers, the API server and every informer share this
    # process (and its GIL), slow on two loaded cores; a controller that stops placing still fails
    wait_for_progress(lambda: _gated(api), target=PODS_AT_ONCE - 101, what="a burst under way")

    standby_writes = second.metrics.registry.get_sample_value(
        "instaslice_controller_claims_allocated_total", {"kind": "dra"}
    )
    assert not standby_writes  # only the leader writes
    assert not second.is_leader()
    first.stop(release_lease=False)  # a crash: the lease stays until it expires
    assert _gated(api) > 0, "the burst ended before the leader was killed; nothing tested"
    wait_for(second.is_leader, timeout=30, what="the standby takes over")
    # the takeover (lease expiry, rebuild) places nothing for a while: within the stall window
    wait_for_progress(lambda: _gated(api), stall=60, what="the new leader finishes")
    assert assert_no_overlap(api) == PODS_AT_ONCE
    taken_over = second.metrics.registry.get_sample_value(
        "instaslice_controller_pods_ungated_total"
    )
    assert (taken_over or 0) > 0


def test_a_pod_looked_at_while_a_lease_renew_is_late_is_placed_once_the_renew_lands(
    apiserver: LocalApiServer, stack: ExitStack
) -> None:
    """``is_leader()`` is False while a renew is overdue and True again once a late one succeeds,
    with no new term (no ``start_leading`` to requeue every gated pod): under CPU starvation this
    blinks mid-burst. A pod looked at in the blink must be looked at again, not dropped until some
    unrelated event."""
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-00", gpus=1)
    controller = start_controller(apiserver, stack, sync=SyncConfig(not_leader_retry=0.2))
    allocator = controller.allocator
    wait_for(lambda: allocator.leading_ready, what="the controller leads")
    renewed = [False]
    allocator._is_leader = lambda: renewed[0]  # the renew is late: not provably the leader
    looked_at: list[str] = []
    sync = allocator.sync.sync

    def recording_sync(pod: PodView) -> Result:
        result = sync(pod)
        looked_at.append(result.outcome.value)
        return result

    allocator.sync.sync = recording_sync  # type: ignore[method-assign]
    create_pod_with_claim(api, "p1")
    wait_for(lambda: looked_at, what="p1 looked at during the blink")
    assert _gated(api) == 1
    renewed[0] = True  # the late renew succeeded: leader again, same term
    wait_for(lambda: _gated(api) == 0, timeout=10, what="p1 placed after the blink")
    assert assert_no_overlap(api) == 1


def test_a_term_that_starts_while_a_lease_renew_is_late_still_allocates(
    apiserver: LocalApiServer, stack: ExitStack
) -> None:
    """The state is rebuilt on a term's own thread after the caches sync; a renew that is late
    right then (``is_leader()`` False for a moment) does not end the term, so the rebuild must not
    give up on it, or the replica would go on renewing the lease without ever allocating."""
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-00", gpus=1)
    controller = start_controller(apiserver, stack, sync=SyncConfig(not_leader_retry=0.2))
    allocator = controller.allocator
    wait_for(lambda: allocator.leading_ready, what="the first term allocates")
    allocator.stop_leading()  # the first term ends ...
    renewed = [False]
    allocator._is_leader = lambda: renewed[0]
    allocator.start_leading()  # ... a second one starts while its first renew is late
    thread = allocator._leading_thread
    assert thread is not None
    thread.join(timeout=30)
    assert not thread.is_alive()
    renewed[0] = True  # the renew lands: same term, never stopped
    create_pod_with_claim(api, "p1")
    wait_for(lambda: _gated(api) == 0, timeout=10, what="p1 placed in the second term")
    assert assert_no_overlap(api) == 1


def test_a_term_that_ends_while_the_state_is_rebuilt_does_not_allocate(
    apiserver: LocalApiServer, stack: ExitStack
) -> None:
    """The other side: ``stop_leading`` before the rebuild finished leaves the replica idle."""
    api = cluster_api(apiserver, stack)
    publish_node(api, "node-00", gpus=1)
    controller = start_controller(apiserver, stack)
    allocator = controller.allocator
    wait_for(lambda: allocator.leading_ready, what="the first term allocates")
    allocator.stop_leading()
    synced = threading.Event()
    allocator._informers = _SlowSync(allocator._informers, synced)  # type: ignore[assignment]
    allocator.start_leading()  # a second term, waiting for the caches ...
    allocator.stop_leading()  # ... ends before they sync
    synced.set()
    thread = allocator._leading_thread
    assert thread is not None
    thread.join(timeout=30)
    assert not allocator.leading_ready
