"""The shim's pure parts: resource names, advertised counts, choosing a reservation, planning moves."""

from __future__ import annotations

import logging

import pytest

from api.names import classic_resource_name
from driver.errors import ConfigError
from driver.ids import ClaimUid, GpuUuid, PodUid
from driver.mig.catalog import CATALOG
from driver.resourceslices import GpuInventory
from kubeletplugin.deviceplugin.advertise import (
    advertised_counts,
    device_ids,
    per_gpu_capacity,
    unknown_ids,
)
from kubeletplugin.deviceplugin.allocate import NoReservationError, Reservation, choose
from kubeletplugin.deviceplugin.moves import Need, plan_moves
from kubeletplugin.deviceplugin.podresources import ContainerKey, Holdings, holdings_from_response
from kubeletplugin.deviceplugin.resources import check_prefix, resource_spec, resource_specs
from kubeletplugin.deviceplugin.shadow import ShadowClaim, Slot
from kubeletplugin.node.inventory import NodeInventory
from protos.podresources.v1 import api_pb2 as pr


@pytest.mark.parametrize(
    ("profile", "resource", "socket", "first_id"),
    [
        ("1g.5gb", "nvidia.com/mig-1g.5gb", "instaslice-1g-5gb.sock", "1g-5gb-0"),
        ("1g.5gb+me", "nvidia.com/mig-1g.5gb-me", "instaslice-1g-5gb-me.sock", "1g-5gb-me-0"),
        ("7g.141gb", "nvidia.com/mig-7g.141gb", "instaslice-7g-141gb.sock", "7g-141gb-0"),
        (
            "1g.23gb+me.all",
            "nvidia.com/mig-1g.23gb-me.all",
            "instaslice-1g-23gb-me-all.sock",
            "1g-23gb-me-all-0",
        ),
    ],
    ids=["plain", "media-extensions", "large", "nvml-variant"],
)
def test_profile_to_resource_socket_and_ids(
    profile: str, resource: str, socket: str, first_id: str
) -> None:
    spec = resource_spec(profile)
    assert (spec.resource_name, spec.socket_name) == (resource, socket)
    assert device_ids(spec, 1) == (first_id,)
    assert spec.resource_name == classic_resource_name(profile)  # what the webhook reads


def test_two_profiles_mapping_to_one_resource_serve_only_the_first() -> None:
    specs = resource_specs(["1g.24gb-me", "1g.24gb+me", "1g.24gb"])
    assert [s.profile for s in specs] == ["1g.24gb", "1g.24gb+me"]


@pytest.mark.parametrize(
    "prefix", ["nvidia.com", "/mig-", "Nvidia.com/mig-", "nvidia.com/-mig", "nvidia.com/m+g"]
)
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ConfigError):
        check_prefix(prefix)


def test_custom_prefix() -> None:
    assert resource_spec("2g.10gb", prefix="example.com/slice-").resource_name == (
        "example.com/slice-2g.10gb"
    )


@pytest.mark.parametrize(
    ("model", "profile", "capacity"),
    [
        ("A100-40GB", "1g.5gb", 7),
        ("A100-40GB", "2g.10gb", 3),
        ("A100-40GB", "3g.20gb", 2),
        ("A100-40GB", "4g.20gb", 1),
        ("A100-40GB", "7g.40gb", 1),
        ("A100-40GB", "1g.5gb+me", 1),
        ("A100-40GB", "1g.10gb", 4),
        ("A30-24GB", "1g.6gb", 4),
        ("A30-24GB", "2g.12gb", 2),
    ],
    ids=str,
)
def test_per_gpu_capacity(model: str, profile: str, capacity: int) -> None:
    assert per_gpu_capacity(CATALOG[model].profile(profile)) == capacity


def test_advertised_counts_sum_over_mig_gpus() -> None:
    a100, a30 = CATALOG["A100-40GB"], CATALOG["A30-24GB"]
    gpus = tuple(
        GpuInventory(
            index=i,
            uuid=GpuUuid(f"GPU-{i}"),
            product_name=m.product_name,
            memory_slices=m.memory_slices,
            profiles=m.profiles,
        )
        for i, m in enumerate([a100, a100, a30])
    )
    counts = advertised_counts(NodeInventory(gpus=gpus))
    assert counts["1g.5gb"] == 14
    assert counts["1g.6gb"] == 4
    assert counts["7g.40gb"] == 2


