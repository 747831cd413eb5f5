"""Kubernetes' CEL extensions that DRA selectors use, for the ``cel-python`` evaluator.

kube-apiserver and kube-scheduler evaluate device selectors with cel-go plus Kubernetes' own
libraries. Users write against those, so our evaluator must offer the same names and the same
rules: device capacities are ``Quantity`` values (compared with ``compareTo``/``isGreaterThan``, not
``<``), and ``version`` attributes are semantic versions. This module holds those two value types and
the CEL functions over them; ``selectors`` binds them into every program it compiles.

cel-python dispatches a receiver call ``q.compareTo(x)`` to the function named ``compareTo`` with
the receiver as first argument, so each method below checks its receiver's type itself and raises
``TypeError`` (which cel-python reports as "no such overload") for anything else — the error cel-go
gives for a wrong receiver.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from celpy import celtypes

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

_QUANTITY_RE: Final = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}


@dataclass(frozen=True, slots=True, eq=False)
class Quantity:
    """A Kubernetes ``resource.Quantity``: an exact number written with an optional suffix.

    Equality is by value (``1Gi == 1024Mi``), as in Kubernetes. There are no ordering operators, so
    ``<`` in CEL fails with "no such overload" as in cel-go; Python code compares ``.value``.
    """

    value: Fraction
    text: str

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse ``"5Gi"``, ``"100m"``, ``"1.5"``, ``"1e3"``; ``ValueError`` for anything else."""
        return _parse_quantity_cached(text)  # slices repeat the same few capacities

    @classmethod
    def _parse(cls, text: str) -> Quantity:
        match = _QUANTITY_RE.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 5Gi, 100m, 1.5, 1e3)")
        number = Fraction(match["number"])
        suffix = match["suffix"] or ""
        if suffix in _BINARY_SUFFIXES:
            number *= 2 ** _BINARY_SUFFIXES[suffix]
        elif suffix in _DECIMAL_SUFFIXES:
            number *= Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
        elif suffix:
            number *= Fraction(10) ** int(suffix[1:])
        return cls(value=number, text=text.strip())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            raise TypeError(f"no such overload: quantity == {type(other).__name__}")
        return self.value == other.value

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return self.text

    def is_int64(self) -> bool:
        return self.value.denominator == 1 and _INT64_MIN <= self.value <= _INT64_MAX


@functools.lru_cache(maxsize=4096)
def _parse_quantity_cached(text: str) -> Quantity:
    return Quantity._parse(text)


