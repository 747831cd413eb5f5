"""The node groups' bookkeeping: sizes, limits, instance states, as the externalgrpc contract asks."""

from __future__ import annotations

import pytest

from tests.autoscale.groups import (
    InstanceState,
    NodeGroupError,
    NodeGroups,
    NodeGroupSpec,
    provider_id,
)


def _groups(*, a100_min: int = 0, a100_max: int = 3) -> NodeGroups:
    return NodeGroups(
        [
            NodeGroupSpec(id="a100", gpus="1xA100-40GB", min_size=a100_min, max_size=a100_max),
            NodeGroupSpec(id="h100", gpus="1xH100-80GB", min_size=0, max_size=1),
        ]
    )


def _states(groups: NodeGroups, group: str) -> dict[str, InstanceState]:
    return {i.node: i.state for i in groups.instances(group)}


def test_increase_names_new_nodes_never_reusing_a_name_and_counts_them_in_the_target() -> None:
    groups = _groups()
    first = groups.increase("a100", 2)
    assert [i.node for i in first] == ["a100-1", "a100-2"]
    assert [i.provider_id for i in first] == [
        "instaslice-test://a100-1",
        "instaslice-test://a100-2",
    ]
    assert groups.target_size("a100") == 2
    groups.delete("a100", [(provider_id("a100-1"), "a100-1")])
    groups.gone("a100-1")
    assert [i.node for i in groups.increase("a100", 1)] == ["a100-3"]
    assert groups.target_size("a100") == 2
    assert groups.target_size("h100") == 0


@pytest.mark.parametrize(
    ("group", "delta", "not_found"),
    [("a100", 0, False), ("a100", -1, False), ("a100", 4, False), ("gpu", 1, True)],
    ids=["zero", "negative", "over-max", "unknown-group"],
)
def test_increase_refuses_what_the_contract_forbids(
    group: str, delta: int, not_found: bool
) -> None:
    groups = _groups()
    with pytest.raises(NodeGroupError) as refused:
        groups.increase(group, delta)
    assert refused.value.not_found is not_found
    assert groups.instances() == []


def test_started_and_failed_move_only_creating_instances() -> None:
    groups = _groups()
    groups.increase("a100", 3)
    groups.started("a100-1")
    groups.failed("a100-2", "kubelet did not register")
    assert _states(groups, "a100") == {
        "a100-1": InstanceState.RUNNING,
        "a100-2": InstanceState.FAILED,
        "a100-3": InstanceState.CREATING,
    }
    assert groups.instance("a100-2").error == "kubelet did not register"  # type: ignore[union-attr]
    groups.delete("a100", [("", "a100-3")])
    # a start that ends after its deletion was asked does not bring the instance back
    after = groups.started("a100-3")
    assert after is not None
    assert after.state is InstanceState.DELETING
    assert groups.target_size("a100") == 2  # the failed one counts until it is deleted


def test_delete_is_all_or_nothing_and_keeps_the_minimum() -> None:
    groups = _groups(a100_min=1)
    groups.increase("a100", 2)
    groups.increase("h100", 1)
    with pytest.raises(NodeGroupError, match="does not belong"):
        groups.delete("a100", [(provider_id("a100-1"), "a100-1"), ("", "h100-1")])
    with pytest.raises(NodeGroupError, match="minimum 1"):
        groups.delete("a100", [("", "a100-1"), ("", "a100-2")])
    assert set(_states(groups, "a100").values()) == {InstanceState.CREATING}
    leaving = groups.delete("a100", [(provider_id("a100-2"), "")])
    assert [i.node for i in leaving] == ["a100-2"]
    assert groups.target_size("a100") == 1
    # asked again while it is going: nothing more to do, and no double count against the minimum
    assert groups.delete("a100", [("", "a100-2")]) == []


def test_decrease_target_drops_only_instances_not_started_yet_newest_first() -> None:
    groups = _groups()
    groups.increase("a100", 3)
    groups.started("a100-1")
    with pytest.raises(NodeGroupError, match="2 not started yet"):
        groups.decrease_target("a100", -3)
    with pytest.raises(NodeGroupError, match="must be negative"):
        groups.decrease_target("a100", 1)
    dropped = groups.decrease_target("a100", -1)
    assert [i.node for i in dropped] == ["a100-3"]
    assert groups.target_size("a100") == 2


def test_group_of_a_node_by_provider_id_or_name_and_none_for_strangers() -> None:
    groups = _groups()
    groups.increase("h100", 1)
    assert groups.group_of(provider_id=provider_id("h100-1"), node="").id == "h100"  # type: ignore[union-attr]
    assert groups.group_of(provider_id="", node="h100-1").id == "h100"  # type: ignore[union-attr]
    assert groups.group_of(provider_id="aws:///i-123", node="control-plane") is None


def test_limits_can_change_and_bad_ones_are_refused() -> None:
    groups = _groups()
    groups.set_limits("a100", min_size=1, max_size=1)
    assert (groups.spec("a100").min_size, groups.spec("a100").max_size) == (1, 1)
    with pytest.raises(NodeGroupError):
        groups.increase("a100", 2)
    with pytest.raises(ValueError, match="min <= max"):
        NodeGroupSpec(id="bad", gpus="1xA100-40GB", min_size=2, max_size=1)
    with pytest.raises(ValueError, match="twice"):
        NodeGroups([groups.spec("a100"), groups.spec("a100")])
