"""Leader election on a Lease of the local API server, over HTTP.

Step tests drive ``try_acquire_or_renew`` with a fake clock (fast, exact); the threaded tests run
real candidates with a 2 s lease to show the properties end to end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from driver.cluster.kube import KubeClusterApi
from driver.cluster.leader import LeaderElectionConfig, LeaderElector, LeaseClient
from driver.cluster.port import LEASES, Body, JsonObject, Resource
from driver.errors import ClusterError
from tests.cluster.fakes import FakeClock

LEASE_DURATION = 2
RENEW_DEADLINE = 1.0
RETRY_PERIOD = 0.2


def config(identity: str, *, name: str = "test-lease") -> LeaderElectionConfig:
    return LeaderElectionConfig(
        identity=identity,
        name=name,
        lease_duration=LEASE_DURATION,
        renew_deadline=RENEW_DEADLINE,
        retry_period=RETRY_PERIOD,
    )


class Timeline:
    """Callback log shared by candidates, in the order things happened."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[float, str, str]] = []

    def elector(self, api: LeaseClient, identity: str) -> LeaderElector:
        return LeaderElector(
            api=api,
            config=config(identity),
            on_started_leading=lambda: self._log(identity, "started"),
            on_stopped_leading=lambda: self._log(identity, "stopped"),
        )

    def _log(self, identity: str, what: str) -> None:
        with self.lock:
            self.entries.append((time.monotonic(), identity, what))

    def events(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(who, what) for _, who, what in self.entries]


def noop() -> None:
    return None


