"""The walk of an Inductor cache directory for an import: every file classified and cut into
batches as the batches are asked for, so that worker processes can check the first ones while
the rest of the directory is walked.
"""

from __future__ import annotations

import operator
import os
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import NotAnInductorCacheError
from ..repositories.dynamo import PACKAGE_KEY, PGO_FILE

__all__ = ["BATCH_BYTES", "BATCH_FILES", "CUTLASS_FILE", "GUARDED_KINDS", "Item", "Problem", "Scanner",
           "bytes_of", "scan"]

_SYSTEM_HASH = re.compile(r"[0-9a-f]{64}")
#: ``configs_<request key>.json``: a CUTLASS op list (the request key is group 1).
CUTLASS_FILE = re.compile(r"configs_([0-9a-zA-Z]+)\.json")
#: Files written per transaction: bounds memory and lock time on large imports.
BATCH_FILES = 256
BATCH_BYTES = 256 << 20
GUARDED_KINDS = ("fxgraph", "aotautograd")


@dataclass(frozen=True, slots=True)
class Problem:
    """A file that was not imported: its path and why."""

    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class Item:
    """A file an import reads: its kind, path, path relative to the cache directory, and size
    (bytes, from its stat)."""

    kind: str  # "fxgraph" | "aotautograd" | "cache" | "best_config" | "cutlass" | "triton" | "cpp" | "pgo" | "precompile"
    full: str  # the file's path (str: pathlib's parsing costs more than reading a small file)
    rel: str
    size: int

    @property
    def path(self) -> Path:
        return Path(self.full)


def bytes_of(items: Sequence[Item]) -> int:
    """Bytes (from stat) of ``items``."""
    return sum(item.size for item in items)


_NAME = operator.attrgetter("name")


def _walk(root: str) -> Iterator[tuple[str, str, os.DirEntry[str]]]:
    """``(path, relative posix path, entry)`` of every non-directory under ``root``, as
    ``os.walk`` (sorted names, a directory's files before its subdirectories) lists them: symbolic
    links to directories are not followed, unreadable directories are skipped."""
    stack: list[tuple[str, str]] = [(root, "")]
    while stack:
        top, rel = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError:
            continue
        files: list[os.DirEntry[str]] = []
        dirs: list[os.DirEntry[str]] = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry)
        files.sort(key=_NAME)
        for entry in files:
            yield entry.path, rel + entry.name, entry
        dirs.sort(key=_NAME, reverse=True)  # popped last-first: walked in sorted order
        for entry in dirs:
            try:
                if entry.is_symlink():
                    continue
            except OSError:
                continue
            stack.append((entry.path, rel + entry.name + "/"))


def _classify(root: str, scanner: Scanner) -> Iterator[Item]:
    """The files under ``root`` cachedb imports, in walk order; problems, ignored files and
    whether the directory looks like an Inductor cache are noted on ``scanner``."""
    for path, rel, entry in _walk(root):
        parts = rel.split("/")
        name = parts[-1]
        if parts[0] in ("fxgraph", "aotautograd", "cache"):
            scanner.looks_like_cache = True
        if name.startswith("."):  # write_atomic temporaries; Inductor skips them too
            scanner.ignored += 1
            continue
        try:
            size = entry.stat().st_size
        except OSError as exc:
            scanner.problems.append(Problem(rel, f"cannot stat: {exc}"))
            continue
        top = parts[0]
        if top == "triton":
            # triton/<device>/<key>/<file>; Triton's own temporaries are tmp.pid_* directories.
            if len(parts) == 4 and not parts[2].startswith("tmp.") and name != "lock":
                scanner.looks_like_cache = True
                yield Item("triton", path, rel, size)
            else:
                scanner.ignored += 1
        elif top == "fxgraph":
            if len(parts) == 4 and parts[2].startswith("f") and parts[2][1:3] == parts[1]:
                yield Item("fxgraph", path, rel, size)
            else:
                scanner.problems.append(Problem(rel, "unexpected name: expected fxgraph/<key[1:3]>/<key>/<variant>"))
        elif top == "aotautograd":
            if len(parts) == 3 and parts[1].startswith("a"):
                yield Item("aotautograd", path, rel, size)
            else:
                scanner.problems.append(Problem(rel, "unexpected name: expected aotautograd/<key>/<variant>"))
        elif top == "cache" and len(parts) == 2:
            if _SYSTEM_HASH.fullmatch(name):
                yield Item("cache", path, rel, size)
            else:
                scanner.problems.append(Problem(rel, "unexpected name: expected cache/<64-hex system hash>"))
        elif top == "dynamo":
            # dynamo/code_state_<key>.pkl (PGO; its .lock and .tmp beside it are not) and
            # dynamo/<source id>/entry (precompiled packages; write_atomic's temporaries are
            # dot-files, skipped above)
            if len(parts) == 2 and PGO_FILE.fullmatch(name):
                scanner.looks_like_cache = True
                yield Item("pgo", path, rel, size)
            elif len(parts) == 3 and name == "entry" and PACKAGE_KEY.fullmatch(parts[1]):
                scanner.looks_like_cache = True
                yield Item("precompile", path, rel, size)
            else:
                scanner.ignored += 1
        elif name.endswith(".best_config"):
            scanner.looks_like_cache = True
            yield Item("best_config", path, rel, size)
        elif len(parts) == 1 and CUTLASS_FILE.fullmatch(name):
            scanner.looks_like_cache = True
            yield Item("cutlass", path, rel, size)
        elif len(parts) == 2 and name.endswith(".so") and len(name) > 4 and name[1:3] == parts[0]:
            yield Item("cpp", path, rel, size)
        else:
            scanner.ignored += 1


