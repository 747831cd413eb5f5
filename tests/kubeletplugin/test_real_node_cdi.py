"""What a real GPU node gets through the kubelet plugin: the common spec written at start and named
after every slice's own CDI id, and a GPU outside the catalog published and prepared from what NVML
reports (the NVML backend over the fake NVML, real-mode CDI specs with host device numbers)."""

import json
import shutil
from pathlib import Path

from driver.cdi import DeviceMajors
from driver.cdi_common import (
    COMMON_CDI_DEVICE_ID,
    CommonEdits,
    CommonEditsChoice,
    common_spec_path,
    resolve_common_edits,
)
from driver.cluster.port import RESOURCE_SLICES
from driver.gpu import caps
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend
from tests.cdivalidate import inject, validate_spec_file
from tests.gpumodels import UNCATALOGUED_PRODUCT, uncatalogued_model
from tests.kubeletplugin.harness import NodeHarness
from tests.unit.test_cdi_common import FILE_SPEC


def _file_edits(tmp_path: Path, *, emulated: bool) -> CommonEdits:
    path = tmp_path / "driver.json"
    path.write_text(json.dumps(FILE_SPEC))
    return resolve_common_edits(
        CommonEditsChoice(mode="file", path=path), emulated=emulated, dev_root=tmp_path
    )


def test_every_slice_names_the_common_device_after_its_own(
    node: NodeHarness, tmp_path: Path
) -> None:
    node.start_plugin(cdi_common=_file_edits(tmp_path, emulated=True))
    common_spec = common_spec_path(node.cdi_root)
    assert json.loads(common_spec.read_bytes())["devices"][0]["name"] == "common"
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-1g-5gb-0", "gpu-0-1g-5gb-1", "gpu-1-1g-5gb-0"])
    (answer,) = kubelet.prepare([claim]).values()
    assert answer.error == ""
    ids = [device[3] for device in answer.devices]
    assert ids == [
        (f"instaslice.dev/mig={claim.uid}-{device[2]}", COMMON_CDI_DEVICE_ID)
        for device in answer.devices
    ]
    # Prepared again (kubelet retry): the same answer, from the checkpoint.
    assert kubelet.prepare([claim])[claim.uid] == answer
    written = tmp_path / "cdi-as-prepared"
    shutil.copytree(node.cdi_root, written)
    assert kubelet.unprepare([claim]) == {claim.uid: ""}
    # The common spec stays: other claims (and the next ones) name it.
    assert node.cdi_files() == [common_spec]
    # The runtime's view (CDI library, where installed): one container holding the claim.
    injected = inject(written, [i for pair in ids for i in pair])
    assert "LD_LIBRARY_PATH=/opt/nvidia/lib" in injected["env"]
    paths = [d["path"] for d in injected["linuxDevices"]]
    # the common control node once, and each slice's own nodes (two GPUs, three slices)
    assert paths.count("/dev/nvidiactl") == 1
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(paths)
    assert len([p for p in paths if p.startswith("/dev/nvidia-caps/")]) == 6


def test_a_restarted_plugin_answers_with_the_common_device_too(
    node: NodeHarness, tmp_path: Path
) -> None:
    common = _file_edits(tmp_path, emulated=True)
    first = node.start_plugin(cdi_common=common)
    claim = node.claim(["gpu-1-3g-20gb-4"])
    before = node.kubelet().prepare([claim])[claim.uid]
    node.stop_plugin(first)
    common_spec_path(node.cdi_root).unlink()
    node.start_plugin(cdi_common=common)
    assert common_spec_path(node.cdi_root).is_file()
    assert node.kubelet().prepare([claim])[claim.uid] == before
    assert before.devices[0][3][-1] == COMMON_CDI_DEVICE_ID


def _capabilities(root: Path, *, gpu_minor: int, gi_id: int, gi_minor: int, ci_minor: int) -> None:
    """The driver's access files for one instance, as /proc/driver/nvidia/capabilities has them."""
    gi = caps.access_file(root, gpu_minor=gpu_minor, gi_id=gi_id)
    ci = caps.access_file(root, gpu_minor=gpu_minor, gi_id=gi_id, ci_id=0)
    ci.parent.mkdir(parents=True)
    gi.write_text(f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    ci.write_text(f"DeviceFileMinor: {ci_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


def test_a_gpu_outside_the_catalog_is_published_and_prepared_from_nvml(
    node: NodeHarness, tmp_path: Path
) -> None:
    fake = FakeNvml(gpus=[uncatalogued_model()], node_name=node.node)
    minors = tmp_path / "mig-minors"
    minors.write_text(caps.layout_text(gpu_count=1))
    capabilities = tmp_path / "capabilities"
    # The access files win over the static table: numbers the table would not give.
    _capabilities(capabilities, gpu_minor=0, gi_id=1, gi_minor=401, ci_minor=402)
    backend = NvmlGpuBackend(nvml=fake, mig_minors_path=minors, capabilities_root=capabilities)
    node.start_plugin(backend=backend, emulated=False, majors=DeviceMajors(gpu=195, caps=236))

    published = [
        device
        for slice_obj in node.api.list_objects(RESOURCE_SLICES).items
        for device in slice_obj["spec"].get("devices", [])
    ]
    assert sorted(d["name"] for d in published) == [
        "gpu-0-1g-24gb-0",
        "gpu-0-1g-24gb-1",
        "gpu-0-1g-24gb-2",
        "gpu-0-1g-24gb-3",
        "gpu-0-2g-48gb-0",
        "gpu-0-2g-48gb-2",
        "gpu-0-4g-96gb-0",
    ]
    attributes = next(d for d in published if d["name"] == "gpu-0-2g-48gb-2")["attributes"]
    assert attributes["profile"] == {"string": "2g.48gb"}
    assert attributes["productName"] == {"string": UNCATALOGUED_PRODUCT}

    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-2g-48gb-2"])
    (answer,) = kubelet.prepare([claim]).values()
    assert answer.error == ""
    (instance,) = backend.instances()
    assert (instance.profile, instance.placement.start) == ("2g.48gb", 2)
    (spec_file,) = node.cdi_files()
    spec = json.loads(spec_file.read_bytes())
    (device,) = spec["devices"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
        {"path": "/dev/nvidia-caps/nvidia-cap401", "type": "c", "major": 236, "minor": 401},
        {"path": "/dev/nvidia-caps/nvidia-cap402", "type": "c", "major": 236, "minor": 402},
    ]
    assert f"NVIDIA_VISIBLE_DEVICES={instance.mig_uuid}" in device["containerEdits"]["env"]
    kept = tmp_path / spec_file.name
    shutil.copy(spec_file, kept)
    assert kubelet.unprepare([claim]) == {claim.uid: ""}
    assert backend.instances() == ()
    assert validate_spec_file(kept).startswith("OK:")