def test_unknown_ids() -> None:
    spec = resource_spec("1g.5gb")
    assert unknown_ids(spec, 7, ["1g-5gb-0", "1g-5gb-6", "1g-5gb-7", "1g-5gb-01", "2g-10gb-0"]) == [
        "1g-5gb-7",
        "1g-5gb-01",
        "2g-10gb-0",
    ]


# -- choosing a reservation ----------------------------------------------------------------


def slot(pod: str, container: str = "main", namespace: str = "ns") -> Slot:
    return Slot(
        namespace=namespace, pod_uid=PodUid(f"uid-{pod}"), pod_name=pod, container=container
    )


def shadow(
    name: str, owner: Slot | None, devices: int = 1, *, created: str = "", profile: str = "1g.5gb"
) -> ShadowClaim:
    return ShadowClaim(
        uid=ClaimUid(f"uid-{name}"),
        namespace=owner.namespace if owner else "ns",
        name=name,
        created=created or name,
        slot=owner,
        profile=profile,
        devices=tuple(f"{name}-d{i}" for i in range(devices)),
        deleting=False,
        obj={},
    )


def reservation(*claims: ShadowClaim) -> Reservation:
    assert claims[0].slot is not None
    return Reservation(slot=claims[0].slot, claims=claims)


R = "nvidia.com/mig-1g.5gb"


def listing(*containers: tuple[Slot, tuple[str, ...]]) -> Holdings:
    keys = [ContainerKey(s.namespace, s.pod_name, s.container) for s, _ in containers]
    holders = {(R, i): k for k, (_, ids) in zip(keys, containers, strict=True) for i in ids}
    return Holdings(containers=tuple(keys), holders=holders)


def test_choose_prefers_a_listed_container_without_devices_over_an_older_reservation() -> None:
    old = reservation(shadow("a", slot("a"), created="1"))
    new = reservation(shadow("b", slot("b"), created="2"))
    held = listing((slot("b"), ()))
    assert choose([old, new], count=1, resource=R, node_name="n", holdings=held) is new
    assert choose([old, new], count=1, resource=R, node_name="n", holdings=None) is old
    both = listing((slot("a"), ()), (slot("b"), ()))
    assert choose([old, new], count=1, resource=R, node_name="n", holdings=both) is old
    a_has_its_devices = listing((slot("a"), ("x",)), (slot("b"), ()))
    assert choose([old, new], count=1, resource=R, node_name="n", holdings=a_has_its_devices) is new


def test_choose_takes_the_reservation_of_the_one_pod_being_admitted_in_its_namespace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Same pod name in two namespaces; team-a's reservation is older. The kubelet admits team-b's
    # pod (listed, without devices): its containers get its reservations, in listed order.
    other = reservation(shadow("a", slot("web", namespace="team-a"), created="1"))
    main = reservation(shadow("bm", slot("web", namespace="team-b"), created="3"))
    side = reservation(shadow("bs", slot("web", "side", namespace="team-b"), created="2"))
    web_b, side_b = slot("web", namespace="team-b"), slot("web", "side", namespace="team-b")
    fitting = [other, side, main]
    caplog.set_level(logging.INFO, logger="kubeletplugin.deviceplugin.allocate")
    admitting = listing((web_b, ()), (side_b, ()))
    assert choose(fitting, count=1, resource=R, node_name="n", holdings=admitting) is main
    main_done = listing((web_b, ("x",)), (side_b, ()))
    assert choose(fitting, count=1, resource=R, node_name="n", holdings=main_done) is side
    assert "cannot tell" not in caplog.text


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        ((), "lists no container with a reservation of it still lacking devices"),
        (("a", "b"), "lists several pods waiting for it: ns/a, ns/b"),
    ],
    ids=["none-listed", "several-listed"],
)
def test_choose_logs_when_it_cannot_tell_which_pod_asks(
    caplog: pytest.LogCaptureFixture, listed: tuple[str, ...], why: str
) -> None:
    old = reservation(shadow("a", slot("a"), created="1"))
    new = reservation(shadow("b", slot("b"), created="2"))
    caplog.set_level(logging.INFO, logger="kubeletplugin.deviceplugin.allocate")
    held = listing(*((slot(p), ()) for p in listed))
    assert choose([old, new], count=1, resource=R, node_name="n", holdings=held) is old
    assert f"cannot tell which pod asks (pod-resources {why})" in caplog.text


