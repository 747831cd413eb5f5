"""What more fits a cluster now: per profile, and a mixed batch."""

from __future__ import annotations

import pytest

from driver.errors import ConfigError
from driver.placement import Engine
from instaslice.planning.fleet import parse_fleet
from instaslice.planning.headroom import fit_batch, free_by_profile, parse_batch


@pytest.fixture
def engine() -> Engine:
    engine = Engine(policy="bestfit")
    for node in parse_fleet("1x2xA100-40GB").nodes:
        engine.set_node(node)
    engine.occupy("node-0000", 0, start=0, size=4, profile="4g.20gb")
    engine.occupy("node-0000", 1, start=6, size=1, profile="1g.5gb")
    return engine


def test_free_instances_per_profile(engine: Engine) -> None:
    free = {h.profile: (h.free, h.gpus) for h in free_by_profile(engine)}
    assert free["7g.40gb"] == (0, 2)
    assert free["4g.20gb"] == (1, 2)  # only on GPU 1, whose start 0 is free
    assert free["3g.20gb"] == (2, 2)  # GPU 0 at 4, GPU 1 at 0
    assert free["1g.5gb"] == (3 + 6, 2)


def test_a_batch_that_fits_is_placed_and_undone(engine: Engine) -> None:
    before = engine.free_instances("1g.5gb")
    result = fit_batch(engine, parse_batch("1g.5gb=2,3g.20gb=2"))
    assert result.fits
    assert result.placed == (("1g.5gb", 2), ("3g.20gb", 2))
    assert [a.profile for p in result.placements for a in p.assignments][:2] == ["3g.20gb"] * 2
    assert engine.free_instances("1g.5gb") == before


def test_a_batch_that_does_not_fit_says_how_far_it_got(engine: Engine) -> None:
    result = fit_batch(engine, parse_batch("3g.20gb=3, 1g.5gb"))
    assert not result.fits
    assert result.placed == (("3g.20gb", 2), ("1g.5gb", 1))


@pytest.mark.parametrize(
    ("text", "error"),
    [("", "the batch is empty"), ("3g.20gb=0", "not PROFILE=COUNT"), ("=2", "not PROFILE=COUNT")],
    ids=["empty", "zero", "no-profile"],
)
def test_bad_batches_are_named(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_batch(text)
    assert error in str(raised.value)


def test_an_unpublished_profile_is_named(engine: Engine) -> None:
    with pytest.raises(ConfigError, match=r"no node publishes MIG profile\(s\) 3g.40gb"):
        fit_batch(engine, (("3g.40gb", 1),))
