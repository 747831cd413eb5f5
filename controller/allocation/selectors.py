"""CEL device selectors (DeviceClass and request ``selectors``) evaluated the way Kubernetes does.

The controller is our only allocator, so it must pick exactly the devices kube-scheduler would: a
device is a candidate for a request when every selector of its DeviceClass and of the request
evaluates to ``true`` on it. Expressions are CEL over one variable, ``device``:

- ``device.driver`` — the publishing driver's name;
- ``device.attributes[<domain>].<name>`` — attribute values (int, bool, string, semver, lists);
  names published without a domain belong to the driver's domain;
- ``device.capacity[<domain>].<name>`` — Kubernetes ``Quantity`` values (``compareTo``,
  ``isGreaterThan``, ``asInteger``…, see ``cel_library``).

Rules copied from kube-scheduler (``k8s.io/dynamic-resource-allocation/cel``):

- Looking up a domain the device has nothing in gives an empty map, so
  ``device.attributes["other.dev"].x`` is a "no such key" *runtime error*, while
  ``"other.dev" in device.attributes`` is ``false`` and ``has(device.attributes["d"].x)`` is safe.
- **A runtime error is an error for the claim, not a "no match"**: kube-scheduler stops allocating
  the pod with "CEL runtime error while evaluating …". ``CompiledSelector.matches`` therefore raises
  ``SelectorEvaluationError``; the allocation loop must fail the claim with that message (a distinct
  reason, no retry until the claim or the devices change) and leave every other claim alone.
- A result that is not a bool is also such an error. Selectors of one request are checked in order
  and the first ``false`` ends the check (``matches_all``), so a later selector's error stays hidden,
  as in Kubernetes.

Evaluator: ``cel-python`` (pure Python, already a dependency). Its parser gives us Kubernetes'
syntax; cel-go's type checker has no equivalent there, so ``compile_selector`` adds the static checks
that matter for error messages: unknown functions and undeclared variables are compile errors, as in
kube-apiserver. Unsupported Kubernetes library functions (string extensions, ``cel.bind``, lists,
IP/CIDR, URL) are reported as such at compile time rather than misbehaving at run time.

Speed: an expression is compiled once (memoized), and a verdict is computed once per device and
cached. cel-python costs ~0.1 ms per evaluation, too much for 20,000 devices times every selector, so
when an expression reads ``device`` only through fixed paths (``device.driver``,
``device.attributes["d"].name``, ``device.capacity["d"].name``, ``"d" in device.attributes`` —
the usual case) the verdict is cached by the *values of those paths* instead: a profile selector is
evaluated once per distinct profile, not once per device. The verdict is a pure function of what the
expression reads, so this is exact; other expressions fall back to one evaluation per device (and
slice version).

Class selectors are evaluated on every driver's devices, so an unguarded
``device.attributes["mig.instaslice.dev"].profile == …`` is a runtime error on another driver's
device; DeviceClasses must start with ``device.driver == "mig.instaslice.dev" && …``.

Static analysis (the last part of this module): cel-python parses CEL but has no type checker, so on
its own it would accept ``foo(1)`` or ``devize.driver`` and only fail per device at run time;
``analyze_expression`` gives kube-apiserver's answer at compile time (unknown functions, undeclared
variables, constructs our evaluator does not support) and finds the *device paths* an expression
reads, which the verdict cache above is keyed by.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from controller.allocation.cel_library import KUBERNETES_FUNCTIONS, Quantity, Semver
from driver.cluster import views
from driver.cluster.port import JsonObject
from driver.cluster.views import SliceView
from driver.errors import ConfigError

MAX_EXPRESSION_LENGTH: Final = 10 * 1024
"""kube-apiserver's limit on a selector expression (``CELSelectorExpressionMaxLength``)."""

MAX_CACHED_VERDICTS: Final = 200_000
"""Per selector; the cache is dropped whole when it grows past this (old slice versions pile up)."""

AttributeValue: TypeAlias = "int | bool | str | Semver | tuple[int | bool | str | Semver, ...]"
DeviceId: TypeAlias = tuple[str, str, str]
"""(driver, pool, device name): how an allocation result names a device."""


