"""Who would be stranded by removing InstaSlice: a pure reading of the cluster's pods and claims.

A pod holds a MIG slice while one of its ResourceClaims is allocated by our driver: a claim from its
template or named by it, or the shadow claim of a classic pod (owned by the pod, reserved for it).
Such a pod needs the kubelet plugin to end cleanly — the kubelet calls ``NodeUnprepareResources``
before it lets the pod go — so removing the plugin first leaves it ``Terminating`` and its slice on
the GPU. Pods still carrying our scheduling gate hold nothing, but no one would lift the gate once
the controller is gone. Terminal pods (Succeeded, Failed) hold nothing: their claims are released.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from api.names import DRIVER_NAME, SCHEDULING_GATE
from driver.cluster.port import JsonObject
from driver.cluster.views import ClaimView, PodView


@dataclass(frozen=True, slots=True)
class Holder:
    """One pod holding slices of our driver."""

    namespace: str
    name: str
    uid: str
    node: str
    """Where it runs; empty while it is not bound yet."""
    owner: str
    """``<Kind>/<name>`` of its controller (it comes back when deleted), or empty."""
    claims: tuple[str, ...]
    """Names of its claims allocated by our driver."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Survey:
    holders: tuple[Holder, ...]
    """Pods holding slices, by namespace and name."""
    gated: tuple[str, ...]
    """``namespace/name`` of pods still carrying our gate and holding no slice."""
    unreserved_claims: tuple[str, ...]
    """``namespace/name`` of claims allocated by our driver that no live pod uses."""

    @property
    def clear(self) -> bool:
        """Nothing holds a slice: the plugin can go."""
        return not self.holders and not self.unreserved_claims


def survey(pods: Iterable[JsonObject], claims: Iterable[JsonObject]) -> Survey:
    live = [PodView.of(p) for p in pods]
    live = [p for p in live if not p.terminal]
    ours = [c for c in (ClaimView.of(c) for c in claims) if c.results_of(DRIVER_NAME)]
    by_key = {c.key: c for c in ours}
    users: dict[str, set[str]] = {}
    """pod uid -> names of our claims it uses"""
    for claim in ours:
        for uid in (*claim.reserved_pod_uids(), *claim.meta.owner_pod_uids()):
            users.setdefault(uid, set()).add(claim.name)
    for pod in live:
        for key in pod.claim_keys():
            if key in by_key:
                users.setdefault(pod.uid, set()).add(by_key[key].name)
    holders = []
    gated = []
    for pod in live:
        if pod.uid in users:
            holders.append(_holder(pod, sorted(users[pod.uid])))
        elif pod.gated_by(SCHEDULING_GATE):
            gated.append(pod.key)
    used = {(p.namespace, name) for p in holders for name in p.claims}
    unreserved = [c.key for c in ours if (c.namespace, c.name) not in used]
    return Survey(
        holders=tuple(sorted(holders, key=lambda h: (h.namespace, h.name))),
        gated=tuple(sorted(gated)),
        unreserved_claims=tuple(sorted(unreserved)),
    )


def _holder(pod: PodView, claims: list[str]) -> Holder:
    controller = next((o for o in pod.meta.owners if o.controller), None)
    return Holder(
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        node=pod.node_name,
        owner=f"{controller.kind}/{controller.name}" if controller else "",
        claims=tuple(claims),
    )


def describe_holders(found: Survey) -> list[str]:
    """One line per pod holding slices (and per claim allocated for no pod), aligned."""
    rows = [
        (
            h.key,
            f"node {h.node or '(not bound yet)'}",
            f"claims {', '.join(h.claims)}",
            f"owned by {h.owner}" if h.owner else "no owner: deleting it deletes it for good",
        )
        for h in found.holders
    ]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    lines = [
        "  " + "  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]])
        for r in rows
    ]
    lines += [f"  claim {key}: allocated, used by no pod" for key in found.unreserved_claims]
    return [line.rstrip() for line in lines]
