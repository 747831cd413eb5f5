"""``ClusterApi`` on the official ``kubernetes`` client — the only module that imports it.

We use the client for what it does well (kubeconfig / in-cluster loading, TLS and token auth, the
urllib3 connection pool) and talk to the REST paths ourselves through ``ApiClient.call_api``: the
bodies stay the wire JSON (no round trip through generated models that drop fields they do not
know, like newer ``resource.k8s.io/v1`` ones), and one code path serves every resource.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from driver.closing import ClosedOnExit
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.port import (
    JsonObject,
    ObjectList,
    PatchType,
    Resource,
    WatchEvent,
    WatchEventType,
    name_of,
    namespace_of,
    resource_version_of,
)
from driver.cluster.throttle import ClientSettings, TokenBucket
from driver.errors import (
    AlreadyExistsError,
    ApiNotFoundError,
    ClusterError,
    ConfigError,
    ConflictError,
    GoneError,
    InvalidError,
)

logger = logging.getLogger(__name__)

_SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
_WATCH_READ_SLACK_S = 30.0
_WATCH_DEFAULT_TIMEOUT_S = 300
_READ_SIZE = 65536


def load_configuration(*, kubeconfig: str | None = None, context: str | None = None) -> Any:
    """The client ``Configuration``: in-cluster when no kubeconfig is named and we run in a pod,
    else the kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config`` when ``kubeconfig`` is None)."""
    configuration = k8s_client.Configuration()
    try:
        if kubeconfig is None and os.environ.get(_SERVICE_HOST_ENV):
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (ConfigException, OSError) as exc:
        raise ConfigError(f"cannot load Kubernetes client configuration: {exc}") from exc
    return configuration


def configuration_for_url(url: str, *, token: str | None = None, verify_tls: bool = True) -> Any:
    """A client ``Configuration`` for a plain server URL (the local API server, tests, the demo)."""
    configuration = k8s_client.Configuration()
    configuration.host = url.rstrip("/")
    configuration.verify_ssl = verify_tls
    if token is not None:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return configuration


def connect(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    url: str | None = None,
    settings: ClientSettings | None = None,
) -> KubeClusterApi:
    """The adapter for a daemon's ``main``: ``url`` if given, else as ``load_configuration``."""
    if url is not None:
        configuration = configuration_for_url(url)
    else:
        configuration = load_configuration(kubeconfig=kubeconfig, context=context)
    return KubeClusterApi(configuration=configuration, settings=settings)