class SelectorError(ConfigError):
    """A device selector is unusable; ``expression`` is the CEL text the user wrote."""

    def __init__(self, message: str, *, expression: str) -> None:
        super().__init__(message)
        self.expression = expression


class SelectorCompileError(SelectorError):
    """The expression does not compile (syntax, unknown function or variable, too long)."""


class SelectorEvaluationError(SelectorError):
    """The expression failed at run time on a device: an error for the whole claim (see above)."""

    def __init__(self, message: str, *, expression: str, device: DeviceId) -> None:
        super().__init__(message, expression=expression)
        self.device = device


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One published device as selectors see it. Build with ``device_view_from_slice``.

    ``attributes`` and ``capacity`` are keyed domain → name (unqualified names already moved into
    the driver's domain). The object is hashable only through ``device_id``/``cache_key``.
    """

    driver: str
    pool: str
    name: str
    node_name: str | None
    attributes: Mapping[str, Mapping[str, AttributeValue]]
    capacity: Mapping[str, Mapping[str, Quantity]]
    pool_generation: int = 0
    slice_name: str = ""
    slice_resource_version: str = ""
    _cel: list[celtypes.MapType] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def device_id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    @property
    def cache_key(self) -> tuple[str, str, str, int, str, str]:
        """Identity plus the slice version it came from: a new version may change attributes."""
        return (
            self.driver,
            self.pool,
            self.name,
            self.pool_generation,
            self.slice_name,
            self.slice_resource_version,
        )

    def cel_value(self) -> celtypes.MapType:
        """The ``device`` variable, built on first use (most devices never need it)."""
        if not self._cel:
            self._cel.append(_to_cel_device(self))
        return self._cel[0]


def device_view_from_slice(slice_obj: JsonObject, device_obj: Mapping[str, Any]) -> DeviceView:
    """A ``DeviceView`` of one device of a ResourceSlice (wire JSON, ``resource.k8s.io/v1``).

    The v1beta1 shape (attributes under ``basic``) is accepted too. A malformed attribute or
    quantity raises ``ConfigError`` naming the device: unlike ``SliceView``'s lenient reading, a
    selector must see every attribute exactly as kube-scheduler would, or refuse the device.
    """
    return _device_view(SliceView.of(slice_obj), device_obj)


def device_views_from_slice(slice_obj: JsonObject) -> list[DeviceView]:
    """Every device of a ResourceSlice (none for a counter-only slice)."""
    view = SliceView.of(slice_obj)
    return [_device_view(view, device.raw) for device in view.devices]


def _device_view(slice_view: SliceView, device_obj: Mapping[str, Any]) -> DeviceView:
    driver = slice_view.driver
    name = views.text(views.path(device_obj, "name"))
    basic = views.path(device_obj, "basic")
    body = basic if isinstance(basic, Mapping) else device_obj
    where = f"device {name!r} of ResourceSlice {slice_view.name or '?'!r}"
    attributes: dict[str, dict[str, AttributeValue]] = {}
    for qualified, raw in views.mapping(views.path(body, "attributes")).items():
        domain, short = split_qualified_name(qualified, default_domain=driver)
        attributes.setdefault(domain, {})[sys.intern(short)] = _attribute_value(
            raw, where=f"{where}: {qualified}"
        )
    return DeviceView(
        driver=driver,
        pool=slice_view.pool,
        name=name,
        node_name=slice_view.node_name or None,
        attributes=attributes,
        capacity=_capacity(views.mapping(views.path(body, "capacity")), driver, where),
        pool_generation=slice_view.pool_generation,
        slice_name=slice_view.name,
        slice_resource_version=slice_view.meta.resource_version,
    )


_capacities: dict[tuple[str, ...], Mapping[str, Mapping[str, Quantity]]] = {}
"""Parsed capacities by (driver, name, quantity, ...): every device of a profile publishes the same
one, so thousands of devices share a few read-only maps (docs/design.md, "Memory")."""
_MAX_CAPACITIES = 4096


def _capacity(
    raw: Mapping[str, Any], driver: str, where: str
) -> Mapping[str, Mapping[str, Quantity]]:
    key = (
        driver,
        *(part for name, entry in raw.items() for part in (name, str(views.path(entry, "value")))),
    )
    found = _capacities.get(key)
    if found is not None:
        return found
    capacity: dict[str, dict[str, Quantity]] = {}
    for qualified, entry in raw.items():
        domain, short = split_qualified_name(qualified, default_domain=driver)
        try:
            capacity.setdefault(domain, {})[short] = Quantity.parse(str(views.path(entry, "value")))
        except ValueError as exc:
            raise ConfigError(f"{where}: capacity {qualified}: {exc}") from exc
    if len(_capacities) >= _MAX_CAPACITIES:
        _capacities.clear()
    _capacities[key] = capacity
    return capacity


def split_qualified_name(qualified: str, *, default_domain: str) -> tuple[str, str]:
    """``"dom.ain/name"`` → ``("dom.ain", "name")``; a bare name belongs to ``default_domain``."""
    domain, sep, short = qualified.partition("/")
    return (domain, short) if sep else (default_domain, qualified)


def _attribute_value(raw: Any, *, where: str) -> AttributeValue:
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise ConfigError(f"{where}: an attribute needs exactly one value field, got {raw!r}")
    ((kind, value),) = raw.items()
    try:
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "bool" and isinstance(value, bool):
            return value
        if kind == "string" and isinstance(value, str):
            return value
        if kind == "version" and isinstance(value, str):
            return Semver.parse(value)
        if kind in ("ints", "bools", "strings", "versions") and isinstance(value, list):
            single = kind[:-1]
            return tuple(_attribute_value({single: item}, where=where) for item in value)  # type: ignore[misc]
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    raise ConfigError(f"{where}: unsupported attribute value {raw!r}")


class _DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map."""

    def __missing__(self, key: Any) -> celtypes.MapType:
        return celtypes.MapType()

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]


