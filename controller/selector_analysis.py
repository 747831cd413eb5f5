"""Static checks of a parsed CEL selector, and which parts of ``device`` it reads.

cel-python parses CEL but has no type checker, so on its own it would accept ``foo(1)`` or
``devize.driver`` and only fail per device at run time. kube-apiserver rejects such expressions
when the claim is created; this module gives the same answer at compile time (unknown functions,
undeclared variables, constructs our evaluator does not support).

It also finds the *device paths* an expression reads: ``device.driver``,
``device.attributes["d"].name`` (or ``["name"]``), ``device.capacity["d"].name`` with literal
domain and name, and ``"d" in device.attributes``. When these are the only ways the expression touches ``device``, its verdict depends
on nothing but the values at those paths, which lets ``selectors`` share one evaluation between all
devices with equal values there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

import lark

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