_SEMVER_RE: Final = re.compile(
    r"^(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)\.(?P<patch>0|[1-9][0-9]*)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True, slots=True, eq=False)
class Semver:
    """A semantic version (semver.org 2.0.0), the value of a ``version`` device attribute."""

    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> Semver:
        match = _SEMVER_RE.match(text)
        if match is None:
            raise ValueError(
                f"{text!r} is not a semantic version (MAJOR.MINOR.PATCH[-PRE][+BUILD])"
            )
        pre = tuple(match["pre"].split(".")) if match["pre"] else ()
        for part in pre:
            if part.isdigit() and len(part) > 1 and part.startswith("0"):
                raise ValueError(f"{text!r}: numeric pre-release identifiers have no leading zeros")
        return cls(
            major=int(match["major"]),
            minor=int(match["minor"]),
            patch=int(match["patch"]),
            prerelease=pre,
            text=text,
        )

    def compare(self, other: Semver) -> int:
        """Semver precedence: -1, 0 or 1 (build metadata ignored)."""
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if self.prerelease == other.prerelease:
            return 0
        if not self.prerelease:
            return 1
        if not other.prerelease:
            return -1
        for a, b in zip(self.prerelease, other.prerelease, strict=False):
            if a == b:
                continue
            if a.isdigit() and b.isdigit():
                return -1 if int(a) < int(b) else 1
            if a.isdigit() != b.isdigit():
                return -1 if a.isdigit() else 1
            return -1 if a < b else 1
        return -1 if len(self.prerelease) < len(other.prerelease) else 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            raise TypeError(f"no such overload: semver == {type(other).__name__}")
        return self.compare(other) == 0

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __str__(self) -> str:
        return self.text


def _quantity_arg(value: Any, *, function: str) -> Quantity:
    if not isinstance(value, Quantity):
        raise TypeError(
            f"no such overload: {function} needs a quantity, got {type(value).__name__}"
        )
    return value


def _int64(value: Fraction | int, *, function: str) -> celtypes.IntType:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{function}: result overflows int64")
    return celtypes.IntType(int(value))


def _sign(value: Fraction | int) -> celtypes.IntType:
    return celtypes.IntType((value > 0) - (value < 0))


def _fn_quantity(text: Any) -> Quantity:
    if not isinstance(text, str):
        raise TypeError("no such overload: quantity(string)")
    try:
        return Quantity.parse(text)
    except ValueError as exc:
        # ValueError would be reported as an overflow by cel-python; say what really happened.
        raise TypeError(f"quantity(): {exc}") from exc


def _fn_is_quantity(text: Any) -> celtypes.BoolType:
    if not isinstance(text, str):
        raise TypeError("no such overload: isQuantity(string)")
    return celtypes.BoolType(_QUANTITY_RE.match(text.strip()) is not None)


def _fn_semver(text: Any) -> Semver:
    if not isinstance(text, str):
        raise TypeError("no such overload: semver(string)")
    try:
        return Semver.parse(text)
    except ValueError as exc:
        raise TypeError(f"semver(): {exc}") from exc


def _fn_is_semver(text: Any) -> celtypes.BoolType:
    if not isinstance(text, str):
        raise TypeError("no such overload: isSemver(string)")
    return celtypes.BoolType(_SEMVER_RE.match(text) is not None)


def _fn_compare_to(receiver: Any, other: Any) -> celtypes.IntType:
    if isinstance(receiver, Semver):
        if not isinstance(other, Semver):
            raise TypeError("no such overload: semver.compareTo(semver)")
        return celtypes.IntType(receiver.compare(other))
    left = _quantity_arg(receiver, function="compareTo")
    right = _quantity_arg(other, function="compareTo")
    return _sign(left.value - right.value)


def _fn_is_greater_than(receiver: Any, other: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_fn_compare_to(receiver, other) > 0)


def _fn_is_less_than(receiver: Any, other: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_fn_compare_to(receiver, other) < 0)


def _fn_sign(receiver: Any) -> celtypes.IntType:
    return _sign(_quantity_arg(receiver, function="sign").value)


def _fn_is_integer(receiver: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_quantity_arg(receiver, function="isInteger").is_int64())


def _fn_as_integer(receiver: Any) -> celtypes.IntType:
    quantity = _quantity_arg(receiver, function="asInteger")
    if quantity.value.denominator != 1:
        raise ValueError(f"asInteger: {quantity.text} is not an integer")
    return _int64(quantity.value, function="asInteger")


def _fn_as_approximate_float(receiver: Any) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(_quantity_arg(receiver, function="asApproximateFloat").value))


def _arith(receiver: Any, other: Any, *, function: str, sign: int) -> Quantity:
    left = _quantity_arg(receiver, function=function)
    if isinstance(other, Quantity):
        right = other.value
    elif isinstance(other, int) and not isinstance(other, bool):
        right = Fraction(other)
    else:
        raise TypeError(f"no such overload: quantity.{function}({type(other).__name__})")
    total = left.value + sign * right
    return Quantity(value=total, text=_format_plain(total))


def _format_plain(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return format(float(value), "g")


def _fn_add(receiver: Any, other: Any) -> Quantity:
    return _arith(receiver, other, function="add", sign=1)


def _fn_sub(receiver: Any, other: Any) -> Quantity:
    return _arith(receiver, other, function="sub", sign=-1)


def _semver_part(name: str) -> Callable[[Any], celtypes.IntType]:
    def part(receiver: Any) -> celtypes.IntType:
        if not isinstance(receiver, Semver):
            raise TypeError(f"no such overload: {name}() needs a semver")
        return celtypes.IntType(getattr(receiver, name))

    return part


KUBERNETES_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": _fn_quantity,
    "isQuantity": _fn_is_quantity,
    "semver": _fn_semver,
    "isSemver": _fn_is_semver,
    "compareTo": _fn_compare_to,
    "isGreaterThan": _fn_is_greater_than,
    "isLessThan": _fn_is_less_than,
    "sign": _fn_sign,
    "isInteger": _fn_is_integer,
    "asInteger": _fn_as_integer,
    "asApproximateFloat": _fn_as_approximate_float,
    "add": _fn_add,
    "sub": _fn_sub,
    "major": _semver_part("major"),
    "minor": _semver_part("minor"),
    "patch": _semver_part("patch"),
}
"""Kubernetes' quantity and semver libraries, by CEL function name."""
