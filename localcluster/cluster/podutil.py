"""Pure helpers over pod, claim and node JSON shared by the emulated scheduler, kubelet and claim
controller: which claims a pod uses (``resourceclaim.Name``), who a claim is reserved for, pod
resource requests (kube's ``PodRequests``), node selectors, node affinity and taint toleration
(``component-helpers/scheduling/corev1``). No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from controller.allocation.cel_library import Quantity
from driver.cluster.port import JsonObject, metadata, name_of, uid_of

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
TERMINAL_PHASES = ("Succeeded", "Failed")


class ClaimNotCreatedError(Exception):
    """The pod's claim comes from a template and the claim controller has not recorded it yet."""


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One entry of ``pod.spec.resourceClaims`` resolved to a ResourceClaim name."""

    pod_claim: str
    """The name inside the pod (what containers' ``resources.claims[].name`` use)."""
    claim_name: str
    generated: bool
    """From a template: the claim must be owned by the pod (``resourceclaim.IsForPod``)."""


def is_terminal(pod: JsonObject) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def is_deleting(obj: JsonObject) -> bool:
    return "deletionTimestamp" in metadata(obj)


def node_name(pod: JsonObject) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_claim_refs(pod: JsonObject) -> list[PodClaimRef]:
    """Every claim of the pod, as kubelet and scheduler resolve them: a direct
    ``resourceClaimName``, or the name recorded in ``status.resourceClaimStatuses`` for a template
    (``ClaimNotCreatedError`` while missing; an entry without a name means "not needed")."""
    statuses = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    refs: list[PodClaimRef] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        pod_claim = str(entry.get("name") or "")
        if entry.get("resourceClaimName"):
            refs.append(PodClaimRef(pod_claim, str(entry["resourceClaimName"]), generated=False))
        elif entry.get("resourceClaimTemplateName"):
            if pod_claim not in statuses:
                raise ClaimNotCreatedError(
                    f'waiting for the resource claim controller to create the claim for "{pod_claim}"'
                )
            name = statuses[pod_claim]
            if name:
                refs.append(PodClaimRef(pod_claim, str(name), generated=True))
    return refs


def is_owned_by(claim: JsonObject, pod: JsonObject) -> bool:
    """``resourceclaim.IsForPod``: a generated claim has the pod as its controller owner."""
    return any(
        ref.get("uid") == uid_of(pod) and ref.get("controller")
        for ref in metadata(claim).get("ownerReferences") or []
    )


def reserved_for_uids(claim: JsonObject) -> list[str]:
    return [
        str(ref.get("uid"))
        for ref in (claim.get("status") or {}).get("reservedFor") or []
        if ref.get("resource") == "pods" and not ref.get("apiGroup")
    ]


def is_reserved_for(claim: JsonObject, pod: JsonObject) -> bool:
    return uid_of(pod) in reserved_for_uids(claim)


def allocation(claim: JsonObject) -> JsonObject | None:
    value = (claim.get("status") or {}).get("allocation")
    return value if isinstance(value, dict) else None


# --- resources ----------------------------------------------------------------------------------


def quantity(text: object) -> Fraction:
    return Quantity.parse(str(text)).value


def container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """Requests, defaulted from limits where only a limit is given (as the API server does)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: quantity(value) for name, value in merged.items()}


def container_limits(container: Mapping[str, Any]) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    return {name: quantity(value) for name, value in (resources.get("limits") or {}).items()}


def pod_requests(pod: JsonObject) -> dict[str, Fraction]:
    """kube's ``PodRequests``: the sum over app containers, at least the largest init container,
    plus the pod overhead."""
    spec = pod.get("spec") or {}
    total: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        for name, value in container_requests(container).items():
            total[name] = total.get(name, Fraction(0)) + value
    for container in spec.get("initContainers") or []:
        for name, value in container_requests(container).items():
            total[name] = max(total.get(name, Fraction(0)), value)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Fraction(0)) + quantity(value)
    return total


def node_allocatable(node: JsonObject) -> dict[str, Fraction]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {name: quantity(value) for name, value in allocatable.items()}


# --- node selection -----------------------------------------------------------------------------


def _label_requirement(labels: Mapping[str, str], requirement: Mapping[str, Any]) -> bool:
    key = str(requirement.get("key") or "")
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(node: JsonObject, term: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing
    labels = metadata(node).get("labels") or {}
    if not all(_label_requirement(labels, r) for r in expressions):
        return False
    node_fields = {"metadata.name": name_of(node)}
    for requirement in fields:
        if requirement.get("key") != "metadata.name":
            return False
        if not _label_requirement(node_fields, requirement):
            return False
    return True


def node_selector_matches(node: JsonObject, selector: Mapping[str, Any] | None) -> bool:
    """A ``v1.NodeSelector``: terms are ORed, requirements inside a term ANDed; None matches all."""
    if selector is None:
        return True
    terms = selector.get("nodeSelectorTerms") or []
    return any(_term_matches(node, term) for term in terms)


def node_labels_match(node: JsonObject, wanted: Mapping[str, str]) -> bool:
    labels = metadata(node).get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


def required_node_affinity(pod: JsonObject) -> Mapping[str, Any] | None:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    value = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return value if isinstance(value, dict) else None


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint`` for any of ``tolerations``."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if key and key != taint.get("key"):
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Exists":
            return True
        if operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated_taint(pod: JsonObject, node: JsonObject) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint of the node the pod does not tolerate."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not tolerates(tolerations, taint):
            return dict(taint)
    return None
