"""Releasing the shadow claims of classic pods that finished or are gone (docs/design.md F3 and F6).

A classic pod does not name its shadow claims, so kube-controller-manager's claim controller is
never woken by the pod. When the pod merely finishes it does not look at all (fact 6). When the pod
is deleted the garbage collector deletes the claim, and the claim controller does look, but if its
pod cache still holds the pod at that moment it keeps the reservation, and the pod's delete event
never brings it back: the claim stays forever, being deleted, allocated and reserved for a pod
that no longer exists, its slices counted as taken.

So the controller releases them itself (``shadow.release``: the pod leaves ``reservedFor``, the
allocation is cleared, a claim being deleted loses the delete-protection finalizer). Occupancy
frees the slices through the claim informer like for any claim, and the node's shim destroys them.

Event driven, no polling; the allocator's work queue carries a key per pod UID (``gone_key``):

* a pod's DELETE event, for its shadow claims (index by pod UID);
* a shadow claim's event when the pod cache does not know its pod (``suspect``);
* the start of leadership, for every such claim (``suspects``).

A pod is gone only when the API says so: a fresh GET by name finds nothing, or a pod with another
UID (a StatefulSet pod recreated under the same name has a new one). A pod that still exists and is
merely terminating keeps its claims — its containers may still use the slices — until it is gone
or terminal.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from api.names import SHADOW_CLAIM_LABEL
from controller.allocation.outcome import NotLeaderError
from controller.classic import shadow
from controller.informers import BY_SHADOW_POD, BY_UID, ClusterInformers
from controller.metrics import ControllerMetrics
from driver.cluster.port import PODS, RESOURCE_CLAIMS, ClusterApi, JsonObject
from driver.cluster.views import ClaimView, PodView
from driver.errors import ApiNotFoundError, ConflictError

logger = logging.getLogger(__name__)

GONE_KEY_PREFIX = "shadow-pod:"
"""Work-queue keys ``shadow-pod:<pod uid>``; pod keys (``namespace/name``) never hold a colon."""
_ATTEMPTS = 3


class PodFate(enum.Enum):
    """What the API says of the pod a shadow claim stands for."""

    ALIVE = "alive"
    """It exists and is not terminal: pending, running or terminating."""
    FINISHED = "finished"
    GONE = "gone"
    """No pod of that name, or one with another UID."""


def gone_key(pod_uid: str) -> str:
    return GONE_KEY_PREFIX + pod_uid


def pod_uid_of_key(key: str) -> str | None:
    """The pod UID of a ``gone_key``; None for a pod key."""
    return key[len(GONE_KEY_PREFIX) :] if key.startswith(GONE_KEY_PREFIX) else None


def shadow_pod_uid(claim: ClaimView) -> str:
    """The UID of the pod a shadow claim stands for; empty for any other claim."""
    return claim.meta.labels.get(SHADOW_CLAIM_LABEL, "")


def shadow_pod_name(claim: ClaimView, pod_uid: str) -> str | None:
    """The name of the pod with ``pod_uid``, from the claim's owner or its reservation."""
    names = [*((o.uid, o.name) for o in claim.meta.owners)]
    names.extend((c.uid, c.name) for c in claim.reserved_for)
    for uid, name in names:
        if uid == pod_uid and name:
            return name
    return None


def pod_fate(api: ClusterApi, *, namespace: str, name: str, uid: str) -> PodFate:
    """Ask the API server (not a cache) what became of pod ``namespace/name`` with ``uid``."""
    try:
        pod = api.get(PODS, name=name, namespace=namespace)
    except ApiNotFoundError:
        return PodFate.GONE
    view = PodView.of(pod)
    if view.uid != uid:
        return PodFate.GONE
    return PodFate.FINISHED if view.terminal else PodFate.ALIVE


