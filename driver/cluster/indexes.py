"""Index functions for informer caches: the lookups the controller and the kubelet plugin make.

Pure functions from an object to the index values it files under (see ``IndexedCache``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

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


def claim_pod_uids_inputs(claim: JsonObject) -> object:
    """What ``claim_pod_uids`` reads (``IndexedCache.add_index``'s ``inputs``)."""
    return _fingerprint(
        path(claim, "status", "reservedFor"), path(claim, "metadata", "ownerReferences")
    )


def pod_claim_keys(pod: JsonObject) -> Iterable[str]:
    """``namespace/name`` of every ResourceClaim the pod uses: named directly in
    ``spec.resourceClaims`` or generated from a template (``status.resourceClaimStatuses``)."""
    return PodView.of(pod).claim_keys()


def pod_claim_keys_inputs(pod: JsonObject) -> object:
    """What ``pod_claim_keys`` reads (``IndexedCache.add_index``'s ``inputs``)."""
    return _fingerprint(
        path(pod, "metadata", "namespace"),
        path(pod, "spec", "resourceClaims"),
        path(pod, "status", "resourceClaimStatuses"),
    )


def _fingerprint(*values: Any) -> object:
    """``values`` as JSON bytes: equal only when the values are (``1``, ``1.0`` and ``true``
    differ, unlike with ``==``); a value that is not JSON is never equal to anything.

    Copied to a bytes object of its own length: orjson's result keeps the 4 KiB buffer it was
    written into (orjson 3.13), and one fingerprint per index per cached pod and claim is kept —
    80 MB at 10,000 pods with their claims."""
    try:
        return bytes(memoryview(orjson.dumps(values)))
    except TypeError:
        return object()


def spec_node_name(obj: JsonObject) -> Iterable[str]:
    """``spec.nodeName`` of a ResourceSlice or a bound pod."""
    node = text(path(obj, "spec", "nodeName"))
    return (node,) if node else ()
