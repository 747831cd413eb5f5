"""When a shim-prepared claim's slices may be destroyed: its claim no longer holds them, and no
container does.

The controller frees a placement as soon as the API server shows the shadow claim released (pod
deleted and garbage-collected, or a finished pod's claim deallocated), while the shim destroys the
old slice only on its next reconcile pass. The next pod placed there must not fail its ``Allocate``
(or a DRA pod its prepare) because of that slice: ``ShimSliceJudge`` tells ``DeviceState`` which
prepared shim claim in the way is stale, and it is released first (``kubeletplugin.state.overlaps``).

Both conditions are checked afresh, never from a cache:

- the claim (GET): gone, replaced (another UID), being deleted and no longer reserved for a pod,
  deallocated, allocated to another node or to other devices — ``claim_gone``, also the
  reconcile's test (where being deleted is enough, since it checks the holders the same way);
- the kubelet's pod-resources ``List``: no container holds the claim's device ids. A crossed slice
  (another pod's container got it) stays while that container runs, whatever the claim says.

If either cannot be read, the judge raises: the prepare fails with a retryable error, nothing is
destroyed on an unknown answer.
"""

import logging

from api.checkpoint import PreparedClaim
from api.names import DRIVER_NAME
from driver.cluster.port import RESOURCE_CLAIMS, ClusterApi
from driver.cluster.views import ClaimView
from driver.errors import ApiNotFoundError
from driver.ids import ClaimUid
from kubeletplugin.deviceplugin.podresources import PodResourcesSource
from kubeletplugin.model import ClaimRef
from kubeletplugin.state.claims import ClaimRejectedError, check_claim
from kubeletplugin.state.overlaps import Verdict

logger = logging.getLogger(__name__)


def claim_gone(
    api: ClusterApi, entry: PreparedClaim, *, node_name: str, deleting_is_gone: bool
) -> str | None:
    """Why the prepared claim no longer holds its slices here, read fresh from the API server; None
    if it still does. A claim being deleted counts as gone when ``deleting_is_gone``, else only
    once no pod is in its ``reservedFor``. Raises ``ClusterError`` when it cannot be read."""
    try:
        obj = api.get(RESOURCE_CLAIMS, name=entry.name, namespace=entry.namespace)
    except ApiNotFoundError:
        return "the claim was deleted"
    ref = ClaimRef(uid=ClaimUid(entry.uid), namespace=entry.namespace, name=entry.name)
    claim = ClaimView.of(obj)
    try:
        allocation = check_claim(claim, ref=ref, node_name=node_name)
    except ClaimRejectedError as exc:
        return str(exc)
    if claim.meta.deleting:
        reserved = [c for c in claim.reserved_for if c.resource == "pods"]
        if deleting_is_gone or not reserved:
            return "the claim is being deleted" + ("" if reserved else " and no longer reserved")
    now = sorted(r.device for r in allocation.results_of(DRIVER_NAME) if r.pool == node_name)
    if now != sorted(d.device for d in entry.devices):
        return f"the claim is now allocated {', '.join(now) or 'no device of ours'} here"
    return None


class ShimSliceJudge:
    """The ``StaleSliceJudge`` for claims the shim prepared (entries with a ``ShimBinding``)."""

    def __init__(
        self, *, node_name: str, api: ClusterApi, pod_resources: PodResourcesSource
    ) -> None:
        self._node = node_name
        self._api = api
        self._pod_resources = pod_resources

    def judge(self, entry: PreparedClaim) -> Verdict | None:
        binding = entry.shim
        if binding is None:
            return None
        gone = claim_gone(self._api, entry, node_name=self._node, deleting_is_gone=False)
        if gone is None:
            return Verdict(release=False, reason="its claim still holds it")
        # Raises PodResourcesError (retryable) when the kubelet cannot be asked.
        holdings = self._pod_resources.list_holdings([binding.resource_name])
        holders = holdings.holders_of(binding.resource_name, binding.device_plugin_ids)
        if holders:
            return Verdict(
                release=False,
                reason=f"{gone}, but container {', '.join(sorted(map(str, holders)))} still "
                "holds its slices",
            )
        return Verdict(release=True, reason=f"{gone}, and no container holds its slices")
