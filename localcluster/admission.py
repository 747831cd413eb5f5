"""Mutating admission webhooks, called the way kube-apiserver calls them.

For a CREATE or UPDATE, every ``MutatingWebhookConfiguration`` (in name order, webhooks in list
order) whose rules, ``namespaceSelector`` and ``objectSelector`` match gets an
``admission.k8s.io/v1`` ``AdmissionReview`` POSTed over HTTPS (``clientConfig.url``, or
``clientConfig.service`` through the injected resolver, verified against ``caBundle`` and the
service's DNS name). Its base64 JSONPatch is applied before the next webhook sees the object.
``allowed: false`` becomes the request's error; an unreachable or broken webhook fails the request
under ``failurePolicy: Fail`` and is skipped under ``Ignore``. ``matchConditions`` (CEL over
``object`` and ``oldObject``) must all hold for the webhook to be called; one that fails to
evaluate is a call failure (subject to ``failurePolicy``), as in kube-apiserver. Not done:
``reinvocationPolicy``, the ``request``/``authorizer`` CEL variables, DELETE/CONNECT operations,
validating webhooks.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import logging
import socket
import ssl
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from localcluster import errors
from localcluster.patch import json_patch
from localcluster.resources import MUTATING_WEBHOOKS, NAMESPACES, ResourceType
from localcluster.selectors import ObjectFilter, label_selector_from_object
from localcluster.store import Store, meta
from localcluster.tlsclient import wrap_client

JsonObj = dict[str, Any]
ServiceResolver = Callable[[str, str, int], str]
"""(namespace, name, port) → base URL such as ``https://127.0.0.1:9443``."""

log = logging.getLogger(__name__)

_USER = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}


class WebhookCallError(Exception):
    """The webhook could not be called or answered nonsense (subject to ``failurePolicy``)."""


@dataclass(frozen=True, slots=True)
class Attributes:
    """What is being admitted: kube's ``admission.Attributes`` minus the user."""

    resource: ResourceType
    subresource: str
    operation: str  # CREATE | UPDATE
    namespace: str
    name: str


class MutatingAdmission:
    def __init__(self, store: Store, *, service_resolver: ServiceResolver | None) -> None:
        self._store = store
        self._resolve = service_resolver

    def admit(self, attributes: Attributes, obj: JsonObj, old: JsonObj | None) -> JsonObj:
        """The object after every matching webhook; raises ApiError when one refuses it."""
        configs, _ = self._store.list_objects(MUTATING_WEBHOOKS, ObjectFilter())
        if not configs:
            return obj
        for config in sorted(configs, key=lambda c: str(meta(c).get("name"))):
            for hook in config.get("webhooks") or []:
                if not self._matches(hook, attributes, obj, old):
                    continue
                try:
                    if not match_conditions_hold(hook, obj, old):
                        continue
                except WebhookCallError as exc:
                    if hook.get("failurePolicy", "Fail") == "Ignore":
                        continue
                    raise errors.internal(
                        f'failed calling webhook "{hook.get("name")}": {exc}'
                    ) from exc
                obj = self._call(hook, attributes, obj, old)
        return obj

    def _matches(
        self, hook: JsonObj, attributes: Attributes, obj: JsonObj, old: JsonObj | None
    ) -> bool:
        if not any(_rule_matches(r, attributes) for r in hook.get("rules") or []):
            return False
        selector = label_selector_from_object(hook.get("objectSelector"))
        if not selector.empty and not (
            selector.matches(meta(obj).get("labels"))
            or (old is not None and selector.matches(meta(old).get("labels")))
        ):
            return False
        ns_selector = label_selector_from_object(hook.get("namespaceSelector"))
        resource = attributes.resource
        if ns_selector.empty:
            return True
        if resource is NAMESPACES:
            return ns_selector.matches(meta(obj).get("labels"))
        if not resource.namespaced:
            return True
        try:
            labels = meta(self._store.get(NAMESPACES, "", attributes.namespace)).get("labels")
        except errors.ApiError:
            labels = {"kubernetes.io/metadata.name": attributes.namespace}
        return ns_selector.matches(labels)

    def _call(
        self, hook: JsonObj, attributes: Attributes, obj: JsonObj, old: JsonObj | None
    ) -> JsonObj:
        hook_name = str(hook.get("name"))
        review = _review(attributes, obj, old)
        timeout = float(hook.get("timeoutSeconds") or 10)
        try:
            url, verify_name = self._endpoint(hook.get("clientConfig") or {})
            answer = _post(url, verify_name, hook.get("clientConfig") or {}, review, timeout)
            response = _response(answer, review["request"]["uid"])
        except WebhookCallError as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("ignoring failed webhook %s: %s", hook_name, exc)
                return obj
            raise errors.internal(f'failed calling webhook "{hook_name}": {exc}') from exc
        if not response.get("allowed"):
            raise _denied(hook_name, response.get("status"))
        patch = response.get("patch")
        if not patch:
            return obj
        if response.get("patchType") != "JSONPatch":
            raise errors.internal(f'webhook "{hook_name}" returned a patch of unsupported type')
        try:
            operations = json.loads(base64.b64decode(patch))
            patched = json_patch(obj, operations)
        except (ValueError, binascii.Error, errors.ApiError) as exc:
            raise errors.internal(f'webhook "{hook_name}" returned a bad patch: {exc}') from exc
        if not isinstance(patched, dict):
            raise errors.internal(f'webhook "{hook_name}" patched the object into a non-object')
        return patched

    def _endpoint(self, client: JsonObj) -> tuple[str, str]:
        if client.get("url"):
            url = str(client["url"])
            return url, urlsplit(url).hostname or ""
        service = client.get("service") or {}
        namespace, name = str(service.get("namespace")), str(service.get("name"))
        port = int(service.get("port") or 443)
        dns = f"{name}.{namespace}.svc"
        base = self._resolve(namespace, name, port) if self._resolve else f"https://{dns}:{port}"
        return base.rstrip("/") + str(service.get("path") or ""), dns


