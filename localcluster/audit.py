"""Who asked the local API server for what, in the terms RBAC authorizes.

kube-apiserver turns every request into *request attributes* before authorizing it (apiserver's
``RequestInfoFactory``): a verb (``get list watch create update patch delete deletecollection``),
an API group, a resource and subresource, a namespace and a name. :func:`request_attributes` does
the same from the method, path and query of a request — independently of whether the resource
exists, as kube does — so a recorded run can be checked against a component's Roles
(``tests/deploy/test_rbac_audit.py``) without a real authorizer.

:class:`AuditLog` keeps the last records in memory (thread-safe; the server calls its sink from
one thread per connection); :class:`JsonLinesAuditFile` appends them to a file, one JSON object a
line (``python -m localcluster --audit-log FILE``). The API server calls the sink once per
answered request, after the handler decided the response code; a watch is recorded when its
stream starts.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from driver.closing import ClosedOnExit

AuditSink = Callable[["AuditRecord"], None]
"""Called once per request; must be thread-safe and quick (it runs on the request's thread)."""

_METHOD_VERBS = {
    "GET": "get",
    "HEAD": "get",
    "POST": "create",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# Subresources of a namespace object itself (/api/v1/namespaces/<ns>/status): not a resource name.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
DEFAULT_CAPACITY = 100_000


@dataclass(frozen=True, slots=True)
class RequestAttributes:
    """What RBAC sees of one request. ``resource`` is empty for a non-resource URL (``/healthz``,
    discovery), whose ``verb`` is then the lower-case HTTP method, as kube has it."""

    verb: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def is_resource_request(self) -> bool:
        return bool(self.resource)

    @property
    def resource_path(self) -> str:
        """``pods`` or ``pods/status``: how RBAC rules spell a resource with its subresource."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True, slots=True)
class AuditRecord:
    user_agent: str
    method: str
    attributes: RequestAttributes
    code: int

    def to_json(self) -> dict[str, object]:
        return {
            "userAgent": self.user_agent,
            "method": self.method,
            "code": self.code,
            **{
                _camel(f.name): getattr(self.attributes, f.name)
                for f in dataclasses.fields(self.attributes)
            },
        }

    def describe(self) -> str:
        """``patch resource.k8s.io resourceclaims/status ns/name -> 200``, for messages."""
        a = self.attributes
        where = "/".join(p for p in (a.namespace, a.name) if p) or "-"
        what = f"{a.api_group or 'core'} {a.resource_path}" if a.resource else a.path
        return f"{a.verb} {what} {where} -> {self.code} ({self.user_agent})"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> RequestAttributes:
    """RBAC's view of ``method path?query`` (apiserver's ``RequestInfoFactory.NewRequestInfo``)."""
    method = method.upper()
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return RequestAttributes(verb=method.lower(), path=path)
    if not rest:  # /api/v1, /apis/<group>/<version>: discovery
        return RequestAttributes(verb=method.lower(), path=path)
    verb = _METHOD_VERBS.get(method, method.lower())
    legacy_watch = rest[0] == "watch"
    if legacy_watch:
        verb, rest = "watch", rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "").lower() in ("true", "1") else "list"
    if not name and verb == "delete":
        verb = "deletecollection"
    if not name and verb in ("list", "watch"):
        # kube authorizes a list/watch of one object by name (``fieldSelector=metadata.name=x``).
        name = _name_from_field_selector(query.get("fieldSelector", ""))
    return RequestAttributes(
        verb=verb,
        api_group=group,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
        path=path,
    )


def _name_from_field_selector(selector: str) -> str:
    for term in selector.split(","):
        if "!=" in term:
            continue
        key, _, value = term.replace("==", "=", 1).partition("=")
        if key.strip() == "metadata.name":
            return value.strip()
    return ""


def record_request(
    *, method: str, path: str, query: Mapping[str, str], user_agent: str, code: int
) -> AuditRecord:
    return AuditRecord(
        user_agent=user_agent,
        method=method.upper(),
        attributes=request_attributes(method, path, query),
        code=code,
    )


class AuditLog:
    """The last ``capacity`` records in memory, oldest first; usable as an :data:`AuditSink`."""

    def __init__(self, *, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._records: collections.deque[AuditRecord] = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._dropped = 0

    def __call__(self, record: AuditRecord) -> None:
        with self._lock:
            if len(self._records) == self._records.maxlen:
                self._dropped += 1
            self._records.append(record)

    def records(self) -> list[AuditRecord]:
        with self._lock:
            return list(self._records)

    @property
    def dropped(self) -> int:
        """Records pushed out by newer ones (a check over a run must see none)."""
        with self._lock:
            return self._dropped

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._dropped = 0


def user_agent_product(user_agent: str) -> str:
    """The product token of a user agent: what precedes the first ``/`` or space."""
    return user_agent.split(" ", 1)[0].split("/", 1)[0]


def group_by_user_agent(
    records: Iterable[AuditRecord], *, product_only: bool = True
) -> dict[str, list[AuditRecord]]:
    grouped: dict[str, list[AuditRecord]] = {}
    for record in records:
        key = user_agent_product(record.user_agent) if product_only else record.user_agent
        grouped.setdefault(key, []).append(record)
    return grouped


class JsonLinesAuditFile(ClosedOnExit):
    """Appends each record as one JSON line (flushed, so ``tail -f`` shows it); close it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, record: AuditRecord) -> None:
        line = json.dumps(record.to_json(), separators=(",", ":"))
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_json_lines(path: Path) -> list[AuditRecord]:
    """The records a :class:`JsonLinesAuditFile` wrote."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        data = json.loads(line)
        attributes = RequestAttributes(
            **{f.name: data.get(_camel(f.name), "") for f in dataclasses.fields(RequestAttributes)}
        )
        records.append(
            AuditRecord(
                user_agent=str(data["userAgent"]),
                method=str(data["method"]),
                attributes=attributes,
                code=int(data["code"]),
            )
        )
    return records
