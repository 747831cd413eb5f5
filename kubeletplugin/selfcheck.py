"""``instaslice-kubelet-plugin check``: what an operator runs on a GPU host before deploying.

One line per check, ``PASS``/``WARN``/``FAIL``/``SKIP`` then the check's name and what was found;
the exit status is 1 when any check failed, else 0. It takes the plugin's own flags (and env vars),
so it checks the configuration the DaemonSet will run with. Read-only by default:

- ``backend``: the GPU backend starts (NVML found and initialised, or the emulated GPUs parse);
- ``gpu <i>``: each GPU, its MIG mode (current and pending) and health;
- ``profiles <i>``: the MIG profiles NVML reports versus the catalog (``driver.mig.catalog``): a GPU
  outside the catalog is still published, from NVML's own profiles and placements;
- ``cdi common edits``: where the edits every slice's container shares come from
  (``--cdi-common-edits``; the NVIDIA Container Toolkit's spec or ``nvidia-ctk``), and that the
  common spec built from them is valid;
- ``toolkit runtime``: the NVIDIA Container Runtime's configured mode (``cdi``/``auto``/``legacy``);
- ``cdi directory``: ``--cdi-root`` exists (or can be made) and is writable.

``--create-one`` also creates the smallest free slice on the first MIG-enabled GPU through the
prepare path's own parts (``SliceOperations.ensure``, ``driver.cdi`` build and write), reads the
CDI spec back through the strict model, then destroys the slice and removes the spec. Run it on a
node where no claim is being prepared (before deploying), since it takes a placement for a moment.
"""

import argparse
import logging
import os
import secrets
import socket
import sys
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

from api.cdi import spec_from_json, spec_to_json
from api.errors import ValidationFailed
from driver import cdi
from driver.cdi_common import CommonEdits, build_common_spec
from driver.errors import DriverError
from driver.gpu.backend import GpuInfo, MigInstance, MigModeBackend
from driver.gpu.rules import Occupant, refusal
from driver.mig.catalog import CATALOG
from driver.mig.model import GpuModel
from kubeletplugin.node.inventory import InventoryDevice, build_inventory
from kubeletplugin.node.setup import build_backend, resolve_cdi_common
from kubeletplugin.settings import Settings, parse_settings
from kubeletplugin.state.slices import SliceOperations

logger = logging.getLogger(__name__)

PASS: Final = "PASS"  # noqa: S105 - a check status, not a password
WARN: Final = "WARN"
FAIL: Final = "FAIL"
SKIP: Final = "SKIP"
TOOLKIT_RUNTIME_CONFIG: Final = Path("/etc/nvidia-container-runtime/config.toml")
SELF_CHECK_CLAIM_PREFIX: Final = "instaslice-self-check-"


@dataclass(frozen=True, slots=True)
class CheckResult:
    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


@dataclass
class Report:
    results: list[CheckResult] = field(default_factory=list)

    def add(self, status: str, name: str, detail: str) -> None:
        self.results.append(CheckResult(status=status, name=name, detail=detail))

    @property
    def failed(self) -> bool:
        return any(r.status == FAIL for r in self.results)


@dataclass(frozen=True, slots=True)
class CheckEnvironment:
    """What the check reads besides the flags; tests point it at their own files."""

    build_backend: Callable[[Settings], MigModeBackend]
    resolve_common: Callable[[Settings], CommonEdits]
    toolkit_runtime_config: Path = TOOLKIT_RUNTIME_CONFIG


def run_checks(settings: Settings, *, create_one: bool, env: CheckEnvironment) -> Report:
    """Every check, in order; never raises for a failed check (it is reported)."""
    report = Report()
    try:
        backend = env.build_backend(settings)
    except DriverError as exc:
        report.add(FAIL, "backend", f"{settings.gpu_backend} GPU backend does not start: {exc}")
        _check_common_edits(report, settings, env)
        _check_toolkit_runtime(report, env.toolkit_runtime_config)
        _check_cdi_directory(report, settings.cdi_root)
        return report
    try:
        report.add(PASS, "backend", _backend_words(settings))
        gpus = _check_gpus(report, backend, settings)
        common = _check_common_edits(report, settings, env)
        _check_toolkit_runtime(report, env.toolkit_runtime_config)
        writable = _check_cdi_directory(report, settings.cdi_root)
        if create_one:
            if not writable:
                report.add(SKIP, "create one slice", "the CDI directory is not writable")
            else:
                _create_one(report, backend, gpus, settings, common)
    finally:
        backend.close()
    return report


