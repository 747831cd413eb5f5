"""Index functions for informer caches: the lookups the controller and the kubelet plugin make.

Pure functions from an object to the index values it files under (see ``IndexedCache``).
"""

from __future__ import annotations

from collections.abc import Iterable

from driver.cluster.port import JsonObject, key_for, namespace_of

BY_NODE = "node"
"""Claims by the node their allocation selects; slices and pods by their node name."""
BY_CLAIM = "claim"
"""Pods by the ``namespace/name`` of each claim they use."""
BY_POD_UID = "pod-uid"
"""Claims by the UID of each pod reserving or owning them."""

_HOSTNAME_LABEL = "kubernetes.io/hostname"


def claim_node_names(claim: JsonObject) -> Iterable[str]:
    """Nodes an allocated claim is bound to: ``metadata.name`` fields or hostname labels with
    operator ``In`` in ``status.allocation.nodeSelector`` (what allocators write)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for requirement in term.get("matchFields") or []:
            if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In":
                yield from (str(v) for v in requirement.get("values") or [])
        for requirement in term.get("matchExpressions") or []:
            if requirement.get("key") == _HOSTNAME_LABEL and requirement.get("operator") == "In":
                yield from (str(v) for v in requirement.get("values") or [])


def claim_pod_uids(claim: JsonObject) -> Iterable[str]:
    """Pods a claim is reserved for, and the pod owning it (shadow claims)."""
    for consumer in (claim.get("status") or {}).get("reservedFor") or []:
        if consumer.get("resource") == "pods" and not consumer.get("apiGroup"):
            yield str(consumer.get("uid", ""))
    for owner in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Pod" and owner.get("apiVersion") == "v1":
            yield str(owner.get("uid", ""))


def pod_claim_keys(pod: JsonObject) -> Iterable[str]:
    """``namespace/name`` of every ResourceClaim the pod uses: named directly in
    ``spec.resourceClaims`` or generated from a template (``status.resourceClaimStatuses``)."""
    namespace = namespace_of(pod)
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            yield key_for(name=str(ref["resourceClaimName"]), namespace=namespace)
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("resourceClaimName"):
            yield key_for(name=str(status["resourceClaimName"]), namespace=namespace)


def spec_node_name(obj: JsonObject) -> Iterable[str]:
    """``spec.nodeName`` of a ResourceSlice or a bound pod."""
    node = (obj.get("spec") or {}).get("nodeName")
    if node:
        yield str(node)
