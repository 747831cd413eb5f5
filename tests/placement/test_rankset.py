"""RankSet against Python's set: every answer equal after any sequence of adds and discards."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.placement.rankset import RankSet

# Values up to 300,000 need four levels of 64-bit words; small ones keep collisions frequent.
values = st.one_of(st.integers(0, 200), st.integers(0, 300_000))
operations = st.lists(st.tuples(st.booleans(), values), max_size=200)


@settings(max_examples=150, deadline=None)
@given(operations=operations, probes=st.lists(values, max_size=20))
def test_rankset_behaves_like_a_sorted_set(
    operations: list[tuple[bool, int]], probes: list[int]
) -> None:
    ranks = RankSet()
    model: set[int] = set()
    for add, value in operations:
        if add:
            ranks.add(value)
            model.add(value)
        else:
            ranks.discard(value)
            model.discard(value)
        assert len(ranks) == len(model)
    assert list(ranks) == sorted(model)
    assert bool(ranks) == bool(model)
    for probe in probes:
        expected = min((v for v in model if v >= probe), default=-1)
        assert ranks.next_at_or_after(probe) == expected
        assert (probe in ranks) == (probe in model)
    assert ranks.first() == (min(model) if model else -1)


def test_iteration_tolerates_removal_behind_the_cursor() -> None:
    ranks = RankSet()
    for value in (3, 70, 4100, 5000):
        ranks.add(value)
    seen = []
    for value in ranks:
        seen.append(value)
        ranks.discard(value)
    assert seen == [3, 70, 4100, 5000]
    assert not ranks


def test_negative_ranks_are_refused() -> None:
    ranks = RankSet()
    with pytest.raises(ValueError, match="rank must be >= 0"):
        ranks.add(-1)
    assert ranks.next_at_or_after(-5) == -1
