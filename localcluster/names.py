"""Kubernetes name rules (RFC 1123 labels and subdomains, qualified names) as field errors."""

from __future__ import annotations

import re

from localcluster.errors import FieldError

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def name_errors(field: str, name: str, *, label: bool) -> list[FieldError]:
    pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
    if len(name) > limit or not pattern.match(name):
        chars = "'-'" if label else "'-' or '.'"
        kind = "label" if label else "subdomain"
        detail = (
            f"a lowercase RFC 1123 {kind} must consist of lower case alphanumeric characters, "
            f"{chars}, and must start and end with an alphanumeric character (at most {limit} "
            "characters)"
        )
        return [FieldError("Invalid", field, detail, name)]
    return []


def qualified_name_errors(field: str, key: str) -> list[FieldError]:
    prefix, slash, name = key.rpartition("/")
    bad = not _QUALIFIED_NAME.match(name) or len(name) > 63
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        bad = True
    if bad:
        return [
            FieldError(
                "Invalid",
                field,
                "name part must consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric "
                "character",
                key,
            )
        ]
    return []


def label_value_errors(field: str, value: str) -> list[FieldError]:
    """A label value: empty, or at most 63 alphanumerics, '-', '_' or '.' starting and ending
    with an alphanumeric (``validation.IsValidLabelValue``)."""
    if value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
        return [
            FieldError(
                "Invalid",
                field,
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character "
                "(at most 63 characters)",
                value,
            )
        ]
    return []