def _backend_words(settings: Settings) -> str:
    if settings.gpu_backend == "emulated":
        return f"emulated GPUs {settings.emulated_gpus}"
    return "NVML found and initialised"


def _check_gpus(report: Report, backend: MigModeBackend, settings: Settings) -> tuple[GpuInfo, ...]:
    try:
        gpus = backend.gpus()
    except DriverError as exc:
        report.add(FAIL, "gpus", f"cannot list GPUs: {exc}")
        return ()
    if not gpus:
        report.add(FAIL, "gpus", "no GPU found")
        return gpus
    for gpu in gpus:
        name = f"gpu {gpu.index}"
        what = f"{gpu.product_name} {gpu.uuid}"
        if not gpu.healthy:
            report.add(WARN, name, f"{what}: unhealthy ({gpu.health_reason}); no slices there")
        elif gpu.mig_enabled:
            report.add(PASS, name, f"{what}: MIG mode on")
        elif gpu.mig_pending is None:
            report.add(WARN, name, f"{what}: no MIG support; not published")
        elif gpu.mig_pending:
            report.add(WARN, name, f"{what}: MIG mode pending a GPU reset "
                       f"(nvidia-smi --gpu-reset -i {gpu.index})")  # fmt: skip
        else:
            fix = (
                "the plugin enables it when the GPU is idle (--mig-mode when-idle)"
                if settings.mig_mode == "when-idle"
                else f"enable it: nvidia-smi -i {gpu.index} -mig 1, or --mig-mode when-idle"
            )
            report.add(WARN, name, f"{what}: MIG mode off; {fix}")
        if gpu.model is not None:
            _check_profiles(report, gpu, gpu.model)
    if not any(g.mig_enabled for g in gpus):
        status = WARN if settings.mig_mode == "when-idle" else FAIL
        report.add(status, "mig", "no GPU has MIG mode on: this node would publish no slice")
    return gpus


def _check_profiles(report: Report, gpu: GpuInfo, model: GpuModel) -> None:
    name = f"profiles {gpu.index}"
    reported = ", ".join(p.name for p in model.profiles)
    known = next((m for m in CATALOG.values() if m.product_name == gpu.product_name), None)
    if known is None:
        report.add(PASS, name, f"{len(model.profiles)} profiles from NVML ({reported}); "
                   f"{gpu.product_name} is not in the catalog: published from NVML, requested "
                   "through DeviceClass mig.instaslice.dev with a CEL selector on profile")  # fmt: skip
        return
    ours = {p.name: (p.placements, p.max_count) for p in known.profiles}
    theirs = {p.name: (p.placements, p.max_count) for p in model.profiles}
    differences = [
        f"{n}: {'only in NVML' if n not in ours else 'only in the catalog' if n not in theirs else 'placements or count differ'}"
        for n in sorted(ours.keys() | theirs.keys())
        if ours.get(n) != theirs.get(n)
    ]
    if differences:
        report.add(WARN, name, f"NVML's profiles differ from the catalog's {known.name} "
                   f"({'; '.join(differences)}); NVML's are published")  # fmt: skip
    else:
        report.add(PASS, name, f"{len(model.profiles)} profiles, as the catalog's {known.name}")


def _check_common_edits(
    report: Report, settings: Settings, env: CheckEnvironment
) -> CommonEdits | None:
    name = "cdi common edits"
    try:
        common = env.resolve_common(settings)
    except DriverError as exc:
        report.add(FAIL, name, f"--cdi-common-edits {settings.cdi_common_edits}: {exc}")
        return None
    if common.warning:
        report.add(WARN, name, common.warning)
        return common
    if common.edits is None:
        report.add(PASS, name, f"{common.source}: no common spec; slice specs carry their device "
                   "nodes and env only")  # fmt: skip
        return common
    try:
        spec_from_json(spec_to_json(build_common_spec(common)))
    except (DriverError, ValidationFailed) as exc:
        report.add(FAIL, name, f"{common.source}: the common spec would be invalid: {exc}")
        return None
    edits = common.edits
    report.add(PASS, name, f"{common.source}: {len(edits.device_nodes or ())} device nodes, "
               f"{len(edits.mounts or ())} mounts, {len(edits.hooks or ())} hooks")  # fmt: skip
    return common