class KubeClusterApi(ClosedOnExit):
    """``ClusterApi`` over HTTP. Thread-safe; close it (or use ``with``) to drop its connections."""

    def __init__(
        self,
        *,
        configuration: Any,
        settings: ClientSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._settings = settings or ClientSettings()
        configuration.connection_pool_maxsize = self._settings.connection_pool_maxsize
        # Retry only what cannot have reached the server (connect errors) and, for idempotent
        # methods, one dropped kept-alive connection; never replay on a status code.
        configuration.retries = urllib3.Retry(
            total=3, connect=3, read=1, status=0, redirect=0, other=0, raise_on_status=False
        )
        self._client = k8s_client.ApiClient(configuration=configuration)
        self._client.user_agent = self._settings.user_agent
        self._bucket = TokenBucket(
            qps=self._settings.qps, burst=self._settings.burst, clock=clock or SystemClock()
        )

    @property
    def host(self) -> str:
        return str(self._client.configuration.host)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    # -- ClusterApi -------------------------------------------------------------------------

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> JsonObject:
        path = resource.path(namespace=namespace, name=name)
        return _with_kind(resource, self._json("GET", path))

    def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        path = resource.path(namespace=namespace)
        items: list[JsonObject] = []
        list_version = ""
        continue_token = ""
        while True:
            query = _selectors(label_selector, field_selector)
            query.append(("limit", str(self._settings.page_size)))
            if continue_token:
                query.append(("continue", continue_token))
            page = self._json("GET", path, query=query)
            list_meta = page.get("metadata") or {}
            if not list_version:
                list_version = str(list_meta.get("resourceVersion", ""))
            items.extend(_with_kind(resource, item) for item in page.get("items") or [])
            continue_token = str(list_meta.get("continue") or "")
            if not continue_token:
                return ObjectList(items=items, resource_version=list_version)

    def watch(
        self,
        resource: Resource,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
    ) -> KubeWatchStream:
        timeout = timeout_seconds if timeout_seconds is not None else _WATCH_DEFAULT_TIMEOUT_S
        query = _selectors(label_selector, field_selector)
        query += [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout)),
        ]
        if allow_bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        path = resource.path(namespace=namespace)
        response = self._send(
            "GET",
            path,
            query=query,
            timeout=(self._settings.connect_timeout, timeout + _WATCH_READ_SLACK_S),
        )
        if not 200 <= response.status <= 299:
            body = _drain(response)
            raise _status_error("GET", path, response.status, body)
        return KubeWatchStream(resource=resource, response=response, path=path)

    def create(
        self, resource: Resource, obj: JsonObject, *, namespace: str | None = None
    ) -> JsonObject:
        namespace = namespace if namespace is not None else _namespace_for(resource, obj)
        path = resource.path(namespace=namespace)
        return _with_kind(resource, self._json("POST", path, body=_with_kind(resource, obj)))

    def update(self, resource: Resource, obj: JsonObject) -> JsonObject:
        return self._put(resource, obj, subresource=None)

    def update_status(self, resource: Resource, obj: JsonObject) -> JsonObject:
        return self._put(resource, obj, subresource="status")

    def patch(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        patch: JsonObject | list[JsonObject],
        patch_type: PatchType,
        subresource: str | None = None,
    ) -> JsonObject:
        if (patch_type is PatchType.JSON) != isinstance(patch, list):
            raise ValueError("a JSON patch is a list of operations; merge patches are objects")
        path = resource.path(namespace=namespace, name=name, subresource=subresource)
        result = self._json("PATCH", path, body=patch, content_type=patch_type.value)
        return _with_kind(resource, result)

    def delete(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
    ) -> None:
        options: JsonObject = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {
            key: value
            for key, value in (("uid", uid), ("resourceVersion", resource_version))
            if value is not None
        }
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        self._json("DELETE", resource.path(namespace=namespace, name=name), body=options)

    # -- plumbing ---------------------------------------------------------------------------

    def _put(self, resource: Resource, obj: JsonObject, *, subresource: str | None) -> JsonObject:
        if not resource_version_of(obj):
            raise ValueError("an update needs metadata.resourceVersion (optimistic concurrency)")
        path = resource.path(
            namespace=_namespace_for(resource, obj), name=name_of(obj), subresource=subresource
        )
        return _with_kind(resource, self._json("PUT", path, body=_with_kind(resource, obj)))

    def _json(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        response = self._send(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            timeout=(self._settings.connect_timeout, self._settings.request_timeout),
        )
        data = _drain(response)
        if not 200 <= response.status <= 299:
            raise _status_error(method, path, response.status, data)
        try:
            decoded = json.loads(data) if data else {}
        except ValueError as exc:
            raise ClusterError(f"{method} {path}: response is not JSON") from exc
        if not isinstance(decoded, dict):
            raise ClusterError(f"{method} {path}: response is not a JSON object")
        return decoded

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
        timeout: tuple[float, float],
    ) -> Any:
        self._bucket.acquire()
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            request = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self._client.call_api(*request, _request_timeout=timeout)
        except (urllib3.exceptions.HTTPError, OSError, ApiException) as exc:
            raise ClusterError(f"{method} {path}: {exc}") from exc


