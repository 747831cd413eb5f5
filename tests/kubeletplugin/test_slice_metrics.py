"""The per-slice series: one ``slice_info`` per live slice with its pod, the slice's usage, and
slice-seconds — read from the checkpoint at scrape time (docs/design.md D9, F28)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.checkpoint import (
    Checkpoint,
    PodRef,
    PreparedClaim,
    PreparedDevice,
    PrepareState,
    ShimBinding,
    SliceSeconds,
)
from driver.errors import BackendError, CheckpointError, NotFoundError
from driver.gpu import nvml_api
from driver.gpu.backend import SliceUsage
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend
from driver.ids import MigUuid
from driver.mig.catalog import CATALOG
from kubeletplugin.slicemetrics import INFO_LABELS, SliceCollector
from kubeletplugin.sliceusage import USAGE_MAX_AGE_SECONDS, SliceUsageCache
from tests.kubeletplugin.harness import NodeHarness

NODE = "gpu-node-7"
P = "instaslice_kubelet_plugin_"
GIB = 1024**3

Labels = dict[str, str]


def _device(gpu: int, profile: str, start: int, *, gi: int, size: int = 1) -> PreparedDevice:
    return PreparedDevice(
        request_names=("gpu",),
        pool=NODE,
        device=f"gpu-{gpu}-{profile.replace('.', '-')}-{start}",
        gpu_index=gpu,
        gpu_uuid=f"GPU-{gpu:08d}-0000-0000-0000-000000000000",
        profile=profile,
        placement_start=start,
        placement_size=size,
        gi_id=gi,
        ci_id=0,
        mig_uuid=f"MIG-{gpu:04d}{start:04d}-0000-0000-0000-000000000000",
        cdi_device_ids=(f"instaslice.dev/mig=x-{gpu}-{start}",),
    )


def _claim(
    uid: str,
    *devices: PreparedDevice,
    namespace: str = "team-a",
    pods: Sequence[PodRef] = (),
    shim: ShimBinding | None = None,
    prepared_at: float | None = 1_000.0,
) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace=namespace,
        name=f"claim-{uid}",
        state=PrepareState.PREPARE_COMPLETED,
        devices=devices,
        pods=tuple(pods),
        shim=shim,
        prepared_at=prepared_at,
    )


def _checkpoint(*claims: PreparedClaim, released: Sequence[SliceSeconds] = ()) -> Checkpoint:
    checkpoint = Checkpoint(node_name=NODE, released_slice_seconds=tuple(released))
    for claim in claims:
        checkpoint = checkpoint.with_claim(claim)
    return checkpoint


def samples_of(registry: CollectorRegistry, name: str) -> list[tuple[Labels, float]]:
    """(labels, value) of each sample of ``instaslice_kubelet_plugin_<name>``, as scraped."""
    text = generate_latest(registry).decode()
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == P + name
    ]


@dataclass
class FixedUsage:
    """A ``UsageSource`` with set answers; a device without one is not found."""

    answers: dict[str, SliceUsage | Exception] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def slice_usage(self, *, mig_uuid: MigUuid) -> SliceUsage:
        self.asked.append(mig_uuid)
        answer = self.answers.get(mig_uuid, NotFoundError(f"no MIG device {mig_uuid}"))
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class Scraper:
    """A registry holding only the per-slice collector over a checkpoint a test changes."""

    state: Checkpoint = field(default_factory=Checkpoint)
    source: FixedUsage = field(default_factory=FixedUsage)
    now: float = 5_000.0
    monotonic: float = 0.0
    unreadable: CheckpointError | None = None
    """What reading the checkpoint raises, if set."""

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.collector = SliceCollector(
            node_name=NODE,
            checkpoint=self._checkpoint,
            usage=SliceUsageCache(source=self.source, clock=lambda: self.monotonic),
            clock=lambda: self.now,
        )
        self.registry.register(self.collector)

    def _checkpoint(self) -> Checkpoint:
        if self.unreadable is not None:
            raise self.unreadable
        return self.state

    def samples(self, name: str) -> list[tuple[Labels, float]]:
        return samples_of(self.registry, name)

    def value(self, name: str, **labels: str) -> float | None:
        found = [v for got, v in self.samples(name) if labels.items() <= got.items()]
        assert len(found) <= 1, found
        return found[0] if found else None


# -- attribution -----------------------------------------------------------------------------


def test_slice_info_names_the_slice_its_claim_its_pod_and_dcgm_exporters_labels() -> None:
    scraper = Scraper(
        state=_checkpoint(
            _claim(
                "c1",
                _device(3, "3g.20gb", 4, gi=2, size=4),
                pods=(PodRef(name="trainer-0", uid="pod-uid-1"),),
            )
        )
    )
    ((labels, value),) = scraper.samples("slice_info")
    assert value == 1.0
    assert labels == {
        "node": NODE,
        "gpu": "3",
        "gpu_uuid": "GPU-00000003-0000-0000-0000-000000000000",
        "UUID": "GPU-00000003-0000-0000-0000-000000000000",
        "mig_uuid": "MIG-00030004-0000-0000-0000-000000000000",
        "gpu_instance_id": "2",
        "GPU_I_ID": "2",
        "compute_instance_id": "0",
        "profile": "3g.20gb",
        "GPU_I_PROFILE": "3g.20gb",
        "placement_start": "4",
        "claim_namespace": "team-a",
        "claim_name": "claim-c1",
        "claim_uid": "c1",
        "pod_namespace": "team-a",
        "pod_name": "trainer-0",
        "pod_uid": "pod-uid-1",
        "kind": "dra",
    }
    assert set(labels) == set(INFO_LABELS)


A_POD = PodRef(name="web-1", uid="uid-web-1")
B_POD = PodRef(name="api-0", uid="uid-api-0")
SHADOW = "nvidia.com/mig-1g.5gb"


@pytest.mark.parametrize(
    ("pods", "shim", "expected"),
    [
        ((A_POD,), None, ("team-a", "web-1", "uid-web-1", "dra")),
        ((A_POD, B_POD), None, ("team-a", "api-0,web-1", "uid-api-0,uid-web-1", "dra")),
        ((), None, ("", "", "", "dra")),
        ((A_POD,), ShimBinding(resource_name=SHADOW), ("team-a", "web-1", "uid-web-1", "classic")),
        (
            (A_POD,),
            ShimBinding(
                resource_name=SHADOW,
                pod_uid="uid-other",
                container_name="main",
                pod_name="other-0",
                pod_namespace="team-b",
            ),
            ("team-b", "other-0", "uid-other", "classic"),
        ),
        (
            (A_POD,),
            ShimBinding(resource_name=SHADOW, pod_uid="uid-web-1", container_name="main"),
            ("team-a", "web-1", "uid-web-1", "classic"),
        ),
    ],
    ids=[
        "dra",
        "dra-shared-by-two-pods",
        "dra-reserved-for-nobody",
        "classic-holder-not-known-yet",
        "classic-held-by-another-namespaces-pod",
        "classic-holder-without-name-recorded",
    ],
)
def test_the_pod_is_the_claims_or_for_classic_pods_the_holders(
    pods: tuple[PodRef, ...], shim: ShimBinding | None, expected: tuple[str, str, str, str]
) -> None:
    scraper = Scraper(
        state=_checkpoint(_claim("c1", _device(0, "1g.5gb", 0, gi=9), pods=pods, shim=shim))
    )
    ((labels, _),) = scraper.samples("slice_info")
    assert (
        labels["pod_namespace"],
        labels["pod_name"],
        labels["pod_uid"],
        labels["kind"],
    ) == expected
    assert labels["claim_namespace"] == "team-a"


def test_only_complete_slices_of_completed_claims_are_listed_in_placement_order() -> None:
    started = PreparedClaim(
        uid="s",
        namespace="team-a",
        name="starting",
        state=PrepareState.PREPARE_STARTED,
        devices=(_device(0, "1g.5gb", 5, gi=1).model_copy(update={"mig_uuid": None}),),
    )
    two = _claim("c2", _device(1, "1g.5gb", 6, gi=3), _device(0, "2g.10gb", 2, gi=4, size=2))
    scraper = Scraper(state=_checkpoint(two, started, _claim("c1", _device(0, "1g.5gb", 0, gi=2))))
    assert [
        (labels["gpu"], labels["placement_start"], labels["claim_uid"])
        for labels, _ in scraper.samples("slice_info")
    ] == [
        ("0", "0", "c1"),
        ("0", "2", "c2"),
        ("1", "6", "c2"),
    ]


def test_series_follow_the_checkpoint_at_every_scrape() -> None:
    scraper = Scraper()
    assert scraper.samples("slice_info") == []
    scraper.state = _checkpoint(_claim("c1", _device(0, "7g.40gb", 0, gi=0, size=8)))
    assert len(scraper.samples("slice_info")) == 1
    scraper.state = scraper.state.released("c1", at=scraper.now)
    assert scraper.samples("slice_info") == []
    assert scraper.samples("slice_memory_total_bytes") == []


def test_an_unreadable_checkpoint_leaves_the_series_out_of_that_scrape_only() -> None:
    scraper = Scraper(state=_checkpoint(_claim("c1", _device(0, "1g.5gb", 0, gi=2))))
    scraper.unreadable = CheckpointError("checkpoint /x is unusable: checksum mismatch")
    assert scraper.samples("slice_info") == []
    assert scraper.value("slice_usage_errors_total") == 0
    scraper.unreadable = None
    assert len(scraper.samples("slice_info")) == 1


def test_registering_reads_neither_the_checkpoint_nor_the_gpus() -> None:
    asked: list[str] = []

    def checkpoint() -> Checkpoint:
        asked.append("checkpoint")
        return Checkpoint()

    source = FixedUsage()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(
        SliceCollector(node_name=NODE, checkpoint=checkpoint, usage=SliceUsageCache(source=source))
    )
    assert asked == []
    assert source.asked == []


# -- usage -------------------------------------------------------------------------------------

MIG_0 = "MIG-00000000-0000-0000-0000-000000000000"
MIG_1 = "MIG-00000001-0000-0000-0000-000000000000"


def _two_slices() -> Checkpoint:
    return _checkpoint(_claim("c1", _device(0, "1g.5gb", 0, gi=7), _device(0, "1g.5gb", 1, gi=8)))


def test_usage_is_exported_per_slice_and_utilization_only_where_reported() -> None:
    scraper = Scraper(state=_two_slices())
    scraper.source.answers = {
        MIG_0: SliceUsage(memory_used_bytes=GIB, memory_total_bytes=5 * GIB),
        MIG_1: SliceUsage(
            memory_used_bytes=2 * GIB,
            memory_total_bytes=5 * GIB,
            gpu_utilization_percent=85,
            memory_utilization_percent=40,
        ),
    }
    assert scraper.samples("slice_memory_used_bytes") == [
        ({"node": NODE, "gpu": "0", "mig_uuid": MIG_0}, GIB),
        ({"node": NODE, "gpu": "0", "mig_uuid": MIG_1}, 2 * GIB),
    ]
    assert scraper.value("slice_memory_total_bytes", mig_uuid=MIG_0) == 5 * GIB
    assert scraper.samples("slice_gpu_utilization_ratio") == [
        ({"node": NODE, "gpu": "0", "mig_uuid": MIG_1}, 0.85)
    ]
    assert scraper.value("slice_memory_utilization_ratio", mig_uuid=MIG_1) == 0.4


def test_a_slice_whose_usage_cannot_be_read_is_counted_and_the_scrape_goes_on() -> None:
    scraper = Scraper(state=_two_slices())
    scraper.source.answers = {
        MIG_0: BackendError("NVML nvmlDeviceGetMemoryInfo failed: GPU is lost (code 15)"),
        MIG_1: SliceUsage(memory_used_bytes=0, memory_total_bytes=5 * GIB),
    }
    used = scraper.samples("slice_memory_used_bytes")
    assert [labels["mig_uuid"] for labels, _ in used] == [MIG_1]
    assert len(scraper.samples("slice_info")) == 2
    assert scraper.value("slice_usage_errors_total") == 1


def test_even_an_unexpected_error_of_one_device_is_counted_not_raised() -> None:
    scraper = Scraper(state=_two_slices())
    scraper.source.answers = {MIG_0: RuntimeError("a bug"), MIG_1: ValueError("another")}
    assert scraper.samples("slice_memory_used_bytes") == []
    assert scraper.value("slice_usage_errors_total") == 2


def test_usage_is_read_once_per_max_age_and_gone_slices_are_forgotten() -> None:
    scraper = Scraper(state=_two_slices())
    scraper.source.answers = {
        MIG_0: SliceUsage(memory_used_bytes=1, memory_total_bytes=5),
        MIG_1: SliceUsage(memory_used_bytes=2, memory_total_bytes=5),
    }
    scraper.samples("slice_memory_used_bytes")
    scraper.monotonic += 9.9
    scraper.samples("slice_memory_used_bytes")
    assert scraper.source.asked == [MIG_0, MIG_1]
    scraper.source.answers[MIG_0] = SliceUsage(memory_used_bytes=3, memory_total_bytes=5)
    scraper.monotonic += 0.1
    assert scraper.value("slice_memory_used_bytes", mig_uuid=MIG_0) == 3
    assert scraper.source.asked == [MIG_0, MIG_1, MIG_0, MIG_1]
    slices = scraper.state
    scraper.state = slices.released("c1", at=scraper.now)
    assert scraper.samples("slice_memory_used_bytes") == []
    scraper.state = slices  # back within the max age: read again, nothing was kept
    scraper.samples("slice_memory_used_bytes")
    assert scraper.source.asked == [MIG_0, MIG_1] * 3


def test_an_nvml_failure_on_usage_is_counted_not_raised() -> None:
    fake = FakeNvml(gpus="A100-40GB", node_name=NODE)
    backend = NvmlGpuBackend(nvml=fake)
    try:
        made = backend.create_slice(gpu_index=0, profile="2g.10gb", start=0)
        assert made.mig_uuid is not None
        device = _device(0, "2g.10gb", 0, gi=made.gi_id, size=2).model_copy(
            update={"mig_uuid": made.mig_uuid, "gpu_uuid": made.gpu_uuid}
        )
        registry = CollectorRegistry(auto_describe=True)
        clock = [0.0]
        cache = SliceUsageCache(source=backend, clock=lambda: clock[0])
        registry.register(
            SliceCollector(
                node_name=NODE, checkpoint=lambda: _checkpoint(_claim("c1", device)), usage=cache
            )
        )
        fake.fail("nvmlDeviceGetMemoryInfo", code=nvml_api.NVML_ERROR_GPU_IS_LOST)
        assert samples_of(registry, "slice_usage_errors_total") == [({}, 1.0)]
        assert samples_of(registry, "slice_memory_used_bytes") == []
        assert len(samples_of(registry, "slice_info")) == 1
        fake.set_mig_usage(made.mig_uuid, memory_used=3 * GIB)
        clock[0] += USAGE_MAX_AGE_SECONDS
        labels = {"node": NODE, "gpu": "0", "mig_uuid": made.mig_uuid}
        assert samples_of(registry, "slice_memory_used_bytes") == [(labels, 3 * GIB)]
        assert samples_of(registry, "slice_usage_errors_total") == [({}, 1.0)]
    finally:
        backend.close()


# -- slice-seconds ------------------------------------------------------------------------------


def test_slice_seconds_are_the_released_ones_plus_the_live_slices_ages() -> None:
    scraper = Scraper(
        state=_checkpoint(
            _claim(
                "c1",
                _device(0, "1g.5gb", 0, gi=1),
                _device(0, "1g.5gb", 1, gi=2),
                prepared_at=4_000.0,
            ),
            _claim("c2", _device(1, "1g.5gb", 0, gi=1), namespace="team-b", prepared_at=4_900.0),
            _claim("c3", _device(1, "1g.5gb", 1, gi=2), namespace="team-b", prepared_at=None),
            released=(SliceSeconds(namespace="team-a", profile="1g.5gb", seconds=500.0),),
        )
    )
    assert scraper.samples("slice_seconds_total") == [
        ({"claim_namespace": "team-a", "profile": "1g.5gb"}, 500.0 + 2 * 1000.0),
        ({"claim_namespace": "team-b", "profile": "1g.5gb"}, 100.0),
    ]
    scraper.now += 60
    assert scraper.value("slice_seconds_total", claim_namespace="team-a") == 500.0 + 2 * 1060.0


def test_slice_seconds_never_go_back_through_a_release_or_a_clock_set_back() -> None:
    scraper = Scraper(
        state=_checkpoint(_claim("c1", _device(0, "3g.20gb", 0, gi=1, size=4), prepared_at=4_000.0))
    )
    assert scraper.value("slice_seconds_total") == 1000.0
    scraper.now += 30
    scraper.state = scraper.state.released("c1", at=scraper.now)
    assert scraper.value("slice_seconds_total") == 1030.0
    assert scraper.samples("slice_info") == []
    scraper.state = _checkpoint(
        _claim("c2", _device(0, "3g.20gb", 0, gi=1, size=4), prepared_at=4_000.0)
    )
    scraper.now = 4_500.0  # the wall clock was set back
    assert scraper.value("slice_seconds_total") == 1030.0


# -- cardinality -------------------------------------------------------------------------------


def test_a_full_node_of_8_gpus_by_7_slices_has_56_series_of_each_per_slice_family() -> None:
    claims = [
        _claim(f"c{gpu}-{start}", _device(gpu, "1g.5gb", start, gi=start + 1), namespace=f"ns-{gpu % 4}",
               pods=(PodRef(name=f"p{gpu}-{start}", uid=f"u{gpu}-{start}"),))
        for gpu in range(8)
        for start in range(7)
    ]  # fmt: skip
    scraper = Scraper(state=_checkpoint(*claims))
    scraper.source.answers = {
        c.devices[0].mig_uuid or "": SliceUsage(memory_used_bytes=1, memory_total_bytes=5)
        for c in claims
    }
    counts = {
        name: len(scraper.samples(name))
        for name in (
            "slice_info",
            "slice_memory_used_bytes",
            "slice_memory_total_bytes",
            "slice_gpu_utilization_ratio",
            "slice_seconds_total",
            "slice_usage_errors_total",
        )
    }
    assert counts == {
        "slice_info": 56,
        "slice_memory_used_bytes": 56,
        "slice_memory_total_bytes": 56,
        # 56 more where the GPU reports utilization per MIG device, and as many for memory
        "slice_gpu_utilization_ratio": 0,
        "slice_seconds_total": 4,  # namespaces by profiles used on the node
        "slice_usage_errors_total": 1,
    }


# -- the plugin ---------------------------------------------------------------------------------


def test_the_plugin_serves_a_slices_series_from_prepare_to_unprepare_and_across_a_restart(
    node: NodeHarness,
) -> None:
    plugin = node.start_plugin()
    claim = node.claim(["gpu-1-3g-20gb-4"], namespace="team-a")
    node.reserve_for_pod(claim, pod="trainer-0", uid="9d6a1f00-0000-4000-8000-000000000001")
    kubelet = node.kubelet()
    assert kubelet.prepare([claim])[claim.uid].error == ""
    (device,) = plugin.store.load().claims[claim.uid].devices
    ((labels, _),) = samples_of(plugin.metrics.registry, "slice_info")
    assert (labels["UUID"], labels["GPU_I_ID"], labels["mig_uuid"]) == (
        device.gpu_uuid,
        str(device.gi_id),
        device.mig_uuid,
    )
    assert (labels["pod_name"], labels["claim_name"], labels["kind"]) == (
        "trainer-0",
        claim.name,
        "dra",
    )
    total = CATALOG["A100-40GB"].profile("3g.20gb").memory_bytes
    usage = {"node": node.node, "gpu": "1", "mig_uuid": device.mig_uuid or ""}
    assert samples_of(plugin.metrics.registry, "slice_memory_total_bytes") == [(usage, total)]

    node.stop_plugin(plugin)
    plugin = node.start_plugin()
    assert samples_of(plugin.metrics.registry, "slice_info") == [(labels, 1.0)]

    assert node.kubelet().unprepare([claim]) == {claim.uid: ""}
    assert samples_of(plugin.metrics.registry, "slice_info") == []
    assert samples_of(plugin.metrics.registry, "slice_memory_used_bytes") == []
    ((seconds_labels, _),) = samples_of(plugin.metrics.registry, "slice_seconds_total")
    assert seconds_labels == {"claim_namespace": "team-a", "profile": "3g.20gb"}
