"""The kubelet deletes every ResourceSlice of its node when it starts (no driver registered yet):
found on real kubelets, our slices then stayed missing until the next inventory poll. The plugin
watches its own slices and republishes as soon as one is deleted."""

from __future__ import annotations

import time

from api.names import DRIVER_NAME
from driver.cluster.port import RESOURCE_SLICES, JsonObject
from tests.kubeletplugin.harness import NodeHarness


def _ours(node: NodeHarness) -> list[JsonObject]:
    return [
        s
        for s in node.api.list_objects(
            RESOURCE_SLICES, field_selector=f"spec.nodeName={node.node}"
        ).items
        if s["spec"]["driver"] == DRIVER_NAME
    ]


def test_slices_deleted_by_someone_else_are_republished_at_once(node: NodeHarness) -> None:
    node.start_plugin()  # inventory poll: one hour, so only the watch can bring them back
    published = _ours(node)
    assert published
    for obj in published:
        node.api.delete(RESOURCE_SLICES, name=obj["metadata"]["name"])
    deadline = time.monotonic() + 20
    while len(_ours(node)) < len(published):
        assert time.monotonic() < deadline, "the deleted ResourceSlices were not republished"
        time.sleep(0.05)
    assert {len(s["spec"].get("devices") or []) for s in _ours(node)} == {
        len(s["spec"].get("devices") or []) for s in published
    }
