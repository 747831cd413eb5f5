"""Log formats: JSON lines with the daemon's structured fields as top-level keys, or text with
``key=value`` suffixes in the daemon's field order; other ``extra`` keys are not emitted."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from driver.daemon.logs import JsonFormatter, TextFormatter, configure_logging

FIELDS = ("claim", "pod", "node")


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("a.b", logging.WARNING, __file__, 1, "placed %s", ("p1",), None)
    record.created = 0.25
    for name, value in extra.items():
        setattr(record, name, value)
    return record


def test_json_has_the_fields_as_keys() -> None:
    line = JsonFormatter(fields=FIELDS).format(_record(node="n1", claim="c1", other="x"))
    assert json.loads(line) == {
        "ts": "1970-01-01T00:00:00.250+00:00",
        "level": "WARNING",
        "logger": "a.b",
        "msg": "placed p1",
        "claim": "c1",
        "node": "n1",
    }


def test_json_carries_the_exception() -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        record = logging.LogRecord("a", logging.ERROR, __file__, 1, "failed", (), None)
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter(fields=FIELDS).format(record))
    assert "ValueError: bad value" in entry["exc"]


@pytest.mark.parametrize(
    ("extra", "suffix"),
    [
        ({}, "a.b: placed p1"),
        ({"node": "n1", "claim": "c1", "x": 1}, "a.b: placed p1 claim=c1 node=n1"),
    ],
    ids=["no-fields", "fields-in-order"],
)
def test_text_appends_fields_in_the_daemon_order(extra: dict[str, object], suffix: str) -> None:
    text = TextFormatter(fields=FIELDS).format(_record(**extra))
    assert text.endswith(f" WARNING {suffix}")


@pytest.mark.parametrize(
    ("log_format", "formatter"),
    [("json", JsonFormatter), ("text", TextFormatter)],
    ids=["json", "text"],
)
def test_configure_logging_installs_one_handler(
    root_logger: logging.Logger, log_format: str, formatter: type[logging.Formatter]
) -> None:
    stream = io.StringIO()
    configure_logging(level="DEBUG", log_format=log_format, fields=FIELDS, stream=stream)
    configure_logging(level="DEBUG", log_format=log_format, fields=FIELDS, stream=stream)
    assert len(root_logger.handlers) == 1
    assert isinstance(root_logger.handlers[0].formatter, formatter)
    assert root_logger.level == logging.DEBUG
    logging.getLogger("x").debug("hello", extra={"pod": "ns/p"})
    assert "hello" in stream.getvalue()
    assert "ns/p" in stream.getvalue()