def _check_toolkit_runtime(report: Report, config: Path) -> None:
    name = "toolkit runtime"
    try:
        data = tomllib.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        report.add(SKIP, name, f"{config} not found (NVIDIA Container Runtime not installed "
                   "here); the node's runtime must apply CDI specs (containerd enable_cdi)")  # fmt: skip
        return
    except (OSError, tomllib.TOMLDecodeError) as exc:
        report.add(WARN, name, f"cannot read {config}: {exc}")
        return
    section = data.get("nvidia-container-runtime")
    mode = section.get("mode", "auto") if isinstance(section, dict) else "auto"
    detail = {
        "cdi": "CDI mode: containers get exactly what the CDI specs say",
        "auto": "auto mode: CDI specs for CDI device requests, NVIDIA_VISIBLE_DEVICES otherwise",
        "legacy": "legacy mode: reacts to NVIDIA_VISIBLE_DEVICES (also set by our specs)",
    }.get(str(mode), f"mode {mode!r}")
    report.add(PASS, name, f"{config}: {detail}")


def _check_cdi_directory(report: Report, cdi_root: Path) -> bool:
    name = "cdi directory"
    try:
        cdi_root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cdi_root, prefix=".instaslice-check-"):
            pass
    except OSError as exc:
        report.add(FAIL, name, f"{cdi_root} is not writable: {exc}")
        return False
    report.add(PASS, name, f"{cdi_root} is writable")
    return True


def _smallest_free(backend: MigModeBackend, gpus: Sequence[GpuInfo]) -> InventoryDevice | None:
    """The smallest profile's first free placement on the lowest MIG-enabled, healthy GPU."""
    inventory = build_inventory(gpus)
    for gpu in inventory.gpus:
        profiles = {p.name: p for p in gpu.profiles}
        occupants = [
            Occupant(profile=profiles[i.profile], placement=i.placement)
            for i in backend.instances(gpu_index=gpu.index)
        ]
        candidates = sorted(
            (d for d in inventory.devices.values() if d.gpu_index == gpu.index),
            key=lambda d: (
                d.profile.memory_slices,
                d.profile.compute_slices,
                d.profile.media_extensions,
                d.placement.start,
            ),
        )
        for device in candidates:
            if refusal(profile=device.profile, start=device.placement.start,
                       occupants=occupants) is None:  # fmt: skip
                return device
    return None


def _create_one(
    report: Report,
    backend: MigModeBackend,
    gpus: Sequence[GpuInfo],
    settings: Settings,
    common: CommonEdits | None,
) -> None:
    name = "create one slice"
    try:
        device = _smallest_free(backend, gpus)
    except DriverError as exc:
        report.add(FAIL, name, f"cannot read existing MIG instances: {exc}")
        return
    if device is None:
        report.add(FAIL, name, "no MIG-enabled GPU has a free placement")
        return
    slices = SliceOperations(backend)
    claim_uid = SELF_CHECK_CLAIM_PREFIX + secrets.token_hex(4)
    emulated = settings.gpu_backend == "emulated"
    instance: MigInstance | None = None
    try:
        instance = slices.ensure(
            gpu_index=device.gpu_index,
            profile=device.profile.name,
            start=device.placement.start,
            adoptable=False,
        ).instance
        report.add(PASS, name, f"created {device.profile.name} at placement start "
                   f"{device.placement.start} on GPU {device.gpu_index} "
                   f"(GI {instance.gi_id}, CI {instance.ci_id}, {instance.mig_uuid})")  # fmt: skip
        _write_and_validate_spec(
            report,
            settings=settings,
            device=device,
            instance=instance,
            claim_uid=claim_uid,
            emulated=emulated,
            common=common,
        )
    except DriverError as exc:
        report.add(FAIL, name, f"{device.name}: {exc}")
    finally:
        _clean_up(report, slices, instance, settings.cdi_root, claim_uid)


