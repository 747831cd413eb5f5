"""``instaslice status`` against a real (local) API server over HTTP."""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.checkpoint import Checkpoint, PreparedClaim, PreparedDevice, PrepareState
from driver.checkpoint import CheckpointStore
from driver.cluster.kube import KubeClusterApi, connect
from driver.cluster.port import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from instaslice import cli
from localcluster.apiserver import LocalApiServer
from tests.cli.objects import claim, pod, pool

MIG_UUID = "MIG-11111111-2222-3333-4444-555555555555"


@pytest.fixture
def api(apiserver: LocalApiServer) -> Iterator[KubeClusterApi]:
    with connect(url=apiserver.url) as client:
        yield client


def _create_claim(api: KubeClusterApi, wanted: dict[str, object]) -> dict[str, object]:
    body = copy.deepcopy(wanted)
    status = body.pop("status")
    body["metadata"].pop("uid")  # type: ignore[attr-defined]
    body["spec"] = {
        "devices": {
            "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.instaslice.dev"}}]
        }
    }
    created = api.create(RESOURCE_CLAIMS, body)
    status["allocation"]["allocationTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    return api.update_status(RESOURCE_CLAIMS, {**created, "status": status})


def _populate(api: KubeClusterApi) -> dict[str, object]:
    for obj in pool("node-0") + pool("node-1"):
        api.create(RESOURCE_SLICES, obj)
    app = pod("app", namespace="default", phase="Pending")
    app["metadata"].pop("uid")
    app = api.create(PODS, app)
    placed = claim("app-mig", "gpu-1-3g-20gb-4", node="node-1", namespace="default",
                   reserved_for=[("app", app["metadata"]["uid"])])  # fmt: skip
    return _create_claim(api, placed)


def test_status_prints_the_slice_map_of_the_cluster(
    api: KubeClusterApi, apiserver: LocalApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    _populate(api)
    assert cli.main(["status", "--kube-api-url", apiserver.url, "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out
    assert out.count("GPU-node-") == 4
    assert "node-1  GPU 1  NVIDIA A100-SXM4-40GB  GPU-node-1-1" in out
    assert "memory [____ AAAA]  4/8 memory slices taken, 1 MIG slice" in out
    row = next(line for line in out.splitlines() if line.startswith("| A "))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "A", "4", "4", "3g.20gb", "dra", "default/app-mig", "default/app", "Pending", "-",
    ]  # fmt: skip


def test_status_reads_mig_uuids_from_checkpoints_and_filters_nodes(
    api: KubeClusterApi,
    apiserver: LocalApiServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    allocated = _populate(api)
    uid = str(allocated["metadata"]["uid"])  # type: ignore[index]
    checkpoint = tmp_path / "checkpoint.json"
    CheckpointStore(checkpoint).save(
        Checkpoint(
            node_name="node-1",
            claims={
                uid: PreparedClaim(
                    uid=uid,
                    namespace="default",
                    name="app-mig",
                    state=PrepareState.PREPARE_COMPLETED,
                    devices=(
                        PreparedDevice(
                            request_names=("mig",),
                            pool="node-1",
                            device="gpu-1-3g-20gb-4",
                            gpu_index=1,
                            gpu_uuid="GPU-node-1-1",
                            profile="3g.20gb",
                            placement_start=4,
                            placement_size=4,
                            gi_id=2,
                            ci_id=0,
                            mig_uuid=MIG_UUID,
                            cdi_device_ids=("instaslice.dev/mig=x",),
                        ),
                    ),
                )
            },
        )
    )
    argv = ["status", "--kube-api-url", apiserver.url, "--node", "node-1", "--no-color"]
    assert cli.main([*argv, "--checkpoint", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "node-0" not in out
    assert out.count("GPU-node-1-") == 2
    assert MIG_UUID in out


def test_status_watch_redraws_until_interrupted(
    api: KubeClusterApi, apiserver: LocalApiServer
) -> None:
    _populate(api)
    args = cli.build_parser().parse_args(
        ["status", "--kube-api-url", apiserver.url, "--watch", "0.5", "--no-color"]
    )
    out = io.StringIO()
    draws: list[float] = []

    def sleep(seconds: float) -> None:
        draws.append(seconds)
        if len(draws) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cli.run_status(args, out=out, sleep=sleep)
    assert draws == [0.5, 0.5, 0.5]
    assert out.getvalue().count("node-1  GPU 1") == 3


def test_status_says_why_when_the_cluster_cannot_be_reached(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["status", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert "instaslice status:" in capsys.readouterr().err
