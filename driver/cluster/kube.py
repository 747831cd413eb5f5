"""``ClusterApi`` on the ``kubernetes`` client and urllib3: the only module that imports either.

The ``kubernetes`` client does what it does well: kubeconfig and in-cluster loading, TLS (CA bundle,
client certificate, hostname check) and bearer-token auth, including the ServiceAccount token file
it re-reads as the kubelet rotates it (the configuration's refresh hook, which
``update_params_for_auth`` calls for every request). Its generated API classes are not used: we
talk to the REST paths with the wire JSON, encoded and decoded by ``orjson``, so one code path
serves every resource and no field a generated model does not know (newer ``resource.k8s.io/v1``
ones) is dropped.

HTTP is urllib3's, the client's own transport: every request goes to the connection pool that the
client's ``PoolManager`` made for the API server, with its TLS set-up, and one ``Retry`` and one
``Timeout`` built here once. urllib3 keeps connections alive and checks that a pooled one was not
dropped before reusing it, reads ``Content-Length``, chunked and close-delimited bodies (through
``http.client``), and retries connect errors and, for idempotent methods, one failed exchange, never
on a status code. A watch is the same request with its body streamed (``kube_watch``). Chosen over
httpx: TLS, client certificates and proxies are configured once, by the client, for the very pool
we use, and no second HTTP stack (httpx brings httpcore, h11 and anyio) joins the installed
packages. Through a proxy the client's ``ProxyManager`` takes whole URLs instead. Status bodies
become our errors in ``kube_wire`` (plain Python, no ``kubernetes`` import).
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

import orjson
import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from api import wire
from driver.closing import ClosedOnExit
from driver.cluster.clock import Clock, SystemClock
from driver.cluster.kube_watch import KubeWatchStream
from driver.cluster.kube_wire import status_error, with_kind
from driver.cluster.port import (
    PODS,
    Body,
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
        # methods, one failed exchange (a kept-alive connection the server dropped); never replay
        # on a status code, never follow a redirect. Built once: urllib3 copies it only on a retry.
        self._retries = urllib3.Retry(
            total=3, connect=3, read=1, status=0, redirect=0, other=0, raise_on_status=False
        )
        configuration.retries = self._retries
        # TCP keepalive probes as client-go asks for them (an idle watch behind a proxy or load
        # balancer that dropped it is noticed), unless the configuration names its own options
        configuration.keep_alive = True
        self._timeout = urllib3.Timeout(
            connect=self._settings.connect_timeout, read=self._settings.request_timeout
        )
        self._client = k8s_client.ApiClient(configuration=configuration)
        self._client.user_agent = self._settings.user_agent
        host = urlsplit(str(configuration.host))
        self._base_path = host.path.rstrip("/")
        origin = f"{host.scheme}://{host.netloc}"
        pool_manager = self._client.rest_client.pool_manager
        # Without a proxy, the one connection pool for the API server, looked up once; a proxy
        # manager needs whole URLs (it picks the proxy's pool per request).
        self._opener: Any
        if configuration.proxy:
            self._opener, self._url_prefix = pool_manager, origin
        else:
            self._opener, self._url_prefix = pool_manager.connection_from_url(origin), ""
        self._headers = dict(self._client.default_headers)
        """The client's headers for every request (its user agent); accept, content type and
        auth are added per request."""
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
            # the API server's own list envelope: typed as it sends it
            page = cast(wire.ObjectListBody, self._json("GET", path, query=query))
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
        response = self._urlopen(
            "GET",
            path,
            query=query,
            timeout=urllib3.Timeout(
                connect=self._settings.connect_timeout, read=timeout + _WATCH_READ_SLACK_S
            ),
            stream=True,
        )
        if not 200 <= response.status <= 299:
            raise status_error("GET", path, response.status, _read_whole(response, path))
        return KubeWatchStream(resource=resource, response=response, path=path)

    def create(self, resource: Resource, obj: Body, *, namespace: str | None = None) -> JsonObject:
        namespace = namespace if namespace is not None else _namespace_for(resource, obj)
        path = resource.path(namespace=namespace)
        return with_kind(resource, self._json("POST", path, body=with_kind(resource, obj)))

    def update(self, resource: Resource, obj: Body) -> JsonObject:
        return self._put(resource, obj, subresource=None)

    def update_status(self, resource: Resource, obj: Body) -> JsonObject:
        return self._put(resource, obj, subresource="status")

    def patch(
        self,
        resource: Resource,
        *,
        name: str,
        namespace: str | None = None,
        patch: Body | list[wire.JsonPatchOperation],
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
        options: wire.DeleteOptions = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions: wire.Preconditions = {}
        if uid is not None:
            preconditions["uid"] = uid
        if resource_version is not None:
            preconditions["resourceVersion"] = resource_version
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        self._json("DELETE", resource.path(namespace=namespace, name=name), body=options)

    def evict(self, *, name: str, namespace: str, uid: str | None = None) -> None:
        eviction: wire.Eviction = {
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

    def _put(self, resource: Resource, obj: Body, *, subresource: str | None) -> JsonObject:
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
        response = self._urlopen(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            accept=accept,
            timeout=self._timeout,
            stream=False,
        )
        return response.status, response.data

    def _urlopen(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: urllib3.Timeout,
        stream: bool,
    ) -> urllib3.BaseHTTPResponse:
        """One request through urllib3, after the client-side rate limit: the response read
        whole and its connection back in the pool, or (``stream``) holding its connection with
        the body unread. Network and TLS failures, after urllib3's retries, are ``ClusterError``s."""
        self._bucket.acquire()
        headers = {**self._headers, "Accept": accept}
        payload = None
        if body is not None:
            headers["Content-Type"] = content_type
            payload = orjson.dumps(body)
        url = self._url_prefix + self._base_path + path
        if query:
            url += "?" + urlencode(query)
        try:
            # the client's auth: its configuration's token, refreshed by its hook when it has one
            # (the ServiceAccount token file, an exec plugin's token)
            self._client.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)
            response: urllib3.BaseHTTPResponse = self._opener.urlopen(
                method,
                url,
                body=payload,
                headers=headers,
                retries=self._retries,
                redirect=False,
                timeout=timeout,
                preload_content=not stream,
            )
        except (urllib3.exceptions.HTTPError, OSError, ApiException, ConfigException) as exc:
            raise ClusterError(f"{method} {path}: {exc}") from exc
        return response


def _read_whole(response: urllib3.BaseHTTPResponse, path: str) -> bytes:
    """The rest of a streamed response's body; its connection goes back to the pool after."""
    try:
        return response.read()
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        response.close()
        raise ClusterError(f"GET {path}: reading the response: {exc}") from exc
    finally:
        response.release_conn()


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    query: list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _namespace_for(resource: Resource, obj: Body) -> str | None:
    if not resource.namespaced:
        return None
    namespace = namespace_of(obj)
    if namespace is None:
        raise ValueError(f"{resource.kind} {name_of(obj)!r} has no metadata.namespace")
    return namespace
