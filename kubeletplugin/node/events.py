"""Events on this plugin's own Node, for what an operator must see on ``kubectl describe node``.

Best effort, as every event: a Node that cannot be read, or an event that cannot be posted, is
logged and never stops the caller.
"""

import logging

from driver.cluster.events import WARNING, EventRecorder
from driver.cluster.port import NODES, ClusterApi
from driver.errors import DriverError

logger = logging.getLogger(__name__)


class NodeEvents:
    """Posts events on Node ``node_name``; without a recorder, only logs."""

    def __init__(self, *, api: ClusterApi, events: EventRecorder | None, node_name: str) -> None:
        self._api = api
        self._events = events
        self._node = node_name

    def post(self, *, event_type: str, reason: str, message: str) -> None:
        if self._events is None:
            return
        try:
            node = self._api.get(NODES, name=self._node)
        except DriverError as exc:
            logger.info("cannot post %s event on Node %s: %s", reason, self._node, exc)
            return
        self._events.record(node, event_type=event_type, reason=reason, message=message)


class NodeWarning:
    """A callable posting one reason's Warning on the Node, the message given at each call."""

    def __init__(self, node_events: NodeEvents, *, reason: str) -> None:
        self._node_events = node_events
        self._reason = reason

    def __call__(self, message: str) -> None:
        self._node_events.post(event_type=WARNING, reason=self._reason, message=message)