def _cel_scalar(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, tuple):
        return celtypes.ListType([_cel_scalar(item) for item in value])
    return value  # Semver, Quantity: already CEL-aware


def _to_cel_device(device: DeviceView) -> celtypes.MapType:
    def domains(source: Mapping[str, Mapping[str, Any]]) -> _DomainMap:
        return _DomainMap(
            {
                celtypes.StringType(domain): celtypes.MapType(
                    {celtypes.StringType(k): _cel_scalar(v) for k, v in values.items()}
                )
                for domain, values in source.items()
            }
        )

    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(device.driver),
            celtypes.StringType("attributes"): domains(device.attributes),
            celtypes.StringType("capacity"): domains(device.capacity),
        }
    )


_ABSENT: Final = ("absent",)


def _projection_value(device: DeviceView, path: DevicePath) -> Any:
    """The value at ``path`` in a hashable form that keeps types apart (``1`` vs ``true``)."""
    if path.root == "driver":
        return ("str", device.driver)
    source: Mapping[str, Mapping[str, Any]] = (
        device.attributes if path.root == "attributes" else device.capacity
    )
    if not path.name:
        return ("presence", path.domain in source)
    value = source.get(path.domain, {}).get(path.name, _ABSENT)
    if value is _ABSENT:
        return _ABSENT
    return _hashable(value)


def _hashable(value: Any) -> Any:
    if isinstance(value, Quantity | Semver):
        return (type(value).__name__, value.text)
    if isinstance(value, tuple):
        return ("list", tuple(_hashable(item) for item in value))
    return (type(value).__name__, value)


_ENVIRONMENT: Final = celpy.Environment()
_environment_lock = threading.Lock()