class ShadowReleaser:
    """Releases shadow claims once their pod is finished or gone; every write checks the lease."""

    def __init__(
        self,
        *,
        api: ClusterApi,
        informers: ClusterInformers,
        metrics: ControllerMetrics,
        is_leader: Callable[[], bool],
    ) -> None:
        self._api = api
        self._informers = informers
        self._metrics = metrics
        self._is_leader = is_leader

    def _claims_of(self, pod_uid: str) -> list[ClaimView]:
        """The pod's shadow claims that releasing would still change."""
        claims = (ClaimView.of(c) for c in self._informers.claims.by_index(BY_SHADOW_POD, pod_uid))
        return [c for c in claims if shadow.holds_something(c)]

    # -- what to look at -----------------------------------------------------------------------

    def has_claims(self, pod_uid: str) -> bool:
        """Whether the pod has shadow claims to release (a deleted pod's are worth a look)."""
        return bool(self._claims_of(pod_uid))

    def suspect(self, claim: JsonObject) -> str | None:
        """The pod UID to check for a shadow claim that still holds something and whose pod the
        pod cache does not know (deleted before we saw the claim, or while we were not leading)."""
        view = ClaimView.of(claim)
        uid = shadow_pod_uid(view)
        if not uid or not shadow.holds_something(view):
            return None
        if self._informers.pods.by_index(BY_UID, uid):
            return None  # known: its delete or its end reaches us as a pod event
        return uid

    def suspects(self) -> set[str]:
        """``suspect`` for every claim in the cache: what a new leader checks once."""
        found = (self.suspect(claim) for claim in self._informers.claims.list())
        return {uid for uid in found if uid}

    # -- releasing -----------------------------------------------------------------------------

    def release_finished(self, pod: PodView) -> None:
        """Release the shadow claims of ``pod``, known (from the cache) to have finished
        (``ClusterError``, ``NotLeaderError``: try again later)."""
        for claim in self._claims_of(pod.uid):
            self._release(claim, pod_uid=pod.uid)

    def release_if_gone(self, pod_uid: str) -> None:
        """Release the shadow claims of pod ``pod_uid`` if the API shows it gone or finished.

        ``ClusterError`` when the API could not be asked or written, ``NotLeaderError`` when this
        replica cannot prove it leads (a late lease renew): try again later.
        """
        fates: dict[tuple[str, str], PodFate] = {}
        for claim in self._claims_of(pod_uid):
            if not (claim.allocated or claim.reserved_for):
                self._release(
                    claim, pod_uid=pod_uid
                )  # only its deletion is held up: no pod uses it
                continue
            namespace = claim.namespace or "default"
            name = shadow_pod_name(claim, pod_uid)
            if name is None:
                logger.warning(
                    "shadow claim %s/%s names no pod with UID %s; leaving it",
                    namespace,
                    claim.name,
                    pod_uid,
                )
                continue
            if (namespace, name) not in fates:
                fates[namespace, name] = pod_fate(
                    self._api, namespace=namespace, name=name, uid=pod_uid
                )
            fate = fates[namespace, name]
            if fate is PodFate.ALIVE:
                logger.debug(
                    "shadow claim %s/%s: pod %s/%s still exists; keeping it",
                    namespace,
                    claim.name,
                    namespace,
                    name,
                )
                continue
            self._release(claim, pod_uid=pod_uid)

    def _release(self, claim: ClaimView, *, pod_uid: str) -> None:
        for attempt in range(_ATTEMPTS):
            if not self._is_leader():
                raise NotLeaderError("not the leader")
            try:
                if shadow.release(self._api, claim, pod_uid=pod_uid):
                    self._metrics.shadow_released()
                return
            except ApiNotFoundError:
                return  # the claim is gone: nothing left to release
            except ConflictError:
                if attempt == _ATTEMPTS - 1:
                    raise
            try:
                claim = ClaimView.of(
                    self._api.get(RESOURCE_CLAIMS, name=claim.name, namespace=claim.meta.namespace)
                )
            except ApiNotFoundError:
                return
            if shadow_pod_uid(claim) != pod_uid or not shadow.holds_something(claim):
                return
