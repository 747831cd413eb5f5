"""Index functions for informer caches: the lookups the controller and the kubelet plugin make.

Pure functions from an object to the index values it files under (see ``IndexedCache``).
"""

from __future__ import annotations

from collections.abc import Iterable

from driver.cluster.port import JsonObject
from driver.cluster.views import ClaimView, PodView, path, text

BY_NODE = "node"
"""Claims by the node their allocation selects; slices and pods by their node name."""
BY_CLAIM = "claim"
"""Pods by the ``namespace/name`` of each claim they use."""
BY_POD_UID = "pod-uid"
"""Claims by the UID of each pod reserving or owning them."""


def claim_node_names(claim: JsonObject) -> Iterable[str]:
    """Nodes an allocated claim is bound to: ``metadata.name`` fields or hostname labels with
    operator ``In`` in ``status.allocation.nodeSelector`` (what allocators write)."""
    return ClaimView.of(claim).node_names()


def claim_pod_uids(claim: JsonObject) -> Iterable[str]:
    """Pods a claim is reserved for, and the pod owning it (shadow claims)."""
    view = ClaimView.of(claim)
    return (*view.reserved_pod_uids(), *view.meta.owner_pod_uids())


def pod_claim_keys(pod: JsonObject) -> Iterable[str]:
    """``namespace/name`` of every ResourceClaim the pod uses: named directly in
    ``spec.resourceClaims`` or generated from a template (``status.resourceClaimStatuses``)."""
    return PodView.of(pod).claim_keys()


def spec_node_name(obj: JsonObject) -> Iterable[str]:
    """``spec.nodeName`` of a ResourceSlice or a bound pod."""
    node = text(path(obj, "spec", "nodeName"))
    return (node,) if node else ()