class CompiledSelector:
    """One compiled selector expression with its cache of verdicts. Thread-safe."""

    def __init__(
        self, expression: str, *, program: celpy.Runner, paths: tuple[DevicePath, ...] | None
    ) -> None:
        self.expression = expression
        self._program = program
        self._paths = paths
        # verdict: True/False, or the runtime error message
        self._verdicts: dict[Any, bool | str] = {}
        self.evaluations = 0
        """How many times the CEL program really ran (the rest were cache hits)."""

    @property
    def projected(self) -> bool:
        """Whether verdicts are shared between devices with equal values at the paths read."""
        return self._paths is not None

    def matches(self, device: DeviceView) -> bool:
        """Whether the device satisfies the expression; ``SelectorEvaluationError`` on a CEL error."""
        if self._paths is not None:
            key: Any = tuple(_projection_value(device, path) for path in self._paths)
        else:
            key = device.cache_key
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._evaluate(device)
            if len(self._verdicts) >= MAX_CACHED_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return self._verdict_or_raise(verdict, device)

    def evaluate(self, device: DeviceView) -> bool:
        """Like ``matches`` but always runs the CEL program and caches nothing (tests, debugging)."""
        return self._verdict_or_raise(self._evaluate(device), device)

    def _verdict_or_raise(self, verdict: bool | str, device: DeviceView) -> bool:
        if isinstance(verdict, str):
            raise SelectorEvaluationError(
                f"CEL runtime error while evaluating {self.expression!r} on device "
                f"{device.pool}/{device.name}: {verdict}",
                expression=self.expression,
                device=device.device_id,
            )
        return verdict

    def _evaluate(self, device: DeviceView) -> bool | str:
        self.evaluations += 1
        try:
            result: Any = self._program.evaluate({"device": device.cel_value()})
        except CELEvalError as exc:
            return _eval_error_message(exc)
        except Exception as exc:  # cel-python lets some Python errors escape; they are CEL errors
            return f"{type(exc).__name__}: {exc}"
        if isinstance(result, CELEvalError):
            return _eval_error_message(result)
        if not isinstance(result, celtypes.BoolType):
            return f"the expression must evaluate to bool, not {type(result).__name__}"
        return bool(result)

    def clear_cache(self) -> None:
        self._verdicts.clear()

    def __repr__(self) -> str:
        return f"CompiledSelector({self.expression!r})"


def _eval_error_message(exc: CELEvalError) -> str:
    """cel-python's ``(summary, exception class, exception args)`` as one readable line."""
    args = exc.args
    summary = str(args[0]) if args else repr(exc)
    detail_args = args[2] if len(args) >= 3 and isinstance(args[2], tuple) else ()
    if len(args) >= 2 and args[1] is KeyError and detail_args:
        return f"no such key: {detail_args[0]}"
    if len(detail_args) == 1 and isinstance(detail_args[0], str):
        detail = detail_args[0]
        # ``error && error`` arrives as a TypeError whose text holds both errors' reprs
        inner = [m[2] for m in _NESTED_ERROR.finditer(detail)]
        return " and ".join(inner) if inner else detail
    return summary


_NESTED_ERROR: Final = re.compile(r"""CELEvalError\(\*\((["'])(.*?)\1, """)


_compiled: dict[str, CompiledSelector | SelectorCompileError] = {}
_compiled_lock = threading.Lock()
_MAX_COMPILED: Final = 10_000


def compile_selector(expression: str) -> CompiledSelector:
    """Compile one selector expression (memoized); ``SelectorCompileError`` when it is malformed."""
    cached = _compiled.get(expression)
    if cached is None:
        cached = _compile(expression)
        with _compiled_lock:
            if len(_compiled) >= _MAX_COMPILED:
                _compiled.clear()
            cached = _compiled.setdefault(expression, cached)
    if isinstance(cached, SelectorCompileError):
        raise SelectorCompileError(str(cached), expression=expression)
    return cached


def _compile(expression: str) -> CompiledSelector | SelectorCompileError:
    def failure(message: str) -> SelectorCompileError:
        return SelectorCompileError(
            f"CEL selector {expression!r} does not compile: {message}", expression=expression
        )

    if len(expression) > MAX_EXPRESSION_LENGTH:
        return failure(f"longer than {MAX_EXPRESSION_LENGTH} bytes")
    try:
        with _environment_lock:  # the parser keeps per-call state on a shared object
            ast = _ENVIRONMENT.compile(expression)
    except CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        if line is None or column is None:
            return failure("syntax error")
        lines = expression.splitlines() or [""]
        offending = lines[min(line, len(lines)) - 1][column - 1 : column + 19]
        near = f"near {offending!r}" if offending else "at the end of the expression"
        return failure(f"syntax error at line {line}, column {column}, {near}")
    except lark.exceptions.LarkError as exc:
        return failure(str(exc).strip())
    analysis = analyze_expression(ast, known_functions=_KNOWN_FUNCTIONS)
    if analysis.problems:
        return failure("; ".join(analysis.problems))
    with _environment_lock:
        program = _ENVIRONMENT.program(ast, functions=KUBERNETES_FUNCTIONS)
    return CompiledSelector(expression, program=program, paths=analysis.device_paths)


