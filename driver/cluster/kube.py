"""``ClusterApi`` on the official ``kubernetes`` client — the only module that imports it.

We use the client for what it does well (kubeconfig / in-cluster loading, TLS and token auth, the
urllib3 connection pool) and talk to the REST paths ourselves: the client adds the auth headers,
and the request goes straight to its urllib3 connection pool for the API server with the body
encoded by ``orjson``; responses are decoded by ``orjson`` too. The bodies stay
the wire JSON (no round trip through generated models that drop fields they do not know, like newer
``resource.k8s.io/v1`` ones), one code path serves every resource, and the client's own per-request
work — a recursive ``sanitize_for_serialization`` of the body, ``json.dumps``, the pool manager's
URL parsing and pool lookup — is skipped: it would be most of the controller's CPU per placed pod.
Past a proxy-less pool, urllib3's own per-request work is skipped too: requests and watch bodies are
exchanged on the pool's connected sockets by ``kube_http``. A watch response is read by
``kube_watch.KubeWatchStream``; Status bodies become our errors in ``kube_wire`` (all plain Python,
no ``kubernetes`` import).
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson
import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from driver.closing import ClosedOnExit
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.kube_http import FastHttp
from driver.cluster.kube_watch import KubeWatchStream
from driver.cluster.kube_wire import status_error, with_kind
from driver.cluster.port import (
    PODS,
    JsonObject,
    ObjectList,
    ObjectTransform,
    PatchType,
    Resource,
    name_of,
    namespace_of,
    resource_version_of,
)
from driver.cluster.throttle import ClientSettings, TokenBucket
from driver.errors import ClusterError, ConfigError

logger = logging.getLogger(__name__)

_SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
_WATCH_READ_SLACK_S = 30.0
_WATCH_DEFAULT_TIMEOUT_S = 300


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
    except (ConfigException, OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot load Kubernetes client configuration: {exc}") from exc
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        # The client's loader walks the file's YAML as it finds it: a malformed kubeconfig (a
        # list where a mapping belongs, a number for a name) fails with whatever the walk hits.
        raise ConfigError(
            f"cannot load Kubernetes client configuration: malformed kubeconfig "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return configuration


def check_server_url(url: str) -> None:
    """``ConfigError`` unless ``url`` is an ``http``/``https`` URL with a host (and a valid port)."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError as exc:
        raise ConfigError(f"API server URL {url!r} is not valid: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ConfigError(
            f"API server URL {url!r} is not http(s)://HOST[:PORT] (e.g. https://10.0.0.1:6443)"
        )


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
        check_server_url(url)
        configuration = configuration_for_url(url)
    else:
        configuration = load_configuration(kubeconfig=kubeconfig, context=context)
        check_server_url(str(configuration.host))
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
        host = urlsplit(str(configuration.host))
        self._origin = f"{host.scheme}://{host.netloc}"
        self._base_path = host.path.rstrip("/")
        # One connection pool for the API server, used directly: the pool manager's per-request
        # URL parsing and pool lookup cost more CPU than the rest of a request. Through a proxy
        # the pool manager keeps doing it (it needs the whole URL).
        self._pool: Any = (
            None
            if configuration.proxy
            else self._client.rest_client.pool_manager.connection_from_url(self._origin)
        )
        # Ordinary requests skip urllib3's per-request machinery too (``kube_http``); watches
        # stream through urllib3, and a proxy keeps everything there.
        self._fast: FastHttp | None = (
            None
            if self._pool is None
            else FastHttp(
                pool=self._pool,
                netloc=host.netloc.rpartition("@")[2],
                maxsize=self._settings.connection_pool_maxsize,
                connect_timeout=self._settings.connect_timeout,
                read_timeout=self._settings.request_timeout,
            )
        )
        self._bucket = TokenBucket(
            qps=self._settings.qps, burst=self._settings.burst, clock=clock or SystemClock()
        )

    @property
    def host(self) -> str:
        return str(self._client.configuration.host)

    def close(self) -> None:
        if self._fast is not None:
            self._fast.close()
        self._client.close()  # type: ignore[no-untyped-call]

    # -- ClusterApi -------------------------------------------------------------------------

    def get(self, resource: Resource, *, name: str, namespace: str | None = None) -> JsonObject:
        path = resource.path(namespace=namespace, name=name)
        return with_kind(resource, self._json("GET", path))

    def list_objects(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
        transform: ObjectTransform | None = None,
    ) -> ObjectList:
        path = resource.path(namespace=namespace)
        items: list[JsonObject] = []
        list_version = ""
        continue_token = ""
        while True:
            query = _selectors(label_selector, field_selector)
            query.append(("limit", str(page_size or self._settings.page_size)))
            if continue_token:
                query.append(("continue", continue_token))
            page = self._json("GET", path, query=query)
            list_meta = page.get("metadata") or {}
            if not list_version:
                list_version = str(list_meta.get("resourceVersion", ""))
            kinded = (with_kind(resource, item) for item in page.get("items") or [])
            items.extend(kinded if transform is None else map(transform, kinded))
            del page
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
        if self._fast is not None:
            target, block, _ = self._prepare("GET", path, query=query)
            try:
                status, body = self._fast.stream(
                    target, block, read_timeout=timeout + _WATCH_READ_SLACK_S
                )
            except ClusterError as exc:
                raise ClusterError(f"GET {path}: {exc}") from exc
            if isinstance(body, bytes):
                raise status_error("GET", path, status, body)
            return KubeWatchStream(resource=resource, response=body, path=path)
        response = self._send(
            "GET",
            path,
            query=query,
            timeout=(self._settings.connect_timeout, timeout + _WATCH_READ_SLACK_S),
        )
        if not 200 <= response.status <= 299:
            body = _drain(response)
            raise status_error("GET", path, response.status, body)
        return KubeWatchStream(resource=resource, response=response, path=path)

    def create(
        self, resource: Resource, obj: JsonObject, *, namespace: str | None = None
    ) -> JsonObject:
        namespace = namespace if namespace is not None else _namespace_for(resource, obj)
        path = resource.path(namespace=namespace)
        return with_kind(resource, self._json("POST", path, body=with_kind(resource, obj)))

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
        return with_kind(resource, result)

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

    def evict(self, *, name: str, namespace: str, uid: str | None = None) -> None:
        eviction: JsonObject = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid is not None:
            eviction["deleteOptions"] = {"preconditions": {"uid": uid}}
        path = PODS.path(namespace=namespace, name=name, subresource="eviction")
        self._json("POST", path, body=eviction)

    # -- beyond the port -------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        accept: str = "application/json",
    ) -> bytes:
        """One request by path, the response body as it came (``/metrics`` text, a delete of a
        collection): for tools and benchmarks; daemons use the ``ClusterApi`` methods."""
        status, data = self._exchange(method, path, query=query, body=body, accept=accept)
        if not 200 <= status <= 299:
            raise status_error(method, path, status, data)
        return data

    # -- plumbing ---------------------------------------------------------------------------

    def _put(self, resource: Resource, obj: JsonObject, *, subresource: str | None) -> JsonObject:
        if not resource_version_of(obj):
            raise ValueError("an update needs metadata.resourceVersion (optimistic concurrency)")
        path = resource.path(
            namespace=_namespace_for(resource, obj), name=name_of(obj), subresource=subresource
        )
        return with_kind(resource, self._json("PUT", path, body=with_kind(resource, obj)))

    def _json(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        status, data = self._exchange(
            method, path, query=query, body=body, content_type=content_type
        )
        if not 200 <= status <= 299:
            raise status_error(method, path, status, data)
        try:
            decoded = orjson.loads(data) if data else {}
        except ValueError as exc:
            raise ClusterError(f"{method} {path}: response is not JSON") from exc
        if not isinstance(decoded, dict):
            raise ClusterError(f"{method} {path}: response is not a JSON object")
        return decoded

    def _exchange(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        """(status, body) of one ordinary request, read whole."""
        fast = self._fast
        if fast is None:
            response = self._send(
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                accept=accept,
                timeout=(self._settings.connect_timeout, self._settings.request_timeout),
            )
            return int(response.status), _drain(response)
        target, block, payload = self._prepare(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        try:
            return fast.request(method, target, block, payload)
        except ClusterError as exc:
            raise ClusterError(f"{method} {path}: {exc}") from exc

    def _prepare(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[str, bytes, bytes | None]:
        """(request target, header lines, encoded body) for ``kube_http``, after the client-side
        rate limit."""
        target, headers, payload = self._request_parts(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        block = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        return target, block.encode("latin-1"), payload

    def _request_parts(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None,
        body: object,
        content_type: str,
        accept: str,
    ) -> tuple[str, dict[str, str], bytes | None]:
        """(request target, headers with the client's auth, encoded body), after the client-side
        rate limit: what both request paths send."""
        self._bucket.acquire()
        headers = {**self._client.default_headers, "Accept": accept}
        payload = None
        if body is not None:
            headers["Content-Type"] = content_type
            payload = orjson.dumps(body)
        target = self._base_path + path
        if query:
            target += "?" + urlencode(query)
        try:
            # the client's auth (a refreshed token, when its configuration has a refresh hook)
            self._client.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)
        except ApiException as exc:
            raise ClusterError(f"{method} {path}: {exc}") from exc
        return target, headers, payload

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: tuple[float, float],
    ) -> Any:
        target, headers, payload = self._request_parts(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        try:
            timeouts = urllib3.Timeout(connect=timeout[0], read=timeout[1])
            if self._pool is not None:
                return self._pool.urlopen(
                    method,
                    target,
                    body=payload,
                    headers=headers,
                    timeout=timeouts,
                    preload_content=False,
                )
            return self._client.rest_client.pool_manager.request(
                method,
                self._origin + target,
                body=payload,
                headers=headers,
                timeout=timeouts,
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError, ApiException) as exc:
            raise ClusterError(f"{method} {path}: {exc}") from exc


def _drain(response: Any) -> bytes:
    try:
        return bytes(response.read() or b"")
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ClusterError(f"reading response: {exc}") from exc


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
