"""``pods/binding``: the one way ``spec.nodeName`` gets set on an existing pod (what
kube-scheduler calls), with kube-apiserver's refusals: an already bound pod (409), a pod that still
has scheduling gates or is being deleted (500, kube returns these as plain errors)."""

from __future__ import annotations

from typing import Any

from localcluster import errors
from localcluster.errors import FieldError
from localcluster.resources import BINDINGS, PODS
from localcluster.store import Store, meta, now_rfc3339

JsonObj = dict[str, Any]


def bind_pod(store: Store, namespace: str, name: str, binding: JsonObj) -> str:
    """Bind the pod to the binding's target node; returns the node name."""
    binding_name = meta(binding).get("name")
    if binding_name and binding_name != name:
        raise errors.bad_request("name in URL does not match name in Binding object")
    target = binding.get("target") or {}
    node = str(target.get("name") or "")
    if not node:
        raise errors.invalid(BINDINGS, name, [FieldError("Required", "target.name")])
    kind = target.get("kind") or "Node"
    if kind != "Node":
        raise errors.invalid(
            BINDINGS,
            name,
            [FieldError("NotSupported", "target.kind", 'supported values: "Node"', kind)],
        )
    annotations = meta(binding).get("annotations") or {}

    def assign(pod: JsonObj) -> JsonObj:
        spec = pod.get("spec") or {}
        if "deletionTimestamp" in meta(pod):
            raise errors.internal(f"pod {name} is being deleted, cannot be assigned to a host")
        if spec.get("nodeName"):
            raise errors.ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{spec["nodeName"]}"',
                {"name": name, "kind": "pods/binding"},
            )
        if spec.get("schedulingGates"):
            raise errors.internal(f"pod {name} has non-empty .spec.schedulingGates")
        metadata = dict(meta(pod))
        if annotations:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
        status = dict(pod.get("status") or {})
        # ClearingNominatedNodeNameAfterBinding (beta, on since 1.35): the hint goes at binding
        status.pop("nominatedNodeName", None)
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            }
        )
        status["conditions"] = conditions
        return {**pod, "metadata": metadata, "spec": {**spec, "nodeName": node}, "status": status}

    store.mutate(PODS, namespace, name, assign)
    return node
