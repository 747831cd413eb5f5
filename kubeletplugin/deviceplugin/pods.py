"""The pods the reconciler asks about: who a kubelet-named container is, and what it asks for.

The pod-resources API names pods by namespace and name only; the pod's UID (which shadow claims
record) and its node come from the API server. A pod's spec also says how many slices of each
classic resource each container asks for — the *need* that decides whether a container that lost a
reservation must get another one (``moves``). Each pod is read at most once per pass.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from driver.cluster.port import PODS, ClusterApi, uid_of
from driver.errors import ApiNotFoundError


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    node_name: str
    needs: Mapping[tuple[str, str], int]
    """(container, resource) → count in the pod spec's limits (requests if no limits)."""


def pod_needs(pod: Mapping[str, object]) -> dict[tuple[str, str], int]:
    spec = pod.get("spec")
    needs: dict[tuple[str, str], int] = {}
    if not isinstance(spec, Mapping):
        return needs
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            resources = container.get("resources") or {}
            asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            for resource, value in asked.items():
                text = str(value)
                if text.isdigit():
                    needs[(str(container.get("name", "")), str(resource))] = int(text)
    return needs


class PodCache:
    """Pods read once per pass; ``None`` for a pod the API server does not have."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api
        self._pods: dict[tuple[str, str], PodView | None] = {}

    def get(self, namespace: str, name: str) -> PodView | None:
        """Raises ``ClusterError`` (other than not-found) when the pod cannot be read."""
        key = (namespace, name)
        if key not in self._pods:
            try:
                obj = self._api.get(PODS, name=name, namespace=namespace)
            except ApiNotFoundError:
                self._pods[key] = None
            else:
                spec = obj.get("spec") or {}
                self._pods[key] = PodView(
                    uid=uid_of(obj),
                    node_name=str(spec.get("nodeName") or ""),
                    needs=MappingProxyType(pod_needs(obj)),
                )
        return self._pods[key]
