"""The plugin's DRA socket under malformed, duplicated, unknown and oversized calls: every claim asked
about gets an answer (an error for the bad ones), nothing is created for them, a good claim in the
same call is prepared once, and the socket keeps serving."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.ids import ClaimUid
from kubeletplugin.dra.claimrefs import MAX_UID_LENGTH, claim_ref_problem
from kubeletplugin.health.settings import XidPolicy
from kubeletplugin.model import ClaimRef
from protos.dra.v1 import api_pb2 as v1
from tests.kubeletplugin.harness import NodeHarness

UNKNOWN_UID = "00000000-0000-0000-0000-00000000dead"


@pytest.fixture
def node(node: NodeHarness) -> NodeHarness:
    """The node, its plugin without an XID watch: it restarts at once (these tests restart it
    often and inject no XID)."""
    node.xid_policy = XidPolicy(ignore_all=True)
    return node


def _raw_prepare(node: NodeHarness, claims: list[v1.Claim]) -> dict[str, str]:
    """NodePrepareResources with exactly these messages: claim UID -> error."""
    response = node.kubelet().v1.NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=claims), timeout=120
    )
    return {uid: result.error for uid, result in response.claims.items()}


@pytest.mark.parametrize(
    ("uid", "namespace", "name", "problem"),
    [
        ("", "default", "c", "uid"),
        ("u", "", "c", "namespace"),
        ("u", "default", "", "name"),
        ("u", "Default", "c", "namespace"),
        ("u", "default", "../../secrets/x", "name"),
        ("u", "default", "a/b", "name"),
        ("u", "kube system", "c", "namespace"),
        ("u", "default", "c" * 254, "name"),
        ("u\n", "default", "c", "uid"),
        ("u" * (MAX_UID_LENGTH + 1), "default", "c", "uid"),
    ],
    ids=[
        "no-uid", "no-namespace", "no-name", "upper-case-namespace", "path-in-name",
        "slash-in-name", "space-in-namespace", "name-too-long", "control-char-uid", "uid-too-long",
    ],
)  # fmt: skip
def test_malformed_claim_references_are_named(
    uid: str, namespace: str, name: str, problem: str
) -> None:
    message = claim_ref_problem(ClaimRef(uid=ClaimUid(uid), namespace=namespace, name=name))
    assert message is not None
    assert problem in message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=70), st.text(max_size=70), st.text(max_size=70))
def test_a_reference_is_either_well_formed_or_named_malformed(
    uid: str, namespace: str, name: str
) -> None:
    message = claim_ref_problem(ClaimRef(uid=ClaimUid(uid), namespace=namespace, name=name))
    if message is None:
        assert uid
        assert namespace
        assert name
        assert "/" not in namespace + name
        assert all(c.isprintable() for c in uid)


def test_malformed_and_unknown_claims_get_errors_and_the_good_one_is_prepared(
    node: NodeHarness,
) -> None:
    node.start_plugin()
    good = node.claim(["gpu-0-1g-5gb-0"])
    errors = _raw_prepare(
        node,
        [
            good.v1(),
            v1.Claim(uid="bad-1", namespace="default", name=""),
            v1.Claim(uid="bad-2", namespace="default", name="../../../api/v1/secrets"),
            v1.Claim(uid="", namespace="default", name="claim"),
            v1.Claim(uid=UNKNOWN_UID, namespace="default", name="no-such-claim"),
        ],
    )
    assert errors[good.uid] == ""
    assert "malformed claim reference" in errors["bad-1"]
    assert "malformed claim reference" in errors["bad-2"]
    assert "malformed claim reference" in errors[""]
    assert "not found" in errors[UNKNOWN_UID]
    assert len(node.instances()) == 1


def test_a_claim_repeated_in_one_call_is_prepared_once(node: NodeHarness) -> None:
    node.start_plugin()
    claim = node.claim(["gpu-0-1g-5gb-0", "gpu-1-2g-10gb-0"])
    errors = _raw_prepare(node, [claim.v1()] * 500)
    assert errors == {claim.uid: ""}
    assert len(node.instances()) == 2
    assert len(node.cdi_files()) == 1


def test_the_same_uid_under_two_names_prepares_only_the_real_claim(node: NodeHarness) -> None:
    node.start_plugin()
    claim = node.claim(["gpu-0-1g-5gb-0"])
    impostor = v1.Claim(uid=claim.uid, namespace=claim.namespace, name="someone-else")
    errors = _raw_prepare(node, [claim.v1(), impostor])
    # one entry per UID: whichever of the two was taken, nothing but the real claim's slice exists
    assert set(errors) == {claim.uid}
    assert len(node.instances()) <= 1
    node.kubelet().unprepare([claim])
    assert node.instances() == []


def test_thousands_of_unknown_claims_in_one_call_are_all_answered(node: NodeHarness) -> None:
    node.start_plugin()
    good = node.claim(["gpu-0-1g-5gb-0"])
    unknown = [
        v1.Claim(uid=f"{i:08d}-0000-0000-0000-000000000000", namespace="default", name=f"c-{i}")
        for i in range(2000)
    ]
    errors = _raw_prepare(node, [*unknown, good.v1()])
    assert len(errors) == 2001
    assert errors[good.uid] == ""
    assert all("not found" in errors[c.uid] for c in unknown)
    assert len(node.instances()) == 1
    # and the other way: unprepare of all of them (nothing to do for the unknown ones)
    response = node.kubelet().v1.NodeUnprepareResources(
        v1.NodeUnprepareResourcesRequest(claims=[*unknown, good.v1()]), timeout=120
    )
    assert {uid: r.error for uid, r in response.claims.items()} == {
        c.uid: "" for c in [*unknown, good.v1()]
    }
    assert node.instances() == []


def test_a_call_over_the_message_limit_is_refused_and_the_socket_keeps_serving(
    node: NodeHarness,
) -> None:
    node.start_plugin()
    kubelet = node.kubelet()
    huge = [v1.Claim(uid="u" * 60, namespace="default", name="n" * 200) for _ in range(20_000)]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.v1.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=huge), timeout=60)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    claim = node.claim(["gpu-0-1g-5gb-0"])
    assert kubelet.prepare([claim])[claim.uid].error == ""


def test_garbage_bytes_on_the_socket_do_not_stop_it(node: NodeHarness) -> None:
    plugin = node.start_plugin()
    channel = grpc.insecure_channel(f"unix://{plugin.dra_socket}")
    try:
        garbage = channel.unary_unary(
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as broken:
            garbage(b"\xff\xff\xff\xff\x0f garbage", timeout=10)
        assert broken.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    finally:
        channel.close()
    claim = node.claim(["gpu-0-1g-5gb-0"])
    assert node.kubelet().prepare([claim])[claim.uid].error == ""
