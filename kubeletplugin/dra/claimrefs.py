"""Which claim references of a DRA call are well formed, before any of them reaches the API server.

The kubelet names each claim by UID, namespace and name, and the plugin GETs
``namespaces/<namespace>/resourceclaims/<name>``. A name that is empty turns that GET into a LIST,
one with a ``/`` or ``..`` into another path of the API server; so a reference is checked as
Kubernetes checks the object's own fields (namespace: DNS-1123 label; name: DNS-1123 subdomain; UID:
non-empty printable text without ``/``) and a malformed one gets its own per-claim error, while the
well-formed claims of the same call are prepared as usual.
"""

import re
from collections.abc import Iterable
from typing import Final

from kubeletplugin.model import ClaimRef

MAX_UID_LENGTH: Final = 128
"""Kubernetes UIDs are 36-character UUIDs; anything much longer is not one."""
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_SUBDOMAIN: Final = 253
_UID: Final = re.compile(r"[!-.0-~]+")
"""Printable ASCII without space or ``/``."""


def claim_ref_problem(ref: ClaimRef) -> str | None:
    """Why ``ref`` cannot name a ResourceClaim, or None when it can."""
    if not ref.uid or len(ref.uid) > MAX_UID_LENGTH or not _UID.fullmatch(ref.uid):
        return f"uid {ref.uid[:MAX_UID_LENGTH]!r} is not a Kubernetes UID"
    if not _LABEL.fullmatch(ref.namespace):
        return f"namespace {ref.namespace[:64]!r} is not a DNS-1123 label"
    if len(ref.name) > _MAX_SUBDOMAIN or not _SUBDOMAIN.fullmatch(ref.name):
        return f"name {ref.name[:_MAX_SUBDOMAIN]!r} is not a DNS-1123 subdomain"
    return None


def split_claim_refs(refs: Iterable[ClaimRef]) -> tuple[list[ClaimRef], dict[str, str]]:
    """The well-formed references, and the error for each malformed one by its UID."""
    good: list[ClaimRef] = []
    refused: dict[str, str] = {}
    for ref in refs:
        problem = claim_ref_problem(ref)
        if problem is None:
            good.append(ref)
        else:
            refused[ref.uid] = f"malformed claim reference: {problem}"
    return good, refused