class KubeWatchStream(ClosedOnExit):
    """One watch response read line by line; ``close`` from any thread ends the iteration."""

    def __init__(self, *, resource: Resource, response: Any, path: str) -> None:
        self._resource = resource
        self._raw = response.response
        self._path = path
        self._lock = threading.Lock()
        self._closed = False
        self._reading = False
        self._released = False

    def __iter__(self) -> Iterator[WatchEvent]:
        with self._lock:
            if self._closed:
                self._release()
                return
            self._reading = True
        buffer = b""
        try:
            while not self._is_closed():
                try:
                    chunk = self._raw.read1(_READ_SIZE)
                except Exception as exc:
                    # after close() from another thread, http.client fails in assorted ways
                    if self._is_closed():
                        return
                    raise ClusterError(f"watch {self._path}: {exc}") from exc
                if not chunk:
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = self._decode(line)
                    if event is not None:
                        yield event
        finally:
            with self._lock:
                self._closed = True
                self._reading = False
                self._release()

    def _decode(self, line: bytes) -> WatchEvent | None:
        if not line.strip():
            return None
        try:
            frame = json.loads(line)
            kind = str(frame["type"])
            obj = frame["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(f"watch {self._path}: malformed event {line[:200]!r}") from exc
        if kind == "ERROR":
            code = int(obj.get("code") or 500) if isinstance(obj, dict) else 500
            raise _status_error("WATCH", self._path, code, json.dumps(obj).encode())
        try:
            event_type = WatchEventType(kind)
        except ValueError:
            logger.warning("watch %s: ignoring event of unknown type %s", self._path, kind)
            return None
        if event_type is not WatchEventType.BOOKMARK:
            obj = _with_kind(self._resource, obj)
        return WatchEvent(type=event_type, object=obj)

    @property
    def closed(self) -> bool:
        return self._is_closed()

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._reading:
                self._release()
                return
        # A reader is blocked in another thread: wake it by shutting the socket down; the reader
        # then releases the response itself.
        try:
            if getattr(self._raw, "_sock_shutdown", None) is not None:
                self._raw.shutdown()
        except (OSError, RuntimeError, ValueError):
            logger.debug("watch %s: socket already gone", self._path)

    def _release(self) -> None:
        """Close the response (a half-read watch must never go back to the pool); lock held."""
        if self._released:
            return
        self._released = True
        self._raw.close()
        self._raw.release_conn()


def _drain(response: Any) -> bytes:
    try:
        return bytes(response.read() or b"")
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterError(f"reading response: {exc}") from exc


def _status_error(method: str, path: str, code: int, body: bytes) -> ClusterError:
    """Map an API ``Status`` to our error tree; the message keeps the server's own words."""
    reason = ""
    message = body.decode("utf-8", "replace")[:500]
    try:
        status = json.loads(body)
        if isinstance(status, dict):
            reason = str(status.get("reason") or "")
            message = str(status.get("message") or message)
    except ValueError:
        pass
    text = f"{method} {path}: {code} {reason}: {message}".replace(" : ", ": ")
    error: ClusterError
    if code == 409:
        error = AlreadyExistsError(text) if reason == "AlreadyExists" else ConflictError(text)
    elif code == 404:
        error = ApiNotFoundError(text)
    elif code in (400, 422):
        error = InvalidError(text)
    elif code == 410:
        error = GoneError(text)
    else:
        error = ClusterError(text)
        if code in (401, 403, 405, 406, 415):
            error.retryable = False
    return error


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    query: list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _namespace_for(resource: Resource, obj: JsonObject) -> str | None:
    if not resource.namespaced:
        return None
    namespace = namespace_of(obj)
    if namespace is None:
        raise ValueError(f"{resource.kind} {name_of(obj)!r} has no metadata.namespace")
    return namespace


def _with_kind(resource: Resource, obj: JsonObject) -> JsonObject:
    """List items come without ``kind``/``apiVersion``; give every object both, as watches do."""
    if obj.get("kind") != resource.kind or obj.get("apiVersion") != resource.api_version:
        obj = {"apiVersion": resource.api_version, "kind": resource.kind, **obj}
        obj["apiVersion"] = resource.api_version
        obj["kind"] = resource.kind
    return obj
