"""Backend factories for the GPU-backend contract suite, and the rule for ``gpu``-marked tests.

Every factory builds a ``Harness``: the backend under test plus the few controls a test needs that
the ``GpuBackend`` protocol itself does not offer (make the next compute-instance creation fail;
make a GPU unhealthy or healthy again; open a second backend on the same GPUs, as a restarted or
second plugin process would).

``gpu``-marked tests talk to the real NVML read-only; they are skipped unless NVML initialises
(``make check-nvml`` selects only them on a GPU host).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from driver.errors import DriverError
from driver.gpu import nvml_api
from driver.gpu.backend import GpuBackend
from driver.gpu.emulated import EmulatedGpuBackend
from driver.gpu.fake_nvml import FakeNvml
from driver.gpu.nvml import NvmlGpuBackend

DEFAULT_SPEC = "A100-40GB,H100-80GB"


class InjectedFaultError(Exception):
    """What the emulated backend's fault hook raises in these tests."""


@dataclass
class Harness:
    backend: GpuBackend
    fail_next_ci: Callable[[], None]
    set_health: Callable[[int, bool], None]
    """``set_health(gpu_index, healthy)``: emulated marks; NVML over the fake, rows pending."""
    reopen: Callable[[], GpuBackend] | None
    """A second backend over the same GPUs (``None`` where state dies with the backend)."""
    opened: list[GpuBackend] = field(default_factory=list)
    inject_xid: Callable[[int, int], object] | None = None
    """``inject_xid(gpu_index, xid)``: the GPU reports an XID critical error."""

    def another(self) -> GpuBackend:
        if self.reopen is None:
            pytest.skip("this backend's state does not outlive it")
        backend = self.reopen()
        self.opened.append(backend)
        return backend


Factory = Callable[[str], Harness]


def _emulated(tmp_path: Path, *, file_backed: bool) -> Factory:
    def build(spec: str) -> Harness:
        failing: list[str] = []

        def hook(step: str) -> None:
            if step in failing:
                failing.remove(step)
                raise InjectedFaultError(f"injected failure at {step}")

        state = tmp_path / "state" / "gpus.json" if file_backed else None

        def reopen() -> GpuBackend:
            return EmulatedGpuBackend(node_name="node-a", spec=spec, state_file=state)

        backend = EmulatedGpuBackend(
            node_name="node-a", spec=spec, state_file=state, fault_hook=hook
        )

        def set_health(index: int, healthy: bool) -> None:
            backend.set_health(index, healthy=healthy, reason="injected: XID 79")

        harness = Harness(
            backend=backend,
            fail_next_ci=lambda: failing.append("ci"),
            set_health=set_health,
            reopen=reopen if file_backed else None,
            inject_xid=backend.inject_xid,
        )
        harness.opened.append(backend)
        return harness

    return build


def _nvml_over_fake(spec: str) -> Harness:
    fake = FakeNvml(gpus=spec, node_name="node-a")
    backend = NvmlGpuBackend(nvml=fake)
    harness = Harness(
        backend=backend,
        fail_next_ci=lambda: fake.fail(
            "nvmlGpuInstanceCreateComputeInstance",
            code=nvml_api.NVML_ERROR_INSUFFICIENT_RESOURCES,
        ),
        set_health=lambda index, healthy: fake.set_remapped_rows(
            index, pending=not healthy, failure=False
        ),
        reopen=lambda: NvmlGpuBackend(nvml=fake),
        inject_xid=fake.inject_xid,
    )
    harness.opened.append(backend)
    return harness


FACTORY_IDS = ["emulated-memory", "emulated-file", "nvml-fake"]


@pytest.fixture(params=FACTORY_IDS)
def make_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Builds harnesses of one backend kind; closes every backend they opened afterwards."""
    built: list[Harness] = []
    kind: str = request.param

    def factory(spec: str = DEFAULT_SPEC) -> Harness:
        if kind == "nvml-fake":
            harness = _nvml_over_fake(spec)
        else:
            harness = _emulated(tmp_path, file_backed=kind == "emulated-file")(spec)
        built.append(harness)
        return harness

    yield factory
    for harness in built:
        for backend in harness.opened:
            backend.close()


@pytest.fixture
def harness(make_harness: Factory) -> Harness:
    return make_harness(DEFAULT_SPEC)


@pytest.fixture(params=[*FACTORY_IDS, pytest.param("nvml-real", marks=pytest.mark.gpu)])
def discovery_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GpuBackend]:
    """Backends for read-only checks, including the real NVML on a GPU host (discovery only)."""
    kind: str = request.param
    if kind == "nvml-real":
        backend: GpuBackend = NvmlGpuBackend()
    elif kind == "nvml-fake":
        backend = NvmlGpuBackend(nvml=FakeNvml(gpus=DEFAULT_SPEC))
    else:
        state = tmp_path / "gpus.json" if kind == "emulated-file" else None
        backend = EmulatedGpuBackend(node_name="node-a", spec=DEFAULT_SPEC, state_file=state)
    yield backend
    backend.close()


_nvml_unavailable: list[str] = []


def _why_no_nvml() -> str | None:
    """``None`` if the real NVML initialises here, else why not (probed once per session)."""
    if not _nvml_unavailable:
        try:
            NvmlGpuBackend().close()
            _nvml_unavailable.append("")
        except DriverError as exc:
            _nvml_unavailable.append(f"NVML unavailable: {exc}")
    return _nvml_unavailable[0] or None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = _why_no_nvml()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
