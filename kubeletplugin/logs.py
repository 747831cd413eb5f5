"""The structured fields the plugin's log lines carry (see ``driver.daemon.logs``).

Code logs ids as ``extra`` (``logger.info("prepared", extra={"claim_uid": uid})``); the JSON format
emits them as top-level keys so they can be searched, the text format appends them as ``key=value``.
"""

from typing import Final

FIELDS: Final = (
    "claim_uid",
    "claim",
    "namespace",
    "pod_uid",
    "pod",
    "node",
    "gpu",
    "profile",
    "start",
    "gi_id",
    "mig_uuid",
)
"""Structured fields that may be passed as ``extra`` and are emitted by both formats."""