def test_choose_matches_the_whole_count_with_one_containers_claims() -> None:
    three_claims = reservation(*(shadow(f"t{i}", slot("t")) for i in range(3)))
    one_claim = reservation(shadow("c", slot("c"), devices=3, created="0"))
    single = reservation(shadow("s", slot("s"), created="0"))
    assert choose([three_claims, single], count=3, resource=R, node_name="n", holdings=None) is (
        three_claims
    )
    assert choose([three_claims, one_claim], count=3, resource=R, node_name="n", holdings=None) is (
        one_claim
    )
    with pytest.raises(
        NoReservationError, match=r"no reservation for 2 x nvidia.com/mig-1g.5gb on node n"
    ):
        choose([three_claims, single], count=2, resource=R, node_name="n", holdings=None)


# -- planning moves --------------------------------------------------------------------------


def needs(table: dict[Slot, int]) -> Need:
    return lambda s, profile: table.get(s, 0)


def test_crossed_pods_swap_without_spares() -> None:
    a, b = slot("a"), slot("b")
    ca, cb = shadow("ca", a), shadow("cb", b)
    plan = plan_moves(
        claims=[ca, cb], held={ca.uid: b, cb.uid: a}, spare=lambda c: True, need=needs({a: 1, b: 1})
    )
    assert [(s.holder.claim.name, s.holder.to, s.spare) for s in plan.swaps] == [
        ("ca", b, None),
        ("cb", a, None),
    ]


def test_the_loser_gets_the_holders_unused_reservation() -> None:
    a, b = slot("a"), slot("b")
    ca, cb = shadow("ca", a), shadow("cb", b)
    plan = plan_moves(
        claims=[ca, cb], held={ca.uid: b}, spare=lambda c: True, need=needs({a: 1, b: 1})
    )
    [swap] = plan.swaps
    assert (swap.holder.claim.name, swap.holder.to) == ("ca", b)
    assert swap.spare is not None
    assert (swap.spare.claim.name, swap.spare.to) == ("cb", a)
    assert plan.unrepaid == ()


def test_a_holder_without_reservation_leaves_the_loser_unrepaid() -> None:
    a, x = slot("a"), slot("bypass")
    ca = shadow("ca", a)
    plan = plan_moves(claims=[ca], held={ca.uid: x}, spare=lambda c: True, need=needs({a: 1, x: 1}))
    assert [s.spare for s in plan.swaps] == [None]
    assert [m.claim.name for m in plan.unrepaid] == ["ca"]


@pytest.mark.parametrize(
    "state",
    ["spare-written-holder-not", "one-of-two-crossed-written"],
)
def test_a_half_done_swap_is_finished_without_a_second_spare(state: str) -> None:
    a, b = slot("a"), slot("b")
    if state == "spare-written-holder-not":
        ca, cb = shadow("ca", a), shadow("cb", a)  # cb already given to A; ca still A's, held by B
        held = {ca.uid: b}
    else:
        ca, cb = shadow("ca", b), shadow("cb", b)  # ca moved to B; cb (held by A) not yet
        held = {ca.uid: b, cb.uid: a}
    plan = plan_moves(
        claims=[ca, cb], held=held, spare=lambda c: c.uid not in held, need=needs({a: 1, b: 1})
    )
    assert len(plan.swaps) == 1
    assert plan.swaps[0].spare is None
    assert plan.unrepaid == ()


def test_claims_held_from_another_namespace_are_reported_not_moved() -> None:
    a, other = slot("a"), slot("b", namespace="other")
    ca = shadow("ca", a)
    plan = plan_moves(claims=[ca], held={ca.uid: other}, spare=lambda c: True, need=needs({}))
    assert plan.swaps == ()
    assert plan.cross_namespace == ((ca, other),)


def test_holdings_from_a_list_answer() -> None:
    response = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    pr.ContainerResources(
                        name="c1",
                        devices=[
                            pr.ContainerDevices(resource_name=R, device_ids=["1g-5gb-0"]),
                            pr.ContainerDevices(resource_name="other/gpu", device_ids=["x"]),
                        ],
                    ),
                    pr.ContainerResources(name="c2"),
                ],
            )
        ]
    )
    holdings = holdings_from_response(response, resources=[R])
    assert holdings.containers == (ContainerKey("ns", "p", "c1"), ContainerKey("ns", "p", "c2"))
    assert holdings.holder(R, "1g-5gb-0") == ContainerKey("ns", "p", "c1")
    assert holdings.holder("other/gpu", "x") is None
    assert holdings.holds(ContainerKey("ns", "p", "c1"), R)
    assert not holdings.holds(ContainerKey("ns", "p", "c2"), R)
