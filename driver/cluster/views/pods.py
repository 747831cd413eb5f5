"""Pod: its containers' resources, its claims, scheduling and status."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from driver.cluster.views.base import LazyView
from driver.cluster.views.common import Condition, Toleration, find_condition
from driver.cluster.views.memo import lazy
from driver.cluster.views.readers import (
    integer,
    items,
    mapping,
    optional_text,
    path,
    string_map,
    text,
)
from driver.cluster.views.selectors import NodeSelector

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    init: bool
    """An init container (``spec.initContainers``)."""
    restart_policy: str
    """``Always`` on an init container makes it a sidecar."""
    requests: Mapping[str, str]
    limits: Mapping[str, str]
    claims: tuple[str, ...]
    """Names of the pod claims the container uses (``resources.claims[].name``)."""
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any], *, init: bool) -> ContainerView:
        resources = mapping(raw.get("resources"))
        return cls(
            name=text(raw.get("name")),
            init=init,
            restart_policy=text(raw.get("restartPolicy")),
            requests=string_map(resources.get("requests")),
            limits=string_map(resources.get("limits")),
            claims=tuple(text(c.get("name")) for c in items(resources.get("claims"))),
            raw=raw,
        )

    @property
    def sidecar(self) -> bool:
        return self.init and self.restart_policy == "Always"

    def amounts(self) -> Mapping[str, str]:
        """Requests overlaid by limits (a limit wins: for extended resources they must match)."""
        if not self.requests:
            return self.limits
        if not self.limits:
            return self.requests
        return {**self.requests, **self.limits}

    def resource_names(self) -> frozenset[str]:
        return frozenset((*self.requests, *self.limits))


@dataclass(frozen=True, slots=True)
class PodClaimRef:
    """One ``spec.resourceClaims`` entry."""

    name: str
    claim_name: str | None
    template_name: str | None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> PodClaimRef:
        return cls(
            name=text(raw.get("name")),
            claim_name=optional_text(raw.get("resourceClaimName")),
            template_name=optional_text(raw.get("resourceClaimTemplateName")),
        )


class PodView(LazyView):
    """A Pod; each part is parsed on first read."""

    KIND: ClassVar[str] = "Pod"

    @lazy
    def _spec(self) -> Mapping[str, Any]:
        return mapping(self.raw.get("spec"))

    @lazy
    def _status(self) -> Mapping[str, Any]:
        return mapping(self.raw.get("status"))

    @lazy
    def node_name(self) -> str:
        return text(self._spec.get("nodeName"))

    @lazy
    def scheduling_gates(self) -> tuple[str, ...]:
        return tuple(text(g.get("name")) for g in items(self._spec.get("schedulingGates")))

    @lazy
    def init_containers(self) -> tuple[ContainerView, ...]:
        return tuple(
            ContainerView.parse(c, init=True) for c in items(self._spec.get("initContainers"))
        )

    @lazy
    def containers(self) -> tuple[ContainerView, ...]:
        return tuple(
            ContainerView.parse(c, init=False) for c in items(self._spec.get("containers"))
        )

    @lazy
    def overhead(self) -> Mapping[str, str]:
        return string_map(self._spec.get("overhead"))

    @lazy
    def claim_refs(self) -> tuple[PodClaimRef, ...]:
        return tuple(PodClaimRef.parse(r) for r in items(self._spec.get("resourceClaims")))

    @lazy
    def node_selector(self) -> Mapping[str, str]:
        return string_map(self._spec.get("nodeSelector"))

    @lazy
    def required_affinity(self) -> NodeSelector | None:
        """``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``."""
        return NodeSelector.parse(
            path(
                self._spec,
                "affinity",
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            )
        )

    @lazy
    def tolerations(self) -> tuple[Toleration, ...]:
        return tuple(Toleration.parse(t) for t in items(self._spec.get("tolerations")))

    @lazy
    def scheduler_name(self) -> str:
        return text(self._spec.get("schedulerName"))

    @lazy
    def priority(self) -> int:
        """``spec.priority``: what the Priority admission plugin resolved from the pod's
        PriorityClass when the pod was created (0 when unset), clamped to int32 as the API
        validates it. Kept on the pod, so deleting the PriorityClass later changes nothing."""
        value = integer(self._spec.get("priority"))
        return max(INT32_MIN, min(INT32_MAX, value))

    @lazy
    def priority_class_name(self) -> str:
        return text(self._spec.get("priorityClassName"))

    @lazy
    def preemption_policy(self) -> str:
        """``spec.preemptionPolicy``: ``Never`` or (the default) ``PreemptLowerPriority``."""
        return text(self._spec.get("preemptionPolicy")) or "PreemptLowerPriority"

    @lazy
    def termination_grace_seconds(self) -> int:
        """``spec.terminationGracePeriodSeconds`` (the API's default 30 when unset)."""
        value = self._spec.get("terminationGracePeriodSeconds")
        return integer(value, 30) if value is not None else 30

    @lazy
    def start_time(self) -> str:
        """``status.startTime`` (RFC 3339; empty until the kubelet started the pod)."""
        return text(self._status.get("startTime"))

    @lazy
    def phase(self) -> str:
        return text(self._status.get("phase"))

    @lazy
    def conditions(self) -> tuple[Condition, ...]:
        return tuple(Condition.parse(c) for c in items(self._status.get("conditions")))

    @lazy
    def claim_statuses(self) -> Mapping[str, str | None]:
        """``status.resourceClaimStatuses``: pod claim name → generated claim name (None: not
        needed)."""
        return {
            text(s.get("name")): optional_text(s.get("resourceClaimName"))
            for s in items(self._status.get("resourceClaimStatuses"))
        }

    @lazy
    def reason(self) -> str:
        """``status.reason`` (e.g. the kubelet's ``UnexpectedAdmissionError``)."""
        return text(self._status.get("reason"))

    @lazy
    def message(self) -> str:
        """``status.message``."""
        return text(self._status.get("message"))

    @property
    def all_containers(self) -> tuple[ContainerView, ...]:
        """Init containers, then app containers: the one walk over a pod's resources."""
        return (*self.init_containers, *self.containers)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def bound(self) -> bool:
        return bool(self.node_name)

    def gated_by(self, gate: str) -> bool:
        return gate in self.scheduling_gates

    def condition(self, kind: str) -> Condition | None:
        return find_condition(self.conditions, kind)

    def requests_resource(self, predicate: Callable[[str], bool]) -> bool:
        """Whether some container requests or limits a resource whose name ``predicate`` takes."""
        return any(predicate(name) for c in self.all_containers for name in c.resource_names())

    def claim_name_of(self, ref: PodClaimRef) -> str | None:
        """The ResourceClaim a pod claim resolves to: its ``resourceClaimName``, or for a
        template the generated claim recorded in ``status.resourceClaimStatuses`` (``None``:
        not generated yet, or not needed)."""
        if ref.claim_name:
            return ref.claim_name
        if ref.template_name:
            return self.claim_statuses.get(ref.name)
        return None

    def claim_keys(self) -> tuple[str, ...]:
        """``namespace/name`` of every ResourceClaim the pod uses (named or generated)."""
        names = [r.claim_name for r in self.claim_refs if r.claim_name]
        names.extend(n for n in self.claim_statuses.values() if n)
        prefix = f"{self.meta.namespace}/" if self.meta.namespace else ""
        return tuple(dict.fromkeys(prefix + n for n in names))
