"""The plugin's standing on its node as series: the kubelet's registration of it, and the MIG
instances no prepared claim owns (a leak), read from a real emulated GPU and checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, PrepareState
from driver.errors import BackendError
from driver.gpu.backend import MigInstance
from driver.gpu.emulated import EmulatedGpuBackend
from kubeletplugin.nodestatemetrics import NodeStateCollector

NODE = "n1"


def _samples(collector: NodeStateCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _recorded(instance: MigInstance, *, started: bool = False) -> Checkpoint:
    """A checkpoint whose one claim records ``instance``: complete, or (``started``) only its
    placement, as prepare records it before creating the instance."""
    device = PreparedDevice(
        request_names=("gpu",),
        pool=NODE,
        device="gpu-0-1g-5gb-0",
        gpu_index=instance.gpu_index,
        gpu_uuid=str(instance.gpu_uuid),
        profile=instance.profile,
        placement_start=instance.placement.start,
        placement_size=instance.placement.size,
    )
    state = PrepareState.PREPARE_STARTED
    if not started:
        device = device.model_copy(
            update={
                "gi_id": instance.gi_id,
                "ci_id": instance.ci_id,
                "mig_uuid": instance.mig_uuid,
                "cdi_device_ids": ("instaslice.dev/mig=c1",),
            }
        )
        state = PrepareState.PREPARE_COMPLETED
    claim = PreparedClaim(uid="c1", namespace="ns", name="c", state=state, devices=(device,))
    return Checkpoint(node_name=NODE).with_claim(claim)


def test_an_instance_no_claim_records_is_counted_until_a_claim_does() -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="1xA100-40GB")
    checkpoint = Checkpoint(node_name=NODE)
    collector = NodeStateCollector(
        registered=lambda: True,
        instances=backend.instances,
        checkpoint=lambda: checkpoint,
        max_age=0,
    )
    assert _samples(collector) == {
        "instaslice_kubelet_plugin_registered": 1.0,
        "instaslice_kubelet_plugin_unowned_instances": 0.0,
    }
    instance = backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    assert _samples(collector)["instaslice_kubelet_plugin_unowned_instances"] == 1.0
    checkpoint = _recorded(instance, started=True)  # being prepared: owned already
    assert _samples(collector)["instaslice_kubelet_plugin_unowned_instances"] == 0.0
    checkpoint = _recorded(instance)
    assert _samples(collector)["instaslice_kubelet_plugin_unowned_instances"] == 0.0


def test_registration_and_a_listing_that_fails() -> None:
    calls: list[int] = []

    def failing() -> Sequence[MigInstance]:
        calls.append(1)
        raise BackendError("NVML: GPU is lost")

    collector = NodeStateCollector(
        registered=lambda: None, instances=failing, checkpoint=Checkpoint, max_age=0
    )
    samples = _samples(collector)
    assert samples == {"instaslice_kubelet_plugin_registered": 0.0}  # unknown is not 0
    assert calls == [1]


def test_the_listing_is_kept_for_max_age() -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="1xA100-40GB")
    now = [0.0]
    listed: list[int] = []

    def instances() -> Sequence[MigInstance]:
        listed.append(1)
        return backend.instances()

    collector = NodeStateCollector(
        registered=lambda: False,
        instances=instances,
        checkpoint=Checkpoint,
        max_age=10,
        clock=lambda: now[0],
    )
    _samples(collector)
    backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    assert _samples(collector)["instaslice_kubelet_plugin_unowned_instances"] == 0.0  # kept
    now[0] = 10.0
    assert _samples(collector)["instaslice_kubelet_plugin_unowned_instances"] == 1.0
    assert len(listed) == 2


@pytest.mark.parametrize("reads", ["made-meanwhile", "released-meanwhile"])
def test_a_slice_made_or_released_while_the_gpus_are_listed_is_not_a_leak(reads: str) -> None:
    backend = EmulatedGpuBackend(node_name=NODE, spec="1xA100-40GB")
    instance = backend.create_slice(gpu_index=0, profile="1g.5gb", start=0)
    empty, owning = Checkpoint(node_name=NODE), _recorded(instance)
    answers = [empty, owning] if reads == "made-meanwhile" else [owning, empty]
    collector = NodeStateCollector(
        registered=lambda: True,
        instances=backend.instances,
        checkpoint=lambda: answers.pop(0),
        max_age=0,
    )
    assert _samples(collector)["instaslice_kubelet_plugin_unowned_instances"] == 0.0
    assert answers == []
