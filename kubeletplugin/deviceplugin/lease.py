"""The shim's Lease: tells the controller whether this node's device-plugin shim serves.

A classic pod the kubelet admits while our shim does not answer is failed for good
(``UnexpectedAdmissionError``), so the controller must not send classic pods to a node whose shim
is down. The Node's ``allocatable`` says so only after the kubelet's next status update (up to
10 s), which is too late during a DaemonSet rolling update. So the shim holds a Lease
``instaslice-shim-<node>`` in the system namespace: taken (``holderIdentity`` = this process,
``acquireTime`` = now) once every resource is registered with the kubelet, given back
(``holderIdentity`` emptied) first thing when the plugin stops. A crash gives nothing back; the
controller then learns from the first rejected pod, and the next start's new ``acquireTime`` tells
it the shim is back. No renewals: the Lease is a state, not a heartbeat (a write per node every
few seconds would cost a large cluster more than it tells).

Best effort: a failed write is logged and tried again on the next maintenance tick; the shim
serves either way.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from api import wire
from api.names import (
    SHIM_LEASE_LABEL,
    SHIM_LEASE_NODE_ANNOTATION,
    SYSTEM_NAMESPACE,
    shim_lease_name,
)
from driver.cluster.port import LEASES, ClusterApi, format_micro_time
from driver.cluster.views import LeaseView
from driver.errors import ApiNotFoundError, ClusterError, ConflictError

logger = logging.getLogger(__name__)

_LABEL_VALUE_MAX = 63


class ShimLease:
    def __init__(
        self,
        *,
        api: ClusterApi,
        node_name: str,
        identity: str,
        namespace: str = SYSTEM_NAMESPACE,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api
        self._node = node_name
        self._identity = identity
        self._namespace = namespace
        self._now = now
        self.name = shim_lease_name(node_name)
        self.held = False

    def acquire(self) -> bool:
        """Take the lease for this process (idempotent); True once held."""
        if self.held:
            return True
        now = format_micro_time(self._now())
        spec: wire.LeaseSpec = {
            "holderIdentity": self._identity,
            "acquireTime": now,
            "renewTime": now,
        }
        try:
            self._write(spec)
        except ClusterError as exc:
            logger.warning("shim lease %s/%s: cannot take it: %s", self._namespace, self.name, exc)
            return False
        self.held = True
        logger.info("shim lease %s/%s taken by %s", self._namespace, self.name, self._identity)
        return True

    def release(self) -> None:
        """Give the lease back (the shim stops serving); never raises."""
        if not self.held:
            return
        self.held = False
        now = format_micro_time(self._now())
        try:
            self._write({"holderIdentity": "", "acquireTime": now, "renewTime": now})
        except ClusterError as exc:
            logger.warning(
                "shim lease %s/%s: cannot give it back: %s", self._namespace, self.name, exc
            )
            return
        logger.info("shim lease %s/%s given back", self._namespace, self.name)

    def _write(self, spec: wire.LeaseSpec) -> None:
        for _ in range(3):
            try:
                current = self._api.get(LEASES, name=self.name, namespace=self._namespace)
            except ApiNotFoundError:
                try:
                    self._api.create(LEASES, self._new(spec), namespace=self._namespace)
                    return
                except ConflictError:
                    continue  # created meanwhile (AlreadyExists): update it
            updated = copy.deepcopy(current)
            updated["spec"] = {**LeaseView.of(current).spec, **spec}
            try:
                self._api.update(LEASES, updated)
                return
            except ConflictError:
                continue
        raise ClusterError(f"lease {self._namespace}/{self.name} kept changing")

    def _new(self, spec: wire.LeaseSpec) -> wire.Lease:
        label = self._node if len(self._node) <= _LABEL_VALUE_MAX else "true"
        return {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {
                "name": self.name,
                "namespace": self._namespace,
                "labels": {SHIM_LEASE_LABEL: label},
                "annotations": {SHIM_LEASE_NODE_ANNOTATION: self._node},
            },
            "spec": spec,
        }
