"""Process logging: text for people, JSON lines for log pipelines, with ids as structured fields.

Code logs ids as ``extra`` (``logger.info("prepared", extra={"claim_uid": uid})``). Each daemon
names the fields it emits (its ``logs.FIELDS``); the JSON format writes them as top-level keys so
they can be searched, the text format appends them as ``key=value`` in that order.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO


class _FieldsFormatter(logging.Formatter):
    def __init__(self, fmt: str | None = None, *, fields: Sequence[str]) -> None:
        super().__init__(fmt)
        self._names = tuple(fields)

    def fields(self, record: logging.LogRecord) -> dict[str, object]:
        return {name: getattr(record, name) for name in self._names if hasattr(record, name)}


class JsonFormatter(_FieldsFormatter):
    def __init__(self, *, fields: Sequence[str]) -> None:
        super().__init__(fields=fields)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **self.fields(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(_FieldsFormatter):
    def __init__(self, *, fields: Sequence[str]) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", fields=fields)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = self.fields(record)
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return text


def configure_logging(
    *, level: str, log_format: str, fields: Sequence[str], stream: TextIO | None = None
) -> None:
    """Install one handler on the root logger (replacing earlier ones) in the chosen format."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter(fields=fields) if log_format == "json" else TextFormatter(fields=fields)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
