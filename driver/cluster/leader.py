"""Leader election on a ``coordination.k8s.io/v1`` Lease: one active controller at a time.

Why not ``kubernetes.leaderelection``: its ``LeaseLock`` builds its own ``CoordinationV1Api()`` on
the global default client (not our configured, throttled adapter), its loop uses ``time.time``
with no injectable clock, cannot be stopped, exits after the first loss, and offers no
``is_leader`` check bounded by the renew deadline — which is what keeps a partitioned leader from
acting. So this is client-go's algorithm over our ``ClusterApi`` port:

- a follower takes the lease only when its holder left it (empty holder) or when the record has not
  changed for ``leaseDurationSeconds`` as measured on *our* monotonic clock since we first saw it —
  never by comparing the remote ``renewTime`` with our wall clock;
- every write is a resourceVersion-checked update, so two candidates racing for an expired lease
  cannot both win (one gets 409);
- the leader renews every ``retry_period``; ``is_leader()`` turns False once ``renew_deadline`` has
  passed since the start of the last successful renew. Because ``renew_deadline < lease_duration``,
  a leader cut off from the API server stops acting before any other candidate can take over.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from api import wire
from api.names import LEADER_LEASE_NAME, SYSTEM_NAMESPACE
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.port import LEASES, Body, JsonObject, Resource, format_micro_time
from driver.cluster.views import LeaseView
from driver.errors import ApiNotFoundError, ClusterError

logger = logging.getLogger(__name__)

_JITTER = 0.2


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    identity: str
    namespace: str = SYSTEM_NAMESPACE
    name: str = LEADER_LEASE_NAME
    lease_duration: int = 15
    """Seconds (``leaseDurationSeconds`` is an integer) a follower waits on an unchanged lease."""
    renew_deadline: float = 10.0
    """Seconds the leader keeps acting without a successful renew."""
    retry_period: float = 2.0
    """Seconds between attempts to acquire or renew."""
    release_on_stop: bool = True
    """On ``stop``, hand the lease back so another candidate takes over at once."""

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("a candidate needs an identity")
        if not 0 < self.retry_period * (1 + _JITTER) < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "need retry_period*(1+jitter) < renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline}, {self.lease_duration}"
            )


class LeaseClient(Protocol):
    """The part of ``ClusterApi`` an elector uses."""

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> JsonObject: ...

    def create(
        self, resource: Resource, obj: Body, *, namespace: str | None = None
    ) -> JsonObject: ...

    def update(self, resource: Resource, obj: Body) -> JsonObject: ...


class LeaderElector:
    """One candidate. ``start`` runs it on a thread; callbacks run on that thread and must return
    quickly (start or stop your workers, do not run them there)."""

    def __init__(
        self,
        *,
        api: LeaseClient,
        config: LeaderElectionConfig,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        on_new_leader: Callable[[str], None] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self.config = config
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease: JsonObject | None = None
        self._observed_record: tuple[object, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._holder = ""
        self._release_on_stop = config.release_on_stop

    # -- state ------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True only while we hold the lease *and* the last renew started under
        ``renew_deadline`` ago — check it right before every write only a leader may make."""
        with self._lock:
            return (
                self._renewed_at is not None
                and self._clock.monotonic() - self._renewed_at < self.config.renew_deadline
            )

    @property
    def leader(self) -> str:
        """Identity of the holder last observed (``""`` when none)."""
        with self._lock:
            return self._holder

    # -- one step ---------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """Take or renew the lease once; True if we hold it now. Never raises ``ClusterError``."""
        config = self.config
        attempt_started = self._clock.monotonic()
        try:
            lease = self._api.get(LEASES, name=config.name, namespace=config.namespace)
        except ApiNotFoundError:
            return self._create(attempt_started)
        except ClusterError as exc:
            logger.info("lease %s/%s: cannot read: %s", config.namespace, config.name, exc)
            return False
        view = LeaseView.of(lease)
        holder = view.holder_identity
        self._observe(view, holder)
        if holder and holder != config.identity:
            duration = float(view.lease_duration_seconds or config.lease_duration)
            if self._clock.monotonic() < self._observed_at + duration:
                self._lose_if_leading()
                return False
        now = format_micro_time(self._clock.now())
        renewing = holder == config.identity
        transitions = view.lease_transitions
        taken: wire.LeaseSpec = {
            "holderIdentity": config.identity,
            "leaseDurationSeconds": config.lease_duration,
            "acquireTime": (view.acquire_time or None) if renewing else now,
            "renewTime": now,
            "leaseTransitions": transitions if renewing else transitions + 1,
        }
        updated = copy.deepcopy(lease)
        updated["spec"] = {**view.spec, **taken}
        try:
            written = self._api.update(LEASES, updated)
        except ClusterError as exc:
            logger.info("lease %s/%s: cannot take or renew: %s", config.namespace, config.name, exc)
            return False
        self._succeeded(written, attempt_started)
        return True

    def release(self) -> bool:
        """Give the lease back if we hold it (holder emptied, duration 1 s)."""
        config = self.config
        with self._lock:
            self._renewed_at = None
            lease = self._lease
        if lease is None or LeaseView.of(lease).holder_identity != config.identity:
            return False
        updated = copy.deepcopy(lease)
        now = format_micro_time(self._clock.now())
        given_back: wire.LeaseSpec = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
        }
        updated["spec"] = {**LeaseView.of(lease).spec, **given_back}
        try:
            self._api.update(LEASES, updated)
        except ClusterError as exc:
            logger.info("lease %s/%s: cannot release: %s", config.namespace, config.name, exc)
            return False
        logger.info("lease %s/%s released by %s", config.namespace, config.name, config.identity)
        return True

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("elector already started")
        self._thread = threading.Thread(
            target=self.run, name=f"leader-{self.config.identity}", daemon=True
        )
        self._thread.start()

    def stop(self, *, release: bool | None = None, timeout: float = 10.0) -> None:
        """Stop campaigning; a leader stops leading (and releases the lease unless told not to —
        ``release=False`` behaves like a crash, for tests)."""
        if release is not None:
            self._release_on_stop = release
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """Campaign until ``stop``: acquire, lead while renewing, and campaign again if lost."""
        while not self._stop.is_set():
            if not self._acquire():
                break
            if not self._call(self._on_started, "on_started_leading"):
                # a leader that cannot start its work must not sit on the lease
                with self._lock:
                    self._renewed_at = None
                self.release()
                self._call(self._on_stopped, "on_stopped_leading")
                self._stop.wait(self.config.retry_period)
                continue
            self._renew_until_lost()
            with self._lock:
                self._renewed_at = None
            self._call(self._on_stopped, "on_stopped_leading")
        if self._release_on_stop:
            self.release()

    def _acquire(self) -> bool:
        while not self._stop.is_set():
            if self.try_acquire_or_renew():
                logger.info("%s leads %s", self.config.identity, self.config.name)
                return True
            self._stop.wait(self.config.retry_period * (1 + _JITTER * self._rng.random()))
        return False

    def _renew_until_lost(self) -> None:
        while not self._stop.wait(self.config.retry_period):
            if self.try_acquire_or_renew():
                continue
            with self._lock:
                renewed_at = self._renewed_at
            if renewed_at is None:
                logger.warning(
                    "%s lost %s to %s", self.config.identity, self.config.name, self.leader
                )
                return
            if self._clock.monotonic() - renewed_at >= self.config.renew_deadline:
                logger.warning(
                    "%s could not renew %s within %.1fs; stepping down",
                    self.config.identity,
                    self.config.name,
                    self.config.renew_deadline,
                )
                with self._lock:
                    self._renewed_at = None
                return

    # -- bookkeeping ------------------------------------------------------------------------

    def _create(self, attempt_started: float) -> bool:
        config = self.config
        now = format_micro_time(self._clock.now())
        lease: wire.Lease = {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {"name": config.name, "namespace": config.namespace},
            "spec": {
                "holderIdentity": config.identity,
                "leaseDurationSeconds": config.lease_duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            written = self._api.create(LEASES, lease, namespace=config.namespace)
        except ClusterError as exc:
            logger.info("lease %s/%s: cannot create: %s", config.namespace, config.name, exc)
            return False
        self._succeeded(written, attempt_started)
        return True

    def _observe(self, view: LeaseView, holder: str) -> None:
        lease = view.raw
        record = (
            holder,
            view.renew_time,
            view.acquire_time,
            view.lease_transitions,
            view.lease_duration_seconds,
        )
        new_leader = False
        with self._lock:
            self._lease = lease
            if record != self._observed_record:
                self._observed_record = record
                self._observed_at = self._clock.monotonic()
            if holder != self._holder:
                self._holder = holder
                new_leader = True
        on_new_leader = self._on_new_leader
        if new_leader and on_new_leader is not None and holder:
            self._call(lambda: on_new_leader(holder), "on_new_leader")

    def _succeeded(self, lease: JsonObject, attempt_started: float) -> None:
        self._observe(LeaseView.of(lease), self.config.identity)
        with self._lock:
            self._renewed_at = attempt_started

    def _lose_if_leading(self) -> None:
        with self._lock:
            self._renewed_at = None

    def _call(self, callback: Callable[[], object], what: str) -> bool:
        try:
            callback()
        except Exception:
            logger.exception("%s: %s raised", self.config.identity, what)
            return False
        return True