def stepper(api: LeaseClient, identity: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(
        api=api,
        config=config(identity),
        on_started_leading=noop,
        on_stopped_leading=noop,
        clock=clock,
    )


def test_follower_takes_an_unrenewed_lease_only_after_a_full_duration(api: KubeClusterApi) -> None:
    clock = FakeClock()
    a, b = stepper(api, "a", clock), stepper(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert a.is_leader()
    assert not b.try_acquire_or_renew()
    assert b.leader == "a"

    clock.advance(RENEW_DEADLINE)  # a did not renew: it must stop acting now...
    assert not a.is_leader()
    clock.advance(LEASE_DURATION - RENEW_DEADLINE - 0.01)
    assert not b.try_acquire_or_renew()  # ...well before b may take over
    clock.advance(0.02)
    assert b.try_acquire_or_renew()
    assert b.is_leader()

    lease = api.get(LEASES, name="test-lease", namespace=config("x").namespace)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["leaseDurationSeconds"] == LEASE_DURATION
    assert lease["spec"]["renewTime"].endswith("Z")
    assert not a.try_acquire_or_renew()  # a sees b's fresh record
    assert not a.is_leader()


def test_renewing_keeps_the_lease_and_restarts_the_followers_wait(api: KubeClusterApi) -> None:
    clock = FakeClock()
    a, b = stepper(api, "a", clock), stepper(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    for _ in range(10):
        clock.advance(RETRY_PERIOD * 3)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        assert a.is_leader()
    lease = api.get(LEASES, name="test-lease", namespace=config("x").namespace)
    assert lease["spec"]["leaseTransitions"] == 0


class RacingApi:
    """Runs ``between`` after this candidate's read and before its write."""

    def __init__(self, inner: KubeClusterApi, between: Callable[[], object]) -> None:
        self._inner = inner
        self._between = between

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> JsonObject:
        found = self._inner.get(resource, name=name, namespace=namespace)
        self._between()
        return found

    def create(self, resource: Resource, obj: Body, *, namespace: str | None = None) -> JsonObject:
        return self._inner.create(resource, obj, namespace=namespace)

    def update(self, resource: Resource, obj: Body) -> JsonObject:
        return self._inner.update(resource, obj)


def test_two_candidates_racing_for_an_expired_lease_cannot_both_win(api: KubeClusterApi) -> None:
    clock = FakeClock()
    old = stepper(api, "old", clock)
    assert old.try_acquire_or_renew()
    b = stepper(api, "b", clock)
    assert not b.try_acquire_or_renew()
    c = stepper(RacingApi(api, between=b.try_acquire_or_renew), "c", clock)
    assert not c.try_acquire_or_renew()
    clock.advance(LEASE_DURATION + 0.1)
    results = {"c": c.try_acquire_or_renew()}  # b takes the lease between c's read and write
    results["b"] = b.is_leader()
    assert results == {"c": False, "b": True}
    assert not c.is_leader()


@pytest.fixture
def electors() -> Iterator[list[LeaderElector]]:
    started: list[LeaderElector] = []
    yield started
    for elector in started:
        elector.stop(release=False)


def _sample(electors: list[LeaderElector], seconds: float) -> list[tuple[bool, ...]]:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(tuple(e.is_leader() for e in electors))
        time.sleep(0.01)
    return samples


def _wait_for_leader(electors: list[LeaderElector], timeout: float = 10.0) -> LeaderElector:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [e for e in electors if e.is_leader()]
        if leaders:
            return leaders[0]
        time.sleep(0.005)
    raise AssertionError("nobody took the lease")


def test_two_candidates_exactly_one_leads_and_a_killed_leader_hands_over(
    api: KubeClusterApi, electors: list[LeaderElector]
) -> None:
    timeline = Timeline()
    pair = [timeline.elector(api, "one"), timeline.elector(api, "two")]
    for elector in pair:
        elector.start()
        electors.append(elector)
    leader = _wait_for_leader(pair)
    samples = _sample(pair, 1.5)
    assert all(sum(sample) == 1 for sample in samples)
    (follower,) = [e for e in pair if e is not leader]

    killed_at = time.monotonic()
    leader.stop(release=False)  # like a crash: the lease is left to expire
    _wait_for_leader([follower], timeout=LEASE_DURATION + 5)
    handover = time.monotonic() - killed_at
    # the follower waits a full lease duration from when it last saw the record change, and polls
    # every retry period: the bound is the lease duration plus two retry periods (with jitter)
    assert handover < LEASE_DURATION + 4 * RETRY_PERIOD + 0.5, handover
    events = timeline.events()
    assert events[0] == (leader.config.identity, "started")
    assert events[-1] == (follower.config.identity, "started")


def test_a_released_lease_is_taken_at_once(
    api: KubeClusterApi, electors: list[LeaderElector]
) -> None:
    timeline = Timeline()
    pair = [timeline.elector(api, "one"), timeline.elector(api, "two")]
    for elector in pair:
        elector.start()
        electors.append(elector)
    leader = _wait_for_leader(pair)
    (follower,) = [e for e in pair if e is not leader]
    stopped_at = time.monotonic()
    leader.stop()  # releases the lease
    _wait_for_leader([follower], timeout=LEASE_DURATION + 5)
    assert time.monotonic() - stopped_at < LEASE_DURATION  # no need to wait for expiry
    assert (
        api.get(LEASES, name="test-lease", namespace=follower.config.namespace)["spec"][
            "holderIdentity"
        ]
        == follower.config.identity
    )


class PartitionableApi:
    """The candidate's view of the API server; ``cut()`` makes every call fail like a partition."""

    def __init__(self, inner: KubeClusterApi) -> None:
        self._inner = inner
        self._cut = threading.Event()

    def cut(self) -> None:
        self._cut.set()

    def _check(self) -> None:
        if self._cut.is_set():
            raise ClusterError("connect: network is unreachable")

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> JsonObject:
        self._check()
        return self._inner.get(resource, name=name, namespace=namespace)

    def create(self, resource: Resource, obj: Body, *, namespace: str | None = None) -> JsonObject:
        self._check()
        return self._inner.create(resource, obj, namespace=namespace)

    def update(self, resource: Resource, obj: Body) -> JsonObject:
        self._check()
        return self._inner.update(resource, obj)


def test_a_partitioned_leader_stops_acting_before_another_starts(
    api: KubeClusterApi, electors: list[LeaderElector]
) -> None:
    timeline = Timeline()
    link = PartitionableApi(api)
    first = timeline.elector(link, "first")
    first.start()
    electors.append(first)
    _wait_for_leader([first])
    second = timeline.elector(api, "second")
    second.start()
    electors.append(second)
    time.sleep(2 * RETRY_PERIOD)  # the follower has seen the lease held

    link.cut()
    first_stopped: float | None = None
    second_started: float | None = None
    overlap = False
    deadline = time.monotonic() + LEASE_DURATION + 5
    while time.monotonic() < deadline and second_started is None:
        a, b = first.is_leader(), second.is_leader()
        now = time.monotonic()
        overlap = overlap or (a and b)
        if not a and first_stopped is None:
            first_stopped = now
        if b:
            second_started = now
        time.sleep(0.002)
    assert first_stopped is not None
    assert second_started is not None
    assert not overlap
    assert first_stopped < second_started
    # the callbacks agree: the partitioned leader was told to stop before the other started
    assert timeline.events() == [
        ("first", "started"),
        ("first", "stopped"),
        ("second", "started"),
    ]


def test_config_rejects_unsafe_timings() -> None:
    with pytest.raises(ValueError, match="renew_deadline < lease_duration"):
        LeaderElectionConfig(identity="x", lease_duration=2, renew_deadline=2.0, retry_period=0.2)
    with pytest.raises(ValueError, match="identity"):
        LeaderElectionConfig(identity="")


def test_a_leader_whose_start_fails_gives_the_lease_back(
    api: KubeClusterApi, electors: list[LeaderElector]
) -> None:
    calls: list[str] = []

    def failing_start() -> None:
        calls.append("started")
        raise RuntimeError("cannot start workers")

    broken = LeaderElector(
        api=api,
        config=config("broken"),
        on_started_leading=failing_start,
        on_stopped_leading=lambda: calls.append("stopped"),
    )
    broken.start()
    electors.append(broken)
    deadline = time.monotonic() + 5
    while "stopped" not in calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls[:2] == ["started", "stopped"]
    timeline = Timeline()
    healthy = timeline.elector(api, "healthy")
    healthy.start()
    electors.append(healthy)
    # the broken candidate never keeps the lease, so the healthy one gets it without waiting
    # for an expiry
    _wait_for_leader([healthy], timeout=LEASE_DURATION)
    assert not broken.is_leader()
