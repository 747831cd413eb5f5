"""Kubernetes' quantity and semver values as CEL selectors use them."""

from fractions import Fraction

import pytest

from controller.allocation.cel_library import Quantity, Semver


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("5Gi", 5 * 2**30),
        ("1024Mi", 2**30),
        ("1Ki", 1024),
        ("100m", Fraction(1, 10)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("2k", 2000),
        ("3M", 3_000_000),
        ("-1G", -(10**9)),
        ("+7", 7),
        ("14", 14),
        ("5n", Fraction(5, 10**9)),
    ],
    ids=str,
)
def test_quantity_parses_kubernetes_suffixes(text: str, value: Fraction | int) -> None:
    assert Quantity.parse(text).value == value


@pytest.mark.parametrize("text", ["", "Gi", "1K", "1.2.3", "1 Gi", "1gi", "0x10", "1e"], ids=repr)
def test_quantity_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        Quantity.parse(text)


def test_quantity_equality_is_by_value_and_refuses_other_types() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1024Mi")
    assert Quantity.parse("1Gi") != Quantity.parse("1G")
    assert hash(Quantity.parse("1Gi")) == hash(Quantity.parse("1024Mi"))
    with pytest.raises(TypeError, match="no such overload"):
        _ = Quantity.parse("1") == 1


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("1.2.3", "1.2.3", 0),
        ("1.2.3", "1.2.4", -1),
        ("1.10.0", "1.9.9", 1),
        ("2.0.0", "10.0.0", -1),
        ("1.0.0-rc.1", "1.0.0", -1),
        ("1.0.0-alpha", "1.0.0-alpha.1", -1),
        ("1.0.0-alpha.1", "1.0.0-alpha.beta", -1),
        ("1.0.0-beta.2", "1.0.0-beta.11", -1),
        ("1.0.0-rc.1", "1.0.0-beta.11", 1),
        ("1.0.0+build.5", "1.0.0+build.7", 0),
    ],
    ids=str,
)
def test_semver_precedence(left: str, right: str, expected: int) -> None:
    assert Semver.parse(left).compare(Semver.parse(right)) == expected
    assert Semver.parse(right).compare(Semver.parse(left)) == -expected


@pytest.mark.parametrize("text", ["1.2", "v1.2.3", "01.2.3", "1.2.3-01", "1.2.3-", ""], ids=repr)
def test_semver_rejects_malformed_versions(text: str) -> None:
    with pytest.raises(ValueError, match=r"semantic version|leading zeros"):
        Semver.parse(text)
