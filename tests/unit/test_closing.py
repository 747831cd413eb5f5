"""``with`` over a ``ClosedOnExit`` object yields the object itself and closes it on the way out,
also when the block raises (the exception is not swallowed)."""

from __future__ import annotations

import pytest

from driver.closing import ClosedOnExit


class _Resource(ClosedOnExit):
    def __init__(self) -> None:
        self.closes = 0

    def close(self) -> None:
        self.closes += 1


def test_with_yields_the_object_and_closes_it() -> None:
    resource = _Resource()
    with resource as entered:
        assert entered is resource
        assert resource.closes == 0
    assert resource.closes == 1


def test_an_exception_in_the_block_still_closes_and_propagates() -> None:
    resource = _Resource()
    with pytest.raises(RuntimeError, match="inside"), resource:
        raise RuntimeError("inside")
    assert resource.closes == 1


def test_close_is_required() -> None:
    class _NoClose(ClosedOnExit):
        pass

    with pytest.raises(TypeError, match="abstract"):
        _NoClose()  # type: ignore[abstract]