_KNOWN_FUNCTIONS: Final = frozenset(
    {
        # CEL standard functions cel-python implements (macros are handled by the analysis)
        "size", "contains", "startsWith", "endsWith", "matches",
        "int", "uint", "double", "string", "bool", "bytes", "type", "duration", "timestamp",
        "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getMonth",
        "getHours", "getMilliseconds", "getMinutes", "getSeconds",
        *KUBERNETES_FUNCTIONS,
    }
)  # fmt: skip


def matches_all(selectors: Sequence[CompiledSelector], device: DeviceView) -> bool:
    """All selectors in order (class first, then request), stopping at the first ``false``."""
    return all(selector.matches(device) for selector in selectors)


# ---------------------------------------------------------------------------------------------
# static analysis of a parsed expression

_Tree = lark.Tree[lark.Token]

DEVICE_VARIABLE: Final = "device"

_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
_TYPE_IDENTIFIERS: Final = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}
)
_KUBERNETES_UNSUPPORTED: Final = frozenset(
    {
        "bind", "charAt", "indexOf", "lastIndexOf", "lowerAscii", "upperAscii", "replace", "split",
        "substring", "trim", "join", "quote", "reverse", "format", "find", "findAll", "isSorted",
        "sum", "min", "max", "url", "isURL", "ip", "isIP", "cidr", "isCIDR", "optional", "orValue",
        "hasValue", "value", "sets",
    }
)  # fmt: skip
_WRAPPERS: Final = frozenset(
    {
        "expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
        "unary", "member", "primary", "paren_expr",
    }
)  # fmt: skip
_PLAIN_STRING: Final = re.compile(r"""^(?:"([^"\\]*)"|'([^'\\]*)')$""")


@dataclass(frozen=True, slots=True)
class DevicePath:
    """One fixed place in ``device`` an expression reads."""

    root: Literal["driver", "attributes", "capacity"]
    domain: str = ""
    name: str = ""
    """Empty for ``"<domain>" in device.attributes``: the path stands for the domain's presence."""


@dataclass(frozen=True, slots=True)
class Analysis:
    problems: tuple[str, ...]
    """Why the expression must be refused at compile time; empty when it is fine."""
    device_paths: tuple[DevicePath, ...] | None
    """Every device path read, in order of appearance; ``None`` when ``device`` is also used in
    some other way (whole maps, computed keys), so verdicts must be kept per device."""


def analyze_expression(ast: _Tree, *, known_functions: frozenset[str]) -> Analysis:
    walker = _Walker(known_functions)
    walker.visit(ast, frozenset())
    paths = None if walker.opaque else tuple(dict.fromkeys(walker.paths))
    return Analysis(problems=tuple(dict.fromkeys(walker.problems)), device_paths=paths)


class _Walker:
    def __init__(self, known_functions: frozenset[str]) -> None:
        self.known_functions = known_functions
        self.problems: list[str] = []
        self.paths: list[DevicePath] = []
        self.opaque = False

    def visit(self, node: _Tree | lark.Token, bound: frozenset[str]) -> None:
        if isinstance(node, lark.Token):
            return
        kind = node.data
        if kind in ("member_dot", "member_index") and DEVICE_VARIABLE not in bound:
            path = _device_path(node)
            if path is not None:
                self.paths.append(path)
                return
        if kind == "relation" and DEVICE_VARIABLE not in bound:
            presence = _domain_presence(node)
            if presence is not None:
                self.paths.append(presence)
                return
        if kind == "ident":
            self._identifier(str(node.children[0]), bound)
        elif kind in ("dot_ident", "dot_ident_arg"):
            self.problems.append(f"leading-dot name .{node.children[0]} is not supported")
        elif kind == "member_object":
            self.problems.append("message construction (Type{...}) is not supported")
        elif kind == "ident_arg":
            self._function(str(node.children[0]))
            for child in node.children[1:]:
                self.visit(child, bound)
        elif kind == "member_dot_arg":
            self._method_call(node, bound)
        else:
            for child in node.children:
                self.visit(child, bound)

    def _identifier(self, name: str, bound: frozenset[str]) -> None:
        if name in bound or name in _TYPE_IDENTIFIERS:
            return
        if name == DEVICE_VARIABLE:
            self.opaque = True
            return
        self.problems.append(f"undeclared reference to {name!r} (the only variable is 'device')")

    def _function(self, name: str) -> None:
        if name == "has" or name in self.known_functions:
            return
        if name in _KUBERNETES_UNSUPPORTED or name in _MACROS:
            self.problems.append(
                f"function {name!r} is not supported by InstaSlice's CEL evaluator"
                " (supported: CEL standard functions, quantity and semver)"
            )
        else:
            self.problems.append(f"undeclared reference to function {name!r}")

    def _method_call(self, node: _Tree, bound: frozenset[str]) -> None:
        target, method_token, *rest = node.children
        method = str(method_token)
        args = list(rest[0].children) if rest and isinstance(rest[0], lark.Tree) else []
        if method in _MACROS:
            variable = _identifier_name(args[0]) if args else None
            if variable is None or not 2 <= len(args) <= 3 or (len(args) == 3 and method != "map"):
                self.problems.append(f"macro {method}() needs a variable name and an expression")
                return
            self.visit(target, bound)
            for arg in args[1:]:
                self.visit(arg, bound | {variable})
            return
        if method == "bind" and _identifier_name(target) == "cel":
            self._function("bind")
            return
        self._function(method)
        self.visit(target, bound)
        for arg in args:
            self.visit(arg, bound)