def _write_and_validate_spec(
    report: Report,
    *,
    settings: Settings,
    device: InventoryDevice,
    instance: MigInstance,
    claim_uid: str,
    emulated: bool,
    common: CommonEdits | None,
) -> None:
    name = "slice cdi spec"
    if instance.mig_uuid is None:
        report.add(FAIL, name, "the new slice has no MIG UUID")
        return
    missing = [
        what
        for what, value in (
            ("GPU", device.gpu_minor),
            ("GPU-instance capability", instance.gi_cap_minor),
            ("compute-instance capability", instance.ci_cap_minor),
        )
        if value is None
    ]
    if missing and not emulated:
        report.add(FAIL, name, f"device minor unknown: {', '.join(missing)}")
        return
    spec = cdi.build_claim_spec(
        claim_uid=claim_uid,
        slices=[
            cdi.CdiSlice(
                device=device.name,
                mig_uuid=instance.mig_uuid,
                gpu_minor=device.gpu_minor or 0,
                gi_cap_minor=instance.gi_cap_minor or 0,
                ci_cap_minor=instance.ci_cap_minor or 0,
            )
        ],
        emulated=emulated,
        majors=None if emulated else cdi.read_device_majors(),
    )
    path = cdi.write_spec(settings.cdi_root, spec, claim_uid=claim_uid)
    written = cdi.read_spec(settings.cdi_root, claim_uid)
    if written != spec:
        report.add(FAIL, name, f"{path} does not read back as written")
        return
    ids = [
        cdi.claim_cdi_device_id(claim_uid, device.name),
        *(common.cdi_device_ids if common else ()),
    ]
    nodes = [n.path for n in written.devices[0].container_edits.device_nodes or ()]
    report.add(PASS, name, f"{path} valid; CDI ids {', '.join(ids)}; device nodes "
               f"{', '.join(nodes) or 'none (emulated)'}")  # fmt: skip


def _clean_up(
    report: Report,
    slices: SliceOperations,
    instance: MigInstance | None,
    cdi_root: Path,
    claim_uid: str,
) -> None:
    try:
        cdi.remove_spec(cdi_root, claim_uid)
    except DriverError as exc:
        report.add(FAIL, "clean up", f"cannot remove the check's CDI spec: {exc}")
    if instance is None:
        return
    try:
        slices.destroy_instance(instance)
    except DriverError as exc:
        report.add(FAIL, "destroy the slice", f"GI {instance.gi_id} on GPU "
                   f"{instance.gpu_index} stays: {exc}")  # fmt: skip
        return
    report.add(PASS, "destroy the slice", f"GI {instance.gi_id} on GPU {instance.gpu_index} "
               "destroyed, CDI spec removed")  # fmt: skip


def main(
    argv: Sequence[str], *, env: CheckEnvironment | None = None, out: TextIO | None = None
) -> int:
    """``check [--create-one] [plugin flags]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="instaslice-kubelet-plugin check",
        description="Node self-check before deploying InstaSlice; takes every plugin flag too.",
        add_help=False,
    )
    parser.add_argument("--create-one", action="store_true",
                        help="also create and destroy the smallest slice and validate its CDI spec")  # fmt: skip
    parser.add_argument("-h", "--help", action="store_true")
    known, rest = parser.parse_known_args(list(argv))
    stream = out or sys.stdout
    if known.help:
        parser.print_help(stream)
        print("\nPlugin flags (see instaslice-kubelet-plugin --help) apply as for the daemon.",
              file=stream)  # fmt: skip
        return 0
    environ = dict(os.environ)
    if not environ.get("INSTASLICE_NODE_NAME") and not environ.get("NODE_NAME"):
        environ["NODE_NAME"] = socket.gethostname()  # the check needs no Node, only a name
    settings = parse_settings(rest, environ=environ)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if env is None:
        env = CheckEnvironment(build_backend=build_backend, resolve_common=resolve_cdi_common)
    report = run_checks(settings, create_one=known.create_one, env=env)
    for result in report.results:
        print(result.line(), file=stream)
    verdict = "FAILED" if report.failed else "passed"
    print(f"self-check {verdict}: {sum(r.status == FAIL for r in report.results)} failed, "
          f"{sum(r.status == WARN for r in report.results)} warnings", file=stream)  # fmt: skip
    return 1 if report.failed else 0
