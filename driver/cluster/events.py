"""Kubernetes Events (core/v1) for the things a person should see on ``kubectl describe``.

Repeats of the same event on the same object bump ``count`` and ``lastTimestamp`` of the event
already posted instead of creating another (as client-go's recorder does), so a pod that cannot be
placed for an hour has one event, not thousands. Posting is best effort: a failure is logged and
never disturbs the caller's work.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from api import wire
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.port import (
    EVENTS,
    Body,
    ClusterApi,
    JsonObject,
    PatchType,
    format_time,
    name_of,
    namespace_of,
    resource_version_of,
    uid_of,
)
from driver.cluster.views import path, text
from driver.errors import ApiNotFoundError, ClusterError

logger = logging.getLogger(__name__)

NORMAL: Final = "Normal"
WARNING: Final = "Warning"
_DEFAULT_NAMESPACE = "default"


@dataclass(slots=True)
class _Posted:
    namespace: str
    name: str
    count: int


_Key = tuple[str, str, str, str, str, str]


class EventRecorder:
    def __init__(
        self,
        *,
        api: ClusterApi,
        component: str,
        host: str = "",
        instance: str = "",
        clock: Clock | None = None,
        remembered: int = 4096,
    ) -> None:
        self._api = api
        self._component = component
        self._host = host
        self._instance = instance or host or component
        self._clock = clock or SystemClock()
        self._remembered = remembered
        self._lock = threading.Lock()
        self._posted: OrderedDict[_Key, _Posted] = OrderedDict()

    def record(self, obj: Body, *, event_type: str, reason: str, message: str) -> None:
        """Post (or count again) an event about ``obj``, which carries its ``kind``/``apiVersion``
        as every object from the ``ClusterApi`` does. Never raises."""
        if event_type not in (NORMAL, WARNING):
            raise ValueError(f"event type must be {NORMAL} or {WARNING}, got {event_type!r}")
        namespace = namespace_of(obj) or _DEFAULT_NAMESPACE
        key: _Key = (
            namespace,
            text(path(obj, "kind")),
            name_of(obj),
            uid_of(obj),
            reason,
            event_type + "\x00" + message,
        )
        now = format_time(self._clock.now())
        with self._lock:
            posted = self._posted.get(key)
            if posted is not None:
                self._posted.move_to_end(key)
        try:
            if posted is not None and self._bump(posted, now):
                return
            created = self._create(
                obj,
                namespace=namespace,
                event_type=event_type,
                reason=reason,
                message=message,
                now=now,
            )
        except ClusterError as exc:
            logger.warning(
                "cannot post event %s on %s %s: %s",
                reason,
                text(path(obj, "kind")),
                name_of(obj),
                exc,
            )
            return
        with self._lock:
            self._posted[key] = _Posted(namespace=namespace, name=name_of(created), count=1)
            self._posted.move_to_end(key)
            while len(self._posted) > self._remembered:
                self._posted.popitem(last=False)

    def _bump(self, posted: _Posted, now: str) -> bool:
        count = posted.count + 1
        repeat: wire.EventRepeat = {"count": count, "lastTimestamp": now}
        try:
            self._api.patch(
                EVENTS,
                name=posted.name,
                namespace=posted.namespace,
                patch=repeat,
                patch_type=PatchType.MERGE,
            )
        except ApiNotFoundError:
            return False  # the event expired (events have a TTL): post a new one
        posted.count = count
        return True

    def _create(
        self,
        obj: Body,
        *,
        namespace: str,
        event_type: str,
        reason: str,
        message: str,
        now: str,
    ) -> JsonObject:
        involved: wire.ObjectReference = {
            "apiVersion": text(path(obj, "apiVersion")),
            "kind": text(path(obj, "kind")),
            "name": name_of(obj),
            "uid": uid_of(obj),
            "resourceVersion": resource_version_of(obj),
        }
        object_namespace = namespace_of(obj)
        if object_namespace:
            involved["namespace"] = object_namespace
        source: wire.EventSource = {"component": self._component}
        if self._host:
            source["host"] = self._host
        event: wire.Event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name_of(obj)}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": involved,
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": source,
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
        }
        return self._api.create(EVENTS, event, namespace=namespace)