def _unwrap(node: _Tree | lark.Token) -> _Tree | lark.Token:
    while (
        isinstance(node, lark.Tree)
        and node.data in _WRAPPERS
        and len(node.children) == 1
        and isinstance(node.children[0], lark.Tree)
    ):
        node = node.children[0]
    return node


def _identifier_name(node: _Tree | lark.Token) -> str | None:
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _string_literal(node: _Tree | lark.Token) -> str | None:
    node = _unwrap(node)
    if not (isinstance(node, lark.Tree) and node.data == "literal"):
        return None
    token = node.children[0]
    if not (isinstance(token, lark.Token) and token.type == "STRING_LIT"):
        return None
    match = _PLAIN_STRING.match(str(token))
    if match is None:
        return None  # escapes, raw or triple-quoted: not worth decoding here; per-device fallback
    return match[1] if match[1] is not None else match[2]


def _is_device(node: _Tree | lark.Token) -> bool:
    return _identifier_name(node) == DEVICE_VARIABLE


def _domain_lookup(
    node: _Tree | lark.Token,
) -> tuple[Literal["attributes", "capacity"], str] | None:
    """``device.attributes["d"]`` / ``device.capacity["d"]`` → (root, domain)."""
    node = _unwrap(node)
    if not (isinstance(node, lark.Tree) and node.data == "member_index"):
        return None
    target, index = node.children
    target = _unwrap(target)
    domain = _string_literal(index)
    if domain is None or not (isinstance(target, lark.Tree) and target.data == "member_dot"):
        return None
    holder, root_token = target.children
    root = str(root_token)
    if not _is_device(holder):
        return None
    if root == "attributes":
        return ("attributes", domain)
    if root == "capacity":
        return ("capacity", domain)
    return None


def _domain_presence(node: _Tree) -> DevicePath | None:
    """``"d" in device.attributes`` (or ``capacity``) → a presence path for domain ``d``."""
    if len(node.children) != 2:
        return None
    operator, right = node.children
    if not (isinstance(operator, lark.Tree) and operator.data == "relation_in"):
        return None
    domain = _string_literal(operator.children[0])
    right = _unwrap(right)
    if domain is None or not (isinstance(right, lark.Tree) and right.data == "member_dot"):
        return None
    holder, root_token = right.children
    root = str(root_token)
    if not _is_device(holder) or root not in ("attributes", "capacity"):
        return None
    return DevicePath("attributes" if root == "attributes" else "capacity", domain, "")


def _device_path(node: _Tree) -> DevicePath | None:
    target, selector = node.children
    if node.data == "member_dot":
        name = str(selector)
        if name == "driver" and _is_device(target):
            return DevicePath("driver")
    else:
        literal = _string_literal(selector)
        if literal is None:
            return None
        name = literal
    lookup = _domain_lookup(target)
    if lookup is None:
        return None
    return DevicePath(lookup[0], lookup[1], name)
