"""The structured fields the controller's log lines carry (see ``driver.daemon.logs``).

Pod, claim and node ids passed as ``extra`` (``logger.info("…", extra={"pod": key})``) become
top-level JSON keys, or ``key=value`` suffixes in text, in this order.
"""

from __future__ import annotations

from typing import Final

FIELDS: Final = ("pod", "claim", "namespace", "node", "profile")
