"""The pods the reconciler asks about: who a kubelet-named container is, and what it asks for.

The pod-resources API names pods by namespace and name only; the pod's UID (which shadow claims
record) and its node come from the API server. A pod's spec also says how many slices of each
classic resource each container asks for — the *need* that decides whether a container that lost a
reservation must get another one (``moves``). Each pod is read at most once per pass.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from driver.cluster.port import PODS, ClusterApi
from driver.cluster.views import PodView
from driver.errors import ApiNotFoundError


@dataclass(frozen=True, slots=True)
class PodNeeds:
    """What the reconciler needs of one pod: its UID, its node, and its classic resource counts."""

    uid: str
    node_name: str
    needs: Mapping[tuple[str, str], int]
    """(container, resource) → count in the pod spec's limits (requests if no limits)."""


def pod_needs(pod: PodView) -> dict[tuple[str, str], int]:
    needs: dict[tuple[str, str], int] = {}
    for container in pod.all_containers:
        for resource, value in container.amounts().items():
            if value.isdigit():
                needs[(container.name, resource)] = int(value)
    return needs


class PodCache:
    """Pods read once per pass; ``None`` for a pod the API server does not have."""

    def __init__(self, api: ClusterApi) -> None:
        self._api = api
        self._pods: dict[tuple[str, str], PodNeeds | None] = {}

    def get(self, namespace: str, name: str) -> PodNeeds | None:
        """Raises ``ClusterError`` (other than not-found) when the pod cannot be read."""
        key = (namespace, name)
        if key not in self._pods:
            try:
                obj = self._api.get(PODS, name=name, namespace=namespace)
            except ApiNotFoundError:
                self._pods[key] = None
            else:
                pod = PodView.of(obj)
                self._pods[key] = PodNeeds(
                    uid=pod.uid,
                    node_name=pod.node_name,
                    needs=MappingProxyType(pod_needs(pod)),
                )
        return self._pods[key]
