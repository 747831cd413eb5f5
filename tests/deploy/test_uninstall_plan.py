"""What `make undeploy` deletes (``instaslice uninstall``), read from every render a user can deploy:
every kind is one the uninstall knows, and each step holds what it must (docs/deploy.md
"Uninstall")."""

from __future__ import annotations

import pytest

from instaslice.uninstall.manifests import deletion_plan
from tests.deploy import manifests as m
from tests.deploy.test_render import RENDER_SCRIPT_CASES

OVERLAYS = ("gpu", "emulated", "scheduler-native", "scheduler-native-emulated")


@pytest.mark.parametrize("case", sorted(RENDER_SCRIPT_CASES))
def test_every_component_renders_only_kinds_the_uninstall_knows(case: str) -> None:
    overlay, env = RENDER_SCRIPT_CASES[case]
    plan = deletion_plan(m.render_script(overlay, env))
    assert {t.resource.kind for t in plan.plugins} == {"DaemonSet"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_is_removed_classes_first_plugins_before_webhooks_namespace_last(
    overlay: str,
) -> None:
    objects = m.render(m.DEPLOY / "overlays" / overlay)
    plan = deletion_plan(objects)
    classes = {o["metadata"]["name"] for o in objects if o["kind"] == "DeviceClass"}
    assert {t.name for t in plan.classes} == classes
    assert [t.name for t in plan.plugins] == ["instaslice-kubelet-plugin"]
    webhooks = [
        o["metadata"]["name"] for o in objects if o["kind"].endswith("WebhookConfiguration")
    ]
    assert [t.name for t in plan.webhooks] == webhooks
    assert [t.name for t in plan.namespaces] == ["instaslice-system"]
    # everything rendered is in exactly one step
    planned = [t for step in plan.steps for t in step]
    assert len(planned) == len(objects)
    assert {(t.resource.kind, t.name) for t in planned} == {
        (o["kind"], o["metadata"]["name"]) for o in objects
    }
