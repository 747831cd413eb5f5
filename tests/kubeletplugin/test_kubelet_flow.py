"""The kubelet's calls over real unix sockets: discovery, prepare, unprepare, per-claim refusals."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request

import pytest

from api.names import CDI_KIND, DRIVER_NAME
from driver.cluster.port import RESOURCE_SLICES
from kubeletplugin.dra.registration import SUPPORTED_SERVICES
from tests.kubeletplugin.harness import Answer, ClaimHandle, NodeHarness

MIG_CONFIG = {"apiVersion": "mig.instaslice.dev/v1alpha1", "kind": "MigDeviceConfig"}


def cdi_id(claim: ClaimHandle, device: str) -> str:
    return f"{CDI_KIND}={claim.uid}-{device}"


def expected(claim: ClaimHandle, node: NodeHarness, *devices: str, request: str = "gpu") -> Answer:
    return Answer(
        devices=tuple(((request,), node.node, d, (cdi_id(claim, d),)) for d in devices), error=""
    )


def test_registration_names_the_dra_socket_and_both_services(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    assert kubelet.info.endpoint == str(plugin.dra_socket)
    assert list(kubelet.info.supported_versions) == list(SUPPORTED_SERVICES)
    assert list(SUPPORTED_SERVICES) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
    ]
    assert plugin.tracker.state.registered is True


def _published(node: NodeHarness) -> list[str]:
    slices = node.api.list_objects(RESOURCE_SLICES, field_selector=f"spec.nodeName={node.node}")
    return [str(obj["metadata"]["name"]) for obj in slices.items]


def test_slices_are_published_once_the_kubelet_registered_the_plugin(node: NodeHarness) -> None:
    # a device published before the kubelet can call us could be allocated and its pod bound,
    # and the kubelet would fail that pod's prepare ("not registered") and retry a minute later
    started = threading.Thread(target=lambda: node.start_plugin(registration_wait_seconds=30))
    started.start()
    deadline = time.monotonic() + 10
    while not list(node.registry_dir.glob("*-reg.sock")) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the plugin is serving and waiting: nothing published yet
    assert _published(node) == []
    node.kubelet()
    started.join(timeout=10)
    assert not started.is_alive()
    assert _published(node)


def test_without_a_kubelet_the_slices_are_published_after_the_wait_with_a_warning(
    node: NodeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kubeletplugin.plugin"):
        node.start_plugin(registration_wait_seconds=0.2)
    assert _published(node)
    assert "has not registered the plugin within" in caplog.text


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_empty_request_is_answered(node: NodeHarness, version: str) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    assert kubelet.prepare([], version=version) == {}
    assert kubelet.unprepare([], version=version) == {}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_creates_the_allocated_slice_and_unprepare_destroys_it(
    node: NodeHarness, version: str
) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-1-2g-10gb-4"])
    assert kubelet.prepare([claim], version=version) == {
        claim.uid: expected(claim, node, "gpu-1-2g-10gb-4")
    }
    assert node.instances() == [(1, "2g.10gb", 4, 1)]
    assert len(node.cdi_files()) == 1
    assert kubelet.unprepare([claim], version=version) == {claim.uid: ""}
    assert node.instances() == []
    assert node.cdi_files() == []


def test_two_claims_on_different_gpus_prepare_concurrently(node: NodeHarness) -> None:
    both_in_flight = threading.Barrier(2, timeout=10)

    def meet(step: str) -> None:
        if step == "after-started":
            both_in_flight.wait()  # breaks (per-claim error) if the claims ran one after the other

    node.start_plugin(step_hook=meet)
    kubelet = node.kubelet()
    first = node.claim(["gpu-0-3g-20gb-0"])
    second = node.claim(["gpu-1-3g-20gb-4"])
    answers = kubelet.prepare([first, second])
    assert answers == {
        first.uid: expected(first, node, "gpu-0-3g-20gb-0"),
        second.uid: expected(second, node, "gpu-1-3g-20gb-4"),
    }
    assert sorted(node.instances()) == [(0, "3g.20gb", 0, 1), (1, "3g.20gb", 4, 1)]


def test_many_claims_on_one_gpu_each_get_their_own_placement(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claims = [node.claim([f"gpu-0-1g-5gb-{start}"]) for start in range(7)]
    answers = kubelet.prepare(claims)
    assert all(
        answers[c.uid] == expected(c, node, f"gpu-0-1g-5gb-{i}") for i, c in enumerate(claims)
    )
    assert sorted(s for _, _, s, _ in node.instances()) == list(range(7))


def test_repeat_prepare_gives_the_same_answer_and_no_second_slice(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-1g-5gb-2"])
    first = kubelet.prepare([claim])
    instances = node.instances()
    assert kubelet.prepare([claim]) == first
    assert kubelet.prepare([claim, claim]) == first
    assert node.instances() == instances


def test_new_allocation_under_the_same_uid_replaces_the_old_slice(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-1g-5gb-2"])
    kubelet.prepare([claim])
    node.reallocate(claim, ["gpu-1-2g-10gb-0"])
    assert kubelet.prepare([claim]) == {claim.uid: expected(claim, node, "gpu-1-2g-10gb-0")}
    assert node.instances() == [(1, "2g.10gb", 0, 1)]


def test_prepare_logs_carry_claim_and_pod_ids(
    node: NodeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    node.start_plugin()
    claim = node.claim(["gpu-0-1g-5gb-5"])
    node.reserve_for_pod(claim, pod="trainer-0", uid="1c0ffee0-pod")
    with caplog.at_level(logging.INFO, logger="kubeletplugin.state.devicestate"):
        assert node.kubelet().prepare([claim])[claim.uid].error == ""
    (record,) = [r for r in caplog.records if r.getMessage().startswith("prepared claim")]
    assert record.__dict__["claim_uid"] == claim.uid
    assert record.__dict__["pod"] == "trainer-0"
    assert record.__dict__["pod_uid"] == "1c0ffee0-pod"


def test_claim_with_only_other_drivers_devices_prepares_to_nothing(node: NodeHarness) -> None:
    node.start_plugin()
    claim = node.claim(["nic-0"], driver="net.example.com", pool="fabric")
    assert node.kubelet().prepare([claim]) == {claim.uid: Answer(devices=(), error="")}
    assert node.instances() == []
    assert node.cdi_files() == []


def test_unprepare_twice_and_unknown_claims_are_fine(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-1g-5gb-0"])
    kubelet.prepare([claim])
    unknown = ClaimHandle(uid="0b6c3c1e-unknown", namespace="default", name="never-was")
    assert kubelet.unprepare([claim, unknown]) == {claim.uid: "", unknown.uid: ""}
    assert kubelet.unprepare([claim]) == {claim.uid: ""}
    assert node.instances() == []


def test_claim_deleted_before_unprepare_is_still_cleaned_up(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(["gpu-0-4g-20gb-0"])
    kubelet.prepare([claim])
    node.delete_claim(claim)
    assert kubelet.unprepare([claim]) == {claim.uid: ""}
    assert node.instances() == []
    assert node.cdi_files() == []


def node_claim_other_node(node: NodeHarness) -> ClaimHandle:
    return node.claim(["gpu-0-1g-5gb-0"], node="node-b")


def _replaced(node: NodeHarness) -> ClaimHandle:
    old = node.claim(["gpu-0-1g-5gb-0"], name="reused")
    node.delete_claim(old)
    node.claim(["gpu-0-1g-5gb-0"], name="reused")
    return old


@pytest.mark.parametrize(
    ("make_claim", "message"),
    [
        (node_claim_other_node, "allocated to node node-b"),
        (lambda n: n.claim(["gpu-0-1g-5gb-0"], pool="node-b", node="node-a"), "pool node-b"),
        (lambda n: n.claim(["gpu-0-1g-5gb-0"], allocate=False), "not allocated"),
        (
            lambda n: ClaimHandle(uid="9d5a0ac4-missing", namespace="default", name="missing"),
            "not found",
        ),
        (_replaced, "was replaced"),
        (lambda n: n.claim(["gpu-7-1g-5gb-0"]), "not in this node's inventory"),
    ],
    ids=["other-node", "other-pool", "unallocated", "missing", "uid-replaced", "unknown-device"],
)
def test_claims_that_are_not_ours_to_prepare_get_a_per_claim_error(
    node: NodeHarness, make_claim: object, message: str
) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    good = node.claim(["gpu-1-1g-5gb-6"])
    bad = make_claim(node)  # type: ignore[operator]
    answers = kubelet.prepare([bad, good])
    assert message in answers[bad.uid].error
    assert answers[bad.uid].devices == ()
    assert answers[good.uid] == expected(good, node, "gpu-1-1g-5gb-6")
    assert node.instances() == [(1, "1g.5gb", 6, 1)]


def test_bad_opaque_config_is_a_per_claim_error_naming_the_field(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    claim = node.claim(
        ["gpu-0-1g-5gb-0"],
        allocation_config=[
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER_NAME, "parameters": {**MIG_CONFIG, "sharing": "mps"}},
            }
        ],
    )
    answer = kubelet.prepare([claim])[claim.uid]
    assert "sharing" in answer.error
    assert "unknown field" in answer.error
    assert node.instances() == []
    assert node.cdi_files() == []


def test_opaque_config_env_reaches_the_cdi_spec_claim_over_class(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()

    def entry(source: str, env: dict[str, str]) -> dict[str, object]:
        return {
            "source": source,
            "requests": [],
            "opaque": {"driver": DRIVER_NAME, "parameters": {**MIG_CONFIG, "env": env}},
        }

    claim = node.claim(
        ["gpu-0-1g-5gb-0"],
        allocation_config=[
            entry("FromClaim", {"MODE": "claim"}),
            entry("FromClass", {"MODE": "class", "CLASS_ONLY": "yes"}),
            {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {}}},
        ],
    )
    assert kubelet.prepare([claim])[claim.uid].error == ""
    (spec_file,) = node.cdi_files()
    env = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["env"]
    assert "MODE=claim" in env
    assert "CLASS_ONLY=yes" in env


def test_three_slice_claim_makes_every_slice_visible_whatever_cdi_order(node: NodeHarness) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    devices = ["gpu-0-1g-5gb-0", "gpu-0-2g-10gb-2", "gpu-1-1g-5gb-6"]
    claim = node.claim(devices)
    answer = kubelet.prepare([claim])[claim.uid]
    assert answer == expected(claim, node, *devices)
    (spec_file,) = node.cdi_files()
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == CDI_KIND
    by_name = {d["name"]: d for d in spec["devices"]}
    cdi_names = [ids[0].split("=", 1)[1] for _, _, _, ids in answer.devices]
    assert sorted(by_name) == sorted(cdi_names)
    mig_uuids = set()
    for cdi_device in by_name.values():
        mig_uuids |= {
            e.split("=", 1)[1]
            for e in cdi_device["containerEdits"]["env"]
            if e.startswith("INSTASLICE_MIG_UUID_")
        }
    assert len(mig_uuids) == 3
    for order in (cdi_names, cdi_names[::-1], cdi_names[1:] + cdi_names[:1]):
        container_env: dict[str, str] = {}
        for name in order:  # the runtime applies devices in some order; the last value wins
            for entry in by_name[name]["containerEdits"]["env"]:
                key, _, value = entry.partition("=")
                container_env[key] = value
        assert set(container_env["NVIDIA_VISIBLE_DEVICES"].split(",")) == mig_uuids


def test_claim_overlapping_a_prepared_claim_is_refused(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    blocker = node.claim(["gpu-0-4g-20gb-0"])
    kubelet.prepare([blocker])
    claim = node.claim(["gpu-1-1g-5gb-0", "gpu-0-1g-5gb-1"])  # a stale allocation
    answer = kubelet.prepare([claim])[claim.uid]
    assert f"overlaps gpu-0-4g-20gb-0 of claim default/{blocker.name}" in answer.error
    assert node.instances() == [(0, "4g.20gb", 0, 1)]
    assert len(node.cdi_files()) == 1
    assert claim.uid not in plugin.state.prepared()


def test_failed_slice_creation_rolls_back_what_the_claim_created(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    kubelet = node.kubelet()
    outsider = node.backend()  # someone else's instance, created after the plugin started
    outsider.create_slice(gpu_index=0, profile="4g.20gb", start=0)
    outsider.close()
    claim = node.claim(["gpu-1-1g-5gb-0", "gpu-0-1g-5gb-1"])
    answer = kubelet.prepare([claim])[claim.uid]
    assert "GPU 0" in answer.error
    assert node.instances() == [(0, "4g.20gb", 0, 1)]
    assert node.cdi_files() == []
    assert claim.uid not in plugin.state.prepared()


def test_health_and_metrics_endpoints(node: NodeHarness) -> None:
    plugin = node.start_plugin(http=True)
    kubelet = node.kubelet()
    claim = node.claim(["gpu-1-7g-40gb-0"])
    kubelet.prepare([claim])
    health_port = plugin.endpoint_port("healthz")
    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=5) as resp:
        assert resp.status == 200
        body = resp.read().decode()
    assert "registration socket answers GetInfo" in body
    assert "DRA socket answers NodePrepareResources" in body
    metrics_port = plugin.endpoint_port("metrics")
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert 'instaslice_kubelet_plugin_slices_in_use{gpu="1",profile="7g.40gb"} 1.0' in text
    assert (
        'instaslice_kubelet_plugin_claim_operations_total{operation="prepare",result="ok"} 1.0'
        in text
    )
    assert 'instaslice_kubelet_plugin_rpc_seconds_count{method="NodePrepareResources"}' in text


def test_health_fails_when_a_socket_is_gone_or_registration_failed(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    assert plugin.health.check().ok
    plugin.tracker.record(registered=False, error="version mismatch")
    report = plugin.health.check()
    assert not report.ok
    assert any("version mismatch" in line for line in report.checks)
    plugin.tracker.record(registered=True, error="")
    plugin.dra_socket.unlink()
    assert not plugin.health.check().ok


def test_stop_removes_both_sockets_and_a_restart_replaces_stale_ones(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    dra, registration = plugin.dra_socket, plugin.registration_socket
    assert dra.is_socket()
    assert registration.is_socket()
    assert oct(dra.stat().st_mode & 0o777) == "0o600"
    assert oct(node.state_dir.stat().st_mode & 0o777) == "0o700"
    node.stop_plugin(plugin)
    assert not dra.exists()
    assert not registration.exists()
    dra.write_bytes(b"")  # a stale file where the socket goes
    node.start_plugin()
    assert dra.is_socket()
    assert node.kubelet().prepare([]) == {}