_CEL = celpy.Environment()
_CEL_LOCK = threading.Lock()
"""celpy's parser keeps per-call state on the shared environment: compiled from several request
threads at once, expressions can come out wrong — a true matchCondition reads false, so a webhook
is silently skipped and a pod admitted without its gate. Programs are compiled once, under this
lock, as the controller's selectors are (``controller/allocation/selectors.py``); evaluating a
shared program is safe."""
_PROGRAMS: dict[str, Any] = {}


def _program(expression: str) -> Any:
    with _CEL_LOCK:
        program = _PROGRAMS.get(expression)
        if program is None:
            program = _PROGRAMS[expression] = _CEL.program(_CEL.compile(expression))
        return program


def match_conditions_hold(hook: JsonObj, obj: JsonObj, old: JsonObj | None) -> bool:
    """Whether every ``matchConditions`` expression of the webhook is true for the object;
    ``WebhookCallError`` when one does not compile, fails, or is not a boolean."""
    activation = {"object": json_to_cel(obj)}
    if old is not None:
        activation["oldObject"] = json_to_cel(old)
    for condition in hook.get("matchConditions") or []:
        name = condition.get("name")
        try:
            result = _program(str(condition.get("expression") or "")).evaluate(activation)
        except (CELParseError, CELEvalError) as exc:
            raise WebhookCallError(f"matchCondition {name!r}: {exc}") from exc
        if not isinstance(result, celtypes.BoolType):
            raise WebhookCallError(f"matchCondition {name!r} is not a boolean: {result!r}")
        if not result:
            return False
    return True


def _rule_matches(rule: JsonObj, attributes: Attributes) -> bool:
    resource = attributes.resource
    operations = rule.get("operations") or []
    if "*" not in operations and attributes.operation not in operations:
        return False
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if "*" not in groups and resource.group not in groups:
        return False
    if "*" not in versions and resource.version not in versions:
        return False
    scope = rule.get("scope", "*")
    if scope == "Namespaced" and not resource.namespaced:
        return False
    if scope == "Cluster" and resource.namespaced:
        return False
    for entry in rule.get("resources") or []:
        plural, _, sub = str(entry).partition("/")
        if plural in ("*", resource.plural) and sub in (attributes.subresource, "*"):
            return True
    return False


def _review(attributes: Attributes, obj: JsonObj, old: JsonObj | None) -> JsonObj:
    resource = attributes.resource
    kind = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    gvr = {"group": resource.group, "version": resource.version, "resource": resource.plural}
    request: JsonObj = {
        "uid": str(uuid.uuid4()),
        "kind": kind,
        "resource": gvr,
        "requestKind": kind,
        "requestResource": gvr,
        "name": attributes.name,
        "operation": attributes.operation,
        "userInfo": _USER,
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions" if attributes.operation == "CREATE" else "UpdateOptions",
        },
    }
    if attributes.subresource:
        request["subResource"] = attributes.subresource
        request["requestSubResource"] = attributes.subresource
    if resource.namespaced:
        request["namespace"] = attributes.namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _post(url: str, verify_name: str, client: JsonObj, review: JsonObj, timeout: float) -> Any:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise WebhookCallError(f'Post "{url}": webhooks must be called over https')
    try:
        context = ssl.create_default_context()
        if client.get("caBundle"):
            context = ssl.create_default_context(
                cadata=base64.b64decode(client["caBundle"]).decode()
            )
        raw = socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout)
        tls = wrap_client(context, raw, server_hostname=verify_name)
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 443, timeout=timeout)
        conn.sock = tls
        try:
            # kube-apiserver tells the webhook its deadline the same way.
            query = "&".join(q for q in (parts.query, f"timeout={int(timeout)}s") if q)
            path = f"{parts.path or '/'}?{query}"
            body = json.dumps(review).encode()
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            conn.request("POST", path, body=body, headers=headers)
            reply = conn.getresponse()
            data = reply.read()
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise WebhookCallError(f'failed to call webhook: Post "{url}": {exc}') from exc
    if reply.status != 200:
        raise WebhookCallError(f'Post "{url}": the server responded with status {reply.status}')
    try:
        return json.loads(data)
    except ValueError as exc:
        raise WebhookCallError(f"received invalid webhook response: {exc}") from exc


def _response(answer: Any, uid: str) -> JsonObj:
    response = answer.get("response") if isinstance(answer, dict) else None
    if not isinstance(response, dict):
        raise WebhookCallError("webhook response was absent")
    if response.get("uid") != uid:
        raise WebhookCallError(f"expected response.uid={uid!r}, got {response.get('uid')!r}")
    return response


def _denied(hook_name: str, status: Any) -> errors.ApiError:
    """``allowed: false`` as kube-apiserver reports it (``webhookerrors.ToStatusErr``)."""
    status = status if isinstance(status, dict) else {}
    denied_by = f'admission webhook "{hook_name}" denied the request'
    code = max(int(status.get("code") or 0), 400)
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return errors.ApiError(
        code, str(status.get("reason") or ""), message, status.get("details") or {}
    )
