"""The REST verbs of kube-apiserver over the store: routing, request decoding, admission, patches.

Transport-free: :meth:`ApiHandler.handle` takes a decoded HTTP request and returns either a JSON
answer or a watch stream (an iterator of newline-delimited JSON events); ``apiserver.py`` does the
sockets. Every failure leaves here as an ``ApiError`` rendered into a ``Status``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from localcluster import discovery, errors, patch
from localcluster.admission import Attributes, MutatingAdmission
from localcluster.binding import bind_pod
from localcluster.policy.eviction import EvictionOptions, evict_pod
from localcluster.resources import BINDINGS, PODS, PRIORITY_CLASSES, ResourceType
from localcluster.routing import Target, parse_target
from localcluster.scheduling.admission import PriorityAdmission
from localcluster.scheduling.storage import refuse_system_class_delete
from localcluster.selectors import ObjectFilter, parse_field_selector, parse_label_selector
from localcluster.store import Store, meta
from localcluster.watch_stream import WatchOptions, expired_stream, watch_stream

JsonObj = dict[str, Any]

log = logging.getLogger(__name__)

_PATCH_RETRIES = 10
_DEFAULT_WATCH_TIMEOUT_S = 1800.0  # kube-apiserver's --min-request-timeout


@dataclass(frozen=True, slots=True)
class ApiRequest:
    method: str
    path: str
    query: dict[str, str]
    body: bytes = b""
    content_type: str = ""
    accept: str = ""


@dataclass(slots=True)
class ApiResponse:
    code: int
    body: JsonObj | None = None
    text: str | None = None
    stream: Iterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


class ApiHandler:
    def __init__(
        self,
        store: Store,
        admission: MutatingAdmission,
        *,
        priority: PriorityAdmission,
        server_address: Callable[[], str],
        bookmark_interval: float,
        closing: Callable[[], bool],
    ) -> None:
        self._store = store
        self._admission = admission
        self._priority = priority
        self._server_address = server_address
        self._watch = WatchOptions(bookmark_interval=bookmark_interval, closing=closing)

    def handle(self, request: ApiRequest) -> ApiResponse:
        try:
            return self._dispatch(request)
        except errors.ApiError as exc:
            return ApiResponse(exc.code, exc.status())
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            failure = errors.internal(f"{type(exc).__name__}: {exc}")
            return ApiResponse(failure.code, failure.status())

    # --- routing --------------------------------------------------------------------------------

    def _dispatch(self, request: ApiRequest) -> ApiResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return ApiResponse(200, text="ok")
        document = discovery.document(parts, self._server_address())
        if document is not None:
            if request.method != "GET":
                raise errors.method_not_allowed(request.method)
            return ApiResponse(200, document)
        target = parse_target(parts)
        if target.resource is BINDINGS:
            return self._legacy_binding(request, target)
        method = request.method
        if method == "GET":
            if target.subresource in ("binding", "eviction"):
                raise errors.method_not_allowed(method)
            if target.name is None or target.watch_path:
                return self._list_or_watch(request, target)
            obj = self._get(target)
            if "as=Table" in request.accept:
                return ApiResponse(200, discovery.table(target.resource, [obj], 0))
            return ApiResponse(200, obj)
        if method == "POST" and target.name is None:
            return self._create(request, target)
        if method == "POST" and target.subresource == "binding":
            return self._bind(request, target, str(target.name))
        if method == "POST" and target.subresource == "eviction":
            return self._evict(request, target, str(target.name))
        if method == "PUT" and target.name is not None:
            return self._update(request, target)
        if method == "PATCH" and target.name is not None:
            return self._patch(request, target)
        if method == "DELETE":
            if target.name is None:
                return self._delete_collection(request, target)
            return self._delete(request, target)
        raise errors.method_not_allowed(method)

    def _get(self, target: Target) -> JsonObj:
        return self._store.get(target.resource, target.namespace or "", str(target.name))

    # --- list and watch -------------------------------------------------------------------------

    def _selection(self, request: ApiRequest, target: Target) -> ObjectFilter:
        fields = request.query.get("fieldSelector", "")
        if target.watch_path and target.name is not None:
            fields = ",".join(f for f in (fields, f"metadata.name={target.name}") if f)
        return ObjectFilter(
            namespace=target.namespace if target.resource.namespaced else None,
            labels=parse_label_selector(request.query.get("labelSelector")),
            fields=parse_field_selector(fields, target.resource),
        )

    def _list_or_watch(self, request: ApiRequest, target: Target) -> ApiResponse:
        selection = self._selection(request, target)
        if target.watch_path or _flag(request.query.get("watch")):
            return self._start_watch(request, target.resource, selection)
        items, rv = self._store.list_objects(target.resource, selection)
        if "as=Table" in request.accept:
            return ApiResponse(200, discovery.table(target.resource, items, rv))
        metadata: JsonObj = {"resourceVersion": str(rv)}
        limit = _limit(request.query.get("limit"))
        token = request.query.get("continue", "")
        if token:
            start, first_rv = _read_continue(token)
            rv = first_rv  # every page reports the first page's version, as kube's snapshot does
            metadata["resourceVersion"] = str(rv)
            items = [o for o in items if _list_position(o) > start]
        if limit and len(items) > limit:
            items = items[:limit]
            metadata["continue"] = _continue_token(_list_position(items[-1]), rv)
        return ApiResponse(
            200,
            {
                "kind": f"{target.resource.kind}List",
                "apiVersion": target.resource.api_version,
                "metadata": metadata,
                "items": [
                    {k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items
                ],
            },
        )

    def _start_watch(
        self, request: ApiRequest, resource: ResourceType, selection: ObjectFilter
    ) -> ApiResponse:
        query = request.query
        raw_rv = query.get("resourceVersion", "")
        initial = _flag(query.get("sendInitialEvents"))
        bookmarks = _flag(query.get("allowWatchBookmarks"))
        since: int | None = None
        if raw_rv not in ("", "0") and not initial:
            try:
                since = int(raw_rv)
            except ValueError as exc:
                raise errors.bad_request(f"invalid resource version: {raw_rv!r}") from exc
        try:
            timeout = float(query.get("timeoutSeconds") or 0) or _DEFAULT_WATCH_TIMEOUT_S
        except ValueError as exc:
            raise errors.bad_request("invalid timeoutSeconds") from exc
        try:
            watcher = self._store.watch(
                resource, selection, since=since, initial_events_end=initial and bookmarks
            )
        except errors.ApiError as exc:
            if exc.code != 410:
                raise
            return ApiResponse(200, stream=expired_stream(exc))
        stream = watch_stream(
            self._store, watcher, timeout=timeout, bookmarks=bookmarks, options=self._watch
        )
        return ApiResponse(200, stream=stream)

    # --- writes ---------------------------------------------------------------------------------

    def _body(self, request: ApiRequest, target: Target) -> JsonObj:
        obj = _decode(request)
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        resource = target.resource
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version and api_version != resource.api_version:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({resource.api_version})"
            )
        if kind and kind != resource.kind:
            raise errors.bad_request(
                f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})"
            )
        metadata = obj.get("metadata")
        if metadata is None:
            obj["metadata"] = metadata = {}
        if not isinstance(metadata, dict):
            raise errors.bad_request("metadata must be a JSON object")
        body_ns = metadata.get("namespace")
        if resource.namespaced and body_ns and body_ns != target.namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the "
                "namespace sent on the request"
            )
        return obj

    def _create(self, request: ApiRequest, target: Target) -> ApiResponse:
        resource = target.resource
        if resource.namespaced and target.namespace is None:
            raise errors.method_not_allowed("POST")
        if target.subresource:
            raise errors.method_not_allowed("POST")
        _refuse_dry_run(request)
        obj = self._body(request, target)
        if meta(obj).get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        namespace = target.namespace or ""
        if resource.namespaced:
            obj["metadata"]["namespace"] = namespace
        name = str(meta(obj).get("name") or "")
        obj = self._admit(
            Attributes(resource, "", "CREATE", namespace, name),
            {**obj, "apiVersion": resource.api_version, "kind": resource.kind},
            None,
        )
        return ApiResponse(201, self._store.create(resource, namespace, obj))

    def _update(self, request: ApiRequest, target: Target) -> ApiResponse:
        _refuse_dry_run(request)
        self._check_subresource(target)
        obj = self._body(request, target)
        name = str(target.name)
        if meta(obj).get("name") != name:
            raise errors.bad_request(
                f"the name of the object ({meta(obj).get('name')}) does not "
                f"match the name on the URL ({name})"
            )
        namespace = target.namespace or ""
        old = self._store.get(target.resource, namespace, name)
        if target.resource.namespaced:
            obj["metadata"]["namespace"] = namespace
        obj = self._admit_update(target, obj, old)
        stored = self._store.update(
            target.resource, namespace, name, obj, subresource=target.subresource or None
        )
        return ApiResponse(200, stored)

    def _patch(self, request: ApiRequest, target: Target) -> ApiResponse:
        _refuse_dry_run(request)
        self._check_subresource(target)
        content_type = request.content_type.split(";")[0].strip()
        if content_type not in (patch.MERGE_PATCH, patch.STRATEGIC_MERGE_PATCH, patch.JSON_PATCH):
            raise errors.unsupported_media_type(content_type)
        try:
            document = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"error decoding patch: {exc}") from exc
        namespace, name = target.namespace or "", str(target.name)
        for _ in range(_PATCH_RETRIES):
            old = self._store.get(target.resource, namespace, name)
            patched = _apply_patch(content_type, old, document)
            old_rv = meta(old).get("resourceVersion")
            patched_meta = patched.setdefault("metadata", {})
            if patched_meta.get("resourceVersion") not in (None, old_rv):
                raise errors.conflict(target.resource, name, errors.STALE)
            patched_meta.update(name=name, resourceVersion=old_rv)
            if target.resource.namespaced:
                patched_meta["namespace"] = namespace
            patched = self._admit_update(target, patched, old)
            try:
                stored = self._store.update(
                    target.resource,
                    namespace,
                    name,
                    patched,
                    subresource=target.subresource or None,
                    expect_rv=str(old_rv),
                )
            except errors.ApiError as exc:
                if exc.reason == "Conflict":
                    continue  # changed meanwhile: patch the newer state, as kube does
                raise
            return ApiResponse(200, stored)
        raise errors.conflict(target.resource, name, errors.STALE)

    def _admit_update(self, target: Target, obj: JsonObj, old: JsonObj) -> JsonObj:
        resource = target.resource
        attributes = Attributes(
            resource, target.subresource, "UPDATE", target.namespace or "", str(target.name)
        )
        typed = {**obj, "apiVersion": resource.api_version, "kind": resource.kind}
        return self._admit(attributes, typed, old)

    def _admit(self, attributes: Attributes, obj: JsonObj, old: JsonObj | None) -> JsonObj:
        """kube-apiserver's admission chain as far as this server runs it: the built-in
        ``Priority`` plugin, the mutating webhooks, then the plugin's validating half."""
        obj = self._priority.admit(attributes, obj, old)
        obj = self._admission.admit(attributes, obj, old)
        self._priority.validate(attributes, obj, old)
        return obj

    def _check_subresource(self, target: Target) -> None:
        if target.subresource not in ("", "status"):
            raise errors.method_not_allowed(target.subresource)

    def _delete_options(self, request: ApiRequest) -> JsonObj:
        options: JsonObj = {}
        if request.body.strip():
            try:
                parsed = json.loads(request.body)
            except (ValueError, UnicodeDecodeError) as exc:
                raise errors.bad_request(f"error decoding DeleteOptions: {exc}") from exc
            if isinstance(parsed, dict):
                options = parsed
        for key in ("propagationPolicy", "gracePeriodSeconds"):
            if key in request.query:
                options[key] = request.query[key]
        if _flag(request.query.get("orphanDependents")) or options.get("orphanDependents"):
            options.setdefault("propagationPolicy", "Orphan")
        return options

    def _delete(self, request: ApiRequest, target: Target) -> ApiResponse:
        _refuse_dry_run(request)
        if target.subresource:
            raise errors.method_not_allowed("DELETE")
        if target.resource is PRIORITY_CLASSES:
            refuse_system_class_delete(str(target.name))
        options = self._delete_options(request)
        preconditions = options.get("preconditions") or {}
        grace = options.get("gracePeriodSeconds")
        deleted = self._store.delete(
            target.resource,
            target.namespace or "",
            str(target.name),
            propagation=options.get("propagationPolicy"),
            precondition_uid=preconditions.get("uid"),
            precondition_rv=preconditions.get("resourceVersion"),
            grace_seconds=int(grace) if grace is not None else None,
        )
        return ApiResponse(200, deleted)

    def _delete_collection(self, request: ApiRequest, target: Target) -> ApiResponse:
        _refuse_dry_run(request)
        options = self._delete_options(request)
        items, _ = self._store.list_objects(target.resource, self._selection(request, target))
        deleted = []
        for item in items:
            try:
                deleted.append(
                    self._store.delete(
                        target.resource,
                        str(meta(item).get("namespace") or ""),
                        str(meta(item)["name"]),
                        propagation=options.get("propagationPolicy"),
                    )
                )
            except errors.ApiError as exc:
                if exc.code != 404:
                    raise
        return ApiResponse(
            200,
            {
                "kind": f"{target.resource.kind}List",
                "apiVersion": target.resource.api_version,
                "metadata": {"resourceVersion": str(self._store.resource_version)},
                "items": deleted,
            },
        )

    # --- pods/binding ---------------------------------------------------------------------------

    def _legacy_binding(self, request: ApiRequest, target: Target) -> ApiResponse:
        if request.method != "POST" or target.namespace is None or target.name is not None:
            raise errors.method_not_allowed(request.method)
        body = json.loads(request.body or b"{}") if request.body.strip() else {}
        name = str(meta(body).get("name") or "") if isinstance(body, dict) else ""
        pod_target = Target(PODS, target.namespace, name, "binding", watch_path=False)
        return self._bind(request, pod_target, name)

    def _bind(self, request: ApiRequest, target: Target, name: str) -> ApiResponse:
        if target.resource is not PODS or target.namespace is None:
            raise errors.method_not_allowed("POST")
        try:
            binding = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc
        if not isinstance(binding, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        node = bind_pod(self._store, target.namespace, name, binding)
        log.debug("bound pod %s/%s to %s", target.namespace, name, node)
        return ApiResponse(
            201,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
        )

    # --- pods/eviction ---------------------------------------------------------------------------

    def _evict(self, request: ApiRequest, target: Target, name: str) -> ApiResponse:
        """``policy/v1`` Eviction: the pod deleted with the eviction's delete options, unless a
        PodDisruptionBudget refuses (429); see ``localcluster.policy.eviction``."""
        if target.resource is not PODS or target.namespace is None:
            raise errors.method_not_allowed("POST")
        _refuse_dry_run(request)
        try:
            eviction = json.loads(request.body or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc
        if not isinstance(eviction, dict) or eviction.get("kind") != "Eviction":
            raise errors.bad_request("the body of the request must be an Eviction object")
        evicted = meta(eviction).get("name")
        if evicted and evicted != name:
            raise errors.bad_request(
                f"name in URL does not match name in Eviction object: {evicted}"
            )
        options = EvictionOptions.from_delete_options(eviction.get("deleteOptions"))
        status = evict_pod(self._store, namespace=target.namespace, name=name, options=options)
        return ApiResponse(int(status["code"]), status)


def _decode(request: ApiRequest) -> Any:
    """A create/update body: JSON, or YAML as kube also accepts; anything else is 415."""
    content_type = request.content_type.split(";")[0].strip().lower()
    if content_type in ("application/yaml", "application/x-yaml"):
        try:
            return yaml.safe_load(request.body or b"null")
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"yaml parse error: {exc}") from exc
    if content_type not in ("", "application/json", "*/*"):
        raise errors.unsupported_media_type(content_type)
    try:
        return json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


def _limit(value: str | None) -> int:
    """``limit``: at most this many items, then a ``continue`` token (0 or absent: all)."""
    if not value:
        return 0
    try:
        limit = int(value)
    except ValueError as exc:
        raise errors.bad_request(f"invalid limit: {value!r}") from exc
    if limit < 0:
        raise errors.bad_request("limit must not be negative")
    return limit


def _list_position(obj: JsonObj) -> tuple[str, str]:
    """Where an object sits in a list: lists are in (namespace, name) order."""
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def _continue_token(after: tuple[str, str], rv: int) -> str:
    """Opaque to clients, as kube's: the last position sent and the first page's version.
    Later pages list the store as it is then, not a snapshot (kube serves a snapshot): an informer
    still converges, since its watch from the first page's version replays every change since."""
    raw = json.dumps({"rv": rv, "namespace": after[0], "name": after[1]}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _read_continue(token: str) -> tuple[tuple[str, str], int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return (str(data["namespace"]), str(data["name"])), int(data["rv"])
    except (ValueError, KeyError, TypeError) as exc:
        raise errors.bad_request(f"invalid continue token: {token!r}") from exc


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _refuse_dry_run(request: ApiRequest) -> None:
    if request.query.get("dryRun"):
        raise errors.bad_request("dryRun is not supported by the local API server")


def _apply_patch(content_type: str, old: JsonObj, document: Any) -> JsonObj:
    if content_type == patch.JSON_PATCH:
        result = patch.json_patch(old, document)
    elif content_type == patch.STRATEGIC_MERGE_PATCH:
        result = patch.strategic_merge_patch(old, document)
    else:
        if not isinstance(document, dict):
            raise errors.bad_request("merge patch must be a JSON object")
        result = patch.merge_patch(old, document)
    if not isinstance(result, dict):
        raise errors.ApiError(422, "Invalid", "the patch turned the object into a non-object")
    return result
