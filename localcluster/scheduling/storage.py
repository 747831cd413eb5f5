"""PriorityClasses in the store as kube-apiserver keeps them: the system classes created at start,
a system class refused deletion by name, and the global default the ``Priority`` plugin reads.

A DELETE of the whole collection does not ask about system classes, in kube as here (its
``DeleteCollection`` bypasses the per-name refusal); the next start creates them again.
"""

from __future__ import annotations

from typing import Any

from localcluster import errors
from localcluster.resources import PRIORITY_CLASSES
from localcluster.scheduling.api import SYSTEM_PRIORITY_CLASSES, system_class
from localcluster.selectors import ObjectFilter
from localcluster.store import Store

JsonObj = dict[str, Any]


def create_system_classes(store: Store) -> None:
    """kube-apiserver's ``scheduling/bootstrap-system-priority-classes`` post-start hook: each
    system class created unless one of its name exists (an existing one is left as it is)."""
    for system in SYSTEM_PRIORITY_CLASSES:
        try:
            store.get(PRIORITY_CLASSES, "", system.name)
        except errors.ApiError as exc:
            if exc.code != 404:
                raise
            store.create(PRIORITY_CLASSES, "", system.body())


def refuse_system_class_delete(name: str) -> None:
    """A DELETE of a system class by name is forbidden (kube's priorityclass ``REST.Delete``)."""
    if system_class(name) is not None:
        raise errors.forbidden(
            PRIORITY_CLASSES, name, "this is a system priority class and cannot be deleted"
        )


def global_default(store: Store) -> JsonObj | None:
    """The class pods without a class get: the ``globalDefault`` one; should several be (two
    creates racing past the one-default check), the one of lowest value, as kube picks."""
    classes, _ = store.list_objects(PRIORITY_CLASSES, ObjectFilter())
    defaults = [c for c in classes if c.get("globalDefault") is True]
    return min(defaults, key=lambda c: int(c.get("value") or 0), default=None)
