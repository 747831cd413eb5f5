"""Where the emulated backend keeps its MIG instances: in memory, or in a file shared by processes.

Real MIG instances outlive a crashed kubelet plugin; with a state file, emulated ones do too. The
file is JSON, replaced atomically (temporary file, ``fsync``, ``os.replace``), and every
read-modify-write holds an exclusive ``fcntl.flock`` on a sidecar ``<file>.lock`` — so two plugin
processes on one file never create two instances on the same memory slices, and each operation sees
the other process's latest changes.

The store also keeps which GPUs are marked unhealthy (GPU index → reason; the file's optional
``unhealthy`` object, written only while some GPU is marked), so an operator's or a test's mark made
in one process is seen by the kubelet plugin in another.
"""

import contextlib
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from driver.errors import BackendError, ConfigError

STATE_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """One emulated GPU instance; ``ci_id`` is ``None`` until its compute instance exists."""

    gpu_index: int
    profile: str
    start: int
    gi_id: int
    ci_id: int | None


class StateStore(Protocol):
    """The emulated instances, read and changed only while ``locked``."""

    where: str
    """Words naming the store in error messages, e.g. ``state file /var/lib/…/gpus.json``."""

    def locked(self) -> contextlib.AbstractContextManager[list[InstanceRecord]]:
        """Hold the lock; yields the current records as a new list the caller may change."""
        ...

    def unhealthy(self) -> dict[int, str]:
        """GPU index → why it is marked unhealthy; only while ``locked``."""
        ...

    def save(
        self, records: Sequence[InstanceRecord], *, unhealthy: Mapping[int, str] | None = None
    ) -> None:
        """Make ``records`` (and ``unhealthy``, if given; else the marks stay) the state; only
        while ``locked``. Atomic: all or nothing is kept."""
        ...


class MemoryStateStore:
    """State that lives as long as the backend object."""

    where = "in-memory state"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: tuple[InstanceRecord, ...] = ()
        self._unhealthy: dict[int, str] = {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[list[InstanceRecord]]:
        with self._lock:
            yield list(self._records)

    def unhealthy(self) -> dict[int, str]:
        return dict(self._unhealthy)

    def save(
        self, records: Sequence[InstanceRecord], *, unhealthy: Mapping[int, str] | None = None
    ) -> None:
        self._records = tuple(records)
        if unhealthy is not None:
            self._unhealthy = dict(unhealthy)


class FileStateStore:
    """State in a JSON file, tagged with the node name and GPU models it describes.

    A file written for another node or another GPU list is refused (``ConfigError`` naming it)
    rather than reinterpreted: its instances would land on the wrong GPUs.
    """

    def __init__(self, path: Path, *, node_name: str, gpu_models: Sequence[str]) -> None:
        self._path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._node_name = node_name
        self._gpu_models = list(gpu_models)
        self._thread_lock = threading.Lock()
        self._unhealthy: dict[int, str] = {}
        """The marks as read when the lock was taken (or saved since); valid while locked."""
        self.where = f"state file {path}"

    @contextlib.contextmanager
    def locked(self) -> Iterator[list[InstanceRecord]]:
        with self._thread_lock, self._flock():
            records, self._unhealthy = self._load()
            yield records

    def unhealthy(self) -> dict[int, str]:
        return dict(self._unhealthy)

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise BackendError(f"cannot open lock file {self._lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _load(self) -> tuple[list[InstanceRecord], dict[int, str]]:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return [], {}
        except UnicodeDecodeError as exc:
            raise ConfigError(f"corrupt {self.where}: not UTF-8 JSON ({exc.reason})") from exc
        except OSError as exc:
            raise BackendError(f"cannot read {self.where}: {exc}") from exc
        try:
            return self._decode(json.loads(text))
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"corrupt {self.where}: {exc}") from exc

    def _decode(self, document: Any) -> tuple[list[InstanceRecord], dict[int, str]]:
        if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
            raise ValueError(f"expected a JSON object with version {STATE_VERSION}")
        if document.get("node") != self._node_name or document.get("gpus") != self._gpu_models:
            raise ConfigError(
                f"{self.where} describes node {document.get('node')!r} with GPUs "
                f"{document.get('gpus')!r}, not node {self._node_name!r} with GPUs "
                f"{self._gpu_models!r}; remove the file to start with no MIG instances"
            )
        records = []
        for item in document["instances"]:
            ci_id = item["ci"]
            records.append(
                InstanceRecord(
                    gpu_index=_int(item["gpu"]),
                    profile=_str(item["profile"]),
                    start=_int(item["start"]),
                    gi_id=_int(item["gi"]),
                    ci_id=None if ci_id is None else _int(ci_id),
                )
            )
        marks = document.get("unhealthy", {})
        if not isinstance(marks, dict):
            raise ValueError(f"'unhealthy' must be an object of GPU index to reason, got {marks!r}")
        unhealthy: dict[int, str] = {}
        for key, reason in marks.items():
            index = int(key)
            if not 0 <= index < len(self._gpu_models):
                raise ValueError(f"'unhealthy' names GPU {key!r}, which does not exist")
            unhealthy[index] = _str(reason)
        return records, unhealthy

    def save(
        self, records: Sequence[InstanceRecord], *, unhealthy: Mapping[int, str] | None = None
    ) -> None:
        marks = self._unhealthy if unhealthy is None else dict(unhealthy)
        document: dict[str, Any] = {
            "version": STATE_VERSION,
            "node": self._node_name,
            "gpus": self._gpu_models,
            "instances": [
                {"gpu": r.gpu_index, "profile": r.profile, "start": r.start, "gi": r.gi_id,
                 "ci": r.ci_id}
                for r in records
            ],
        }  # fmt: skip
        if marks:
            document["unhealthy"] = {str(index): reason for index, reason in sorted(marks.items())}
        try:
            _write_atomically(self._path, json.dumps(document, indent=1) + "\n")
        except OSError as exc:
            raise BackendError(f"cannot write {self.where}: {exc}") from exc
        self._unhealthy = marks


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as tmp_file:
            tmp_file.write(text)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