class Scanner:
    """The walk of a cache directory, classified (:func:`_classify`) and cut into batches (at
    most :data:`BATCH_FILES` files or :data:`BATCH_BYTES` bytes; a CUTLASS op list ends its
    batch) as it is asked for, so that worker processes can check the first batches while the
    rest of the directory is walked.

    Raises :class:`~cachedb.NotAnInductorCacheError` (at construction if ``cache_dir`` is not a
    directory; from :meth:`finish` if the walk found none of the files an Inductor cache holds).
    """

    def __init__(self, cache_dir: Path) -> None:
        if not cache_dir.is_dir():
            raise NotAnInductorCacheError(f"{cache_dir}: not a directory")
        self.cache_dir = cache_dir
        self.problems: list[Problem] = []
        self.ignored = 0
        self.looks_like_cache = False
        #: bytes (from stat) and guarded entry files of the files classified so far
        self.total_bytes = 0
        self.guarded_files = 0
        #: the walk has ended (every file is in a batch)
        self.done = False
        self._items = _classify(os.fspath(cache_dir), self)
        self._ready: deque[list[Item]] = deque()
        self._batch: list[Item] = []
        self._batch_bytes = 0

    def _add(self, item: Item) -> None:
        self._batch.append(item)
        self._batch_bytes += item.size
        self.total_bytes += item.size
        if item.kind in GUARDED_KINDS:
            self.guarded_files += 1
        if len(self._batch) >= BATCH_FILES or self._batch_bytes >= BATCH_BYTES or item.kind == "cutlass":
            self._cut()

    def _cut(self) -> None:
        if self._batch:
            self._ready.append(self._batch)
            self._batch, self._batch_bytes = [], 0

    def _step(self) -> None:
        """One more file classified (or the walk's end)."""
        for item in self._items:
            self._add(item)
            return
        self.done = True
        self._cut()

    def walk_until(self, guarded_files: int) -> None:
        """Walk on until ``guarded_files`` guarded entry files were found or the walk ended."""
        while not self.done and self.guarded_files < guarded_files:
            self._step()

    def finish(self) -> None:
        """Walk to the end. Raises :class:`~cachedb.NotAnInductorCacheError` (see the class)."""
        while not self.done:
            self._step()
        if not self.looks_like_cache:
            raise NotAnInductorCacheError(
                f"{self.cache_dir}: not an Inductor cache directory (no fxgraph/, aotautograd/, cache/, "
                "triton/, dynamo/, *.best_config or configs_*.json)"
            )

    def batches(self) -> Iterator[list[Item]]:
        """The batches in walk order, walking on as they are asked for."""
        while True:
            if self._ready:
                yield self._ready.popleft()
            elif self.done:
                return
            else:
                self._step()


def scan(cache_dir: Path) -> tuple[list[Item], list[Problem], int]:
    """Classify every file under ``cache_dir`` (in this process): ``(items, problems, ignored
    count)``.

    Raises :class:`~cachedb.NotAnInductorCacheError` if ``cache_dir`` is not a directory or
    holds none of the files an Inductor cache holds.
    """
    scanner = Scanner(cache_dir)
    scanner.finish()
    items = [item for batch in scanner.batches() for item in batch]
    return items, scanner.problems, scanner.ignored
