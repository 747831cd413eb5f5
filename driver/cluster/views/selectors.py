"""Node selectors, as claim allocations and pod affinity write them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from driver.cluster.views.readers import items, strings, text

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"


NAME_FIELD: Final = "metadata.name"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Requirement:
        return cls(
            key=text(raw.get("key")),
            operator=text(raw.get("operator")),
            values=strings(raw.get("values")),
        )


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SelectorTerm:
        return cls(
            match_expressions=tuple(
                Requirement.parse(r) for r in items(raw.get("matchExpressions"))
            ),
            match_fields=tuple(Requirement.parse(r) for r in items(raw.get("matchFields"))),
        )

    def pinned_names(self) -> frozenset[str] | None:
        """Node names this term admits through ``metadata.name In`` / hostname ``In`` (their
        intersection); ``None`` when the term names no node that way."""
        names: frozenset[str] | None = None
        for requirement, key in (
            *((r, NAME_FIELD) for r in self.match_fields),
            *((r, HOSTNAME_LABEL) for r in self.match_expressions),
        ):
            if requirement.key == key and requirement.operator == "In":
                values = frozenset(requirement.values)
                names = values if names is None else names & values
        return names


@dataclass(frozen=True, slots=True)
class NodeSelector:
    terms: tuple[SelectorTerm, ...]

    @classmethod
    def parse(cls, raw: Any) -> NodeSelector | None:
        if not isinstance(raw, Mapping):
            return None
        return cls(terms=tuple(SelectorTerm.parse(t) for t in items(raw.get("nodeSelectorTerms"))))

    def node_names(self) -> tuple[str, ...]:
        """Every node named by an ``In`` requirement on ``metadata.name`` or the hostname label,
        in order (what allocators write; the informer's by-node index)."""
        found: list[str] = []
        for term in self.terms:
            for requirement in term.match_fields:
                if requirement.key == NAME_FIELD and requirement.operator == "In":
                    found.extend(requirement.values)
            for requirement in term.match_expressions:
                if requirement.key == HOSTNAME_LABEL and requirement.operator == "In":
                    found.extend(requirement.values)
        return tuple(dict.fromkeys(found))

    def pinned_names(self) -> frozenset[str] | None:
        """The nodes the selector admits when every term pins names (union over the terms);
        ``None`` when some term does not pin (the selector may admit other nodes)."""
        names: set[str] = set()
        for term in self.terms:
            term_names = term.pinned_names()
            if term_names is None:
                return None
            names |= term_names
        return frozenset(names)
