"""Label and field selectors, in the string form of list/watch queries and the object form of
webhook ``namespaceSelector``/``objectSelector``.

Parsed once per request into small frozen predicates, then matched against every candidate object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localcluster.errors import ApiError, bad_request
from localcluster.resources import ResourceType

JsonObj = dict[str, Any]

_SET_TERM = re.compile(r"^(?P<key>[^\s=!<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_CMP_TERM = re.compile(r"^(?P<key>[^\s=!<>(),]+)\s*(?P<op>==|!=|=|>|<)\s*(?P<value>[^\s=!<>(),]*)$")
_KEY = re.compile(r"^[^\s=!<>(),]+$")

# Field labels whose value lives somewhere other than the dotted path of the same name.
_FIELD_PATHS = {"source": "source.component"}


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # in | notin | exists | !exists | gt | lt
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        if self.op == "notin":
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        try:
            have, want = int(labels[self.key]), int(next(iter(self.values)))
        except ValueError:
            return False
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        have = labels or {}
        return all(req.matches(have) for req in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    terms.append("".join(current).strip())
    return [t for t in terms if t]


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3``; raises 400 on nonsense."""
    if not text:
        return LabelSelector()
    reqs: list[Requirement] = []
    for term in _split_terms(text):
        reqs.append(_parse_label_term(term))
    return LabelSelector(tuple(reqs))


def _parse_label_term(term: str) -> Requirement:
    if term.startswith("!"):
        key = term[1:].strip()
        if _KEY.match(key):
            return Requirement(key, "!exists")
    elif match := _SET_TERM.match(term):
        values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
        return Requirement(match["key"], match["op"], values)
    elif match := _CMP_TERM.match(term):
        op = {"=": "in", "==": "in", "!=": "notin", ">": "gt", "<": "lt"}[match["op"]]
        return Requirement(match["key"], op, frozenset({match["value"]}))
    elif _KEY.match(term):
        return Requirement(term, "exists")
    raise bad_request(f"unable to parse requirement: {term!r}")


def label_selector_from_object(selector: JsonObj | None) -> LabelSelector:
    """A ``metav1.LabelSelector`` (``matchLabels`` + ``matchExpressions``); None selects all."""
    if not selector:
        return LabelSelector()
    reqs = [
        Requirement(str(k), "in", frozenset({str(v)}))
        for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        op = ops.get(str(expr.get("operator")))
        if op is None:
            raise bad_request(f"{expr.get('operator')!r} is not a valid label selector operator")
        values = frozenset(str(v) for v in expr.get("values") or [])
        reqs.append(Requirement(str(expr.get("key", "")), op, values))
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    label: str
    value: str
    negate: bool

    def matches(self, obj: JsonObj) -> bool:
        return (field_value(obj, self.label) == self.value) != self.negate


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: JsonObj) -> bool:
        return all(req.matches(obj) for req in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def parse_field_selector(text: str | None, resource: ResourceType) -> FieldSelector:
    """Parse ``spec.nodeName=n1,status.phase!=Failed``; unknown labels are 400, as in kube."""
    if not text:
        return FieldSelector()
    reqs: list[FieldRequirement] = []
    for term in (t.strip() for t in text.split(",")):
        if not term:
            continue
        label, value, negate = _split_field_term(term, text)
        label = label.strip()
        if not resource.supports_field(label):
            raise ApiError(
                400,
                "BadRequest",
                f"field label not supported: {label}",
            )
        reqs.append(FieldRequirement(label, value.strip(), negate))
    return FieldSelector(tuple(reqs))


def _split_field_term(term: str, text: str) -> tuple[str, str, bool]:
    for op, negate in (("!=", True), ("==", False), ("=", False)):
        label, sep, value = term.partition(op)
        if sep:
            return label, value, negate
    raise bad_request(f"invalid selector: {text!r}; can't understand {term!r}")


def field_value(obj: JsonObj, label: str) -> str:
    """The string a field selector compares: missing → ``""``, booleans lower-case."""
    current: Any = obj
    for part in _FIELD_PATHS.get(label, label).split("."):
        if not isinstance(current, dict):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


@dataclass(frozen=True, slots=True)
class ObjectFilter:
    """What a list or watch asks for: namespace (None = all) plus both selectors."""

    namespace: str | None = None
    labels: LabelSelector = LabelSelector()
    fields: FieldSelector = FieldSelector()

    def matches(self, obj: JsonObj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace", "") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)
