"""Import an Inductor cache directory (as torch 2.9–2.13 write it) into a :class:`CacheDB`.

What is read, relative to the cache directory (``cache_dir()``, torch/_inductor/runtime/
cache_dir_utils.py):

- ``fxgraph/<key[1:3]>/<key>/<variant>`` and ``aotautograd/<key>/<variant>``: guarded entries.
  The pickles are never executed: ``guards_expr`` and the compile time are read from the opcode
  stream (:mod:`cachedb._pickle_scan`).
- ``cache/<system hash>``: autotune timings and LocalCache values.
- every ``*.best_config``: autotune best configs, keyed by their relative path.
- ``configs_<request key>.json``: CUTLASS op lists.
- ``triton/<device>/<key>/<file>``: Triton's kernel cache (every file of every key directory,
  group files included).
- ``<k[1:3]>/<k>*.so``: C++ kernel libraries (``CppCodeCache``). Their host key
  (:func:`cachedb.fingerprint.cpp_host_key`) is this machine's when the importer is told the
  directory was written here (``host_key=``; ``cachedb import --this-machine``), else ``""``:
  stored and exported, never served to a live compile.

Everything else (generated sources, object files, locks) is not cachedb's and is counted as
ignored. A bad file is reported with its path and reason and skipped; the rest imports.
Re-importing is idempotent.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import _local_cache_doc as doc
from ._errors import input_error_reason, BadInputError, CacheDBError, NotAnInductorCacheError
from .cutlass_ops import infer_arch, parse_op_list
from .db import CacheDB, Repos
from .fingerprint import Fingerprint
from ._pickle_scan import EntryFields, read_entry_fields
from .keys import sha256_hash
from .repositories.timings import next_position

#: Kinds of files, as counted in reports.
KINDS = (
    "fxgraph", "aotautograd", "autotune_timings", "local_cache_values", "best_config", "cutlass_op_list",
    "triton_kernel_file", "cpp_kernel",
)

_SYSTEM_HASH = re.compile(r"[0-9a-f]{64}")
_CUTLASS_FILE = re.compile(r"configs_([0-9a-zA-Z]+)\.json")
#: Files written per transaction: bounds memory and lock time on large imports.
_BATCH_FILES = 256
_BATCH_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class Problem:
    """A file that was not imported: its path and why."""

    path: str
    reason: str


@dataclass
class ImportReport:
    """What an import did. ``added[kind]`` counts new rows (entries, timings, values, …),
    ``unchanged[kind]`` files or leaves that were already stored."""

    added: Counter[str] = field(default_factory=Counter)
    unchanged: Counter[str] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    ignored_files: int = 0
    bytes_read: int = 0


@dataclass(frozen=True, slots=True)
class _Item:
    kind: str  # "fxgraph" | "aotautograd" | "cache" | "best_config" | "cutlass" | "triton" | "cpp"
    path: Path
    rel: str
    size: int


def _walk(root: Path) -> Iterator[tuple[Path, str]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath, name)
            yield full, full.relative_to(root).as_posix()


def scan(cache_dir: Path) -> tuple[list[_Item], list[Problem], int]:
    """Classify every file under ``cache_dir``: ``(items, problems, ignored count)``.

    Raises :class:`~cachedb.NotAnInductorCacheError` if ``cache_dir`` is not a directory or
    holds none of the files an Inductor cache holds.
    """
    if not cache_dir.is_dir():
        raise NotAnInductorCacheError(f"{cache_dir}: not a directory")
    items: list[_Item] = []
    problems: list[Problem] = []
    ignored = 0
    looks_like_cache = False
    for path, rel in _walk(cache_dir):
        parts = rel.split("/")
        name = parts[-1]
        if parts[0] in ("fxgraph", "aotautograd", "cache"):
            looks_like_cache = True
        if name.startswith("."):  # write_atomic temporaries; Inductor skips them too
            ignored += 1
            continue
        try:
            size = path.stat().st_size
        except OSError as exc:
            problems.append(Problem(rel, f"cannot stat: {exc}"))
            continue
        top = parts[0]
        if top == "triton":
            # triton/<device>/<key>/<file>; Triton's own temporaries are tmp.pid_* directories.
            if len(parts) == 4 and not parts[2].startswith("tmp.") and name != "lock":
                looks_like_cache = True
                items.append(_Item("triton", path, rel, size))
            else:
                ignored += 1
        elif top == "fxgraph":
            if len(parts) == 4 and parts[2].startswith("f") and parts[2][1:3] == parts[1]:
                items.append(_Item("fxgraph", path, rel, size))
            else:
                problems.append(Problem(rel, "unexpected name: expected fxgraph/<key[1:3]>/<key>/<variant>"))
        elif top == "aotautograd":
            if len(parts) == 3 and parts[1].startswith("a"):
                items.append(_Item("aotautograd", path, rel, size))
            else:
                problems.append(Problem(rel, "unexpected name: expected aotautograd/<key>/<variant>"))
        elif top == "cache" and len(parts) == 2:
            if _SYSTEM_HASH.fullmatch(name):
                items.append(_Item("cache", path, rel, size))
            else:
                problems.append(Problem(rel, "unexpected name: expected cache/<64-hex system hash>"))
        elif name.endswith(".best_config"):
            looks_like_cache = True
            items.append(_Item("best_config", path, rel, size))
        elif len(parts) == 1 and _CUTLASS_FILE.fullmatch(name):
            looks_like_cache = True
            items.append(_Item("cutlass", path, rel, size))
        elif len(parts) == 2 and name.endswith(".so") and len(name) > 4 and name[1:3] == parts[0]:
            items.append(_Item("cpp", path, rel, size))
        else:
            ignored += 1
    if not looks_like_cache:
        raise NotAnInductorCacheError(
            f"{cache_dir}: not an Inductor cache directory (no fxgraph/, aotautograd/, cache/, "
            "triton/, *.best_config or configs_*.json)"
        )
    return items, problems, ignored


def _check_guarded(item: _Item, data: bytes) -> Problem | EntryFields:
    """The scanned fields of a guarded entry file, or why it cannot be imported: its name
    must be ``sha256_hash`` of its bytes (as Inductor names it) and its pickle must scan."""
    if sha256_hash(data) != item.rel.split("/")[-1]:
        return Problem(item.rel, "file name is not sha256_hash of its bytes (renamed or corrupted)")
    if len(item.rel.split("/")[-2]) > 128:
        return Problem(item.rel, "key longer than 128 characters")
    try:
        fields = read_entry_fields(data, where=item.rel)
        for text in (fields.guards_expr, fields.reason):
            if text is not None:
                text.encode("utf-8")
        if fields.time_taken_ns is not None and not -(2**63) <= fields.time_taken_ns < 2**63:
            raise OverflowError(f"time taken {fields.time_taken_ns} ns is outside int64")
        return fields
    except Exception as exc:  # noqa: BLE001
        reason = input_error_reason(exc)
        if reason is None:
            raise
        return Problem(item.rel, reason)


class Importer:
    """Imports cache directories into ``db``.

    ``fingerprint``, when given, is attributed to every imported entry (e.g. the current
    process's, :func:`cachedb.fingerprint.current`, for a directory written on this machine
    by this torch); by default guarded entries and best configs carry none, and timings carry
    the system description found in their own file.
    """

    def __init__(
        self, db: CacheDB, *, fingerprint: Fingerprint | None = None, host_key: str | None = None
    ) -> None:
        self.db = db
        self.fingerprint = fingerprint
        #: the host key C++ libraries are stored under ("" = unknown host: never served)
        self.host_key = host_key or ""

    def run(
        self, cache_dir: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
    ) -> ImportReport:
        """Import ``cache_dir``. ``progress(done_bytes, total_bytes)`` is called after each file."""
        root = Path(cache_dir)
        items, problems, ignored = scan(root)
        report = ImportReport(problems=problems, ignored_files=ignored)
        total = sum(i.size for i in items)
        done = 0
        batch: list[_Item] = []
        batch_bytes = 0
        for item in items:
            batch.append(item)
            batch_bytes += item.size
            if len(batch) >= _BATCH_FILES or batch_bytes >= _BATCH_BYTES or item.kind == "cutlass":
                done += self._import_batch(batch, report)
                batch, batch_bytes = [], 0
                if progress:
                    progress(done, total)
        if batch:
            done += self._import_batch(batch, report)
            if progress:
                progress(done, total)
        return report

    def _import_batch(self, batch: list[_Item], report: ImportReport) -> int:
        """One transaction per batch. Guarded entries are checked (name = ``sha256_hash`` of
        the bytes, pickle scannable) before the transaction and then written in bulk; other
        files go one by one, each in a savepoint so a bad one leaves the rest."""
        guarded: list[tuple[_Item, bytes, EntryFields]] = []
        others: list[tuple[_Item, bytes]] = []
        kernels: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
        for item in batch:
            try:
                data = item.path.read_bytes()
            except OSError as exc:
                report.problems.append(Problem(item.rel, f"cannot read: {exc}"))
                continue
            report.bytes_read += len(data)
            try:
                item.rel.encode("utf-8")
            except UnicodeEncodeError:
                report.problems.append(Problem(item.rel, "file name is not valid UTF-8"))
                continue
            if item.kind == "triton":
                _, _, key, name = item.rel.split("/")
                kernels.setdefault(("triton", key), []).append((name, data))
            elif item.kind == "cpp":
                name = item.rel.split("/")[-1]
                kernels.setdefault(("cpp", name.split(".", 1)[0]), []).append((name, data))
            elif item.kind in ("fxgraph", "aotautograd"):
                checked = _check_guarded(item, data)
                if isinstance(checked, Problem):
                    report.problems.append(checked)
                else:
                    guarded.append((item, data, checked))
            else:
                others.append((item, data))
        with self.db.transaction() as repos:
            fp_id = repos.fingerprints.ensure(self.fingerprint) if self.fingerprint else None
            if guarded:
                entries = [(i.kind, i.rel.split("/")[-2], data, fields) for i, data, fields in guarded]
                for (item, _, _), added in zip(guarded, repos.guarded.put_many_pickled(entries, fingerprint_id=fp_id)):
                    (report.added if added else report.unchanged)[item.kind] += 1
            for (kind, key), files in kernels.items():
                label = "triton_kernel_file" if kind == "triton" else "cpp_kernel"
                host = self.host_key if kind == "cpp" else ""
                added = repos.artifacts.put_files(kind, key, files, host_key=host, fingerprint_id=fp_id)
                report.added[label] += added
                report.unchanged[label] += len(files) - added
            for item, data in others:
                try:
                    with repos.session.begin_nested():
                        self._import_one(repos, item, data, fp_id, report)
                except Exception as exc:  # noqa: BLE001 - bad input fails in many ways
                    reason = input_error_reason(exc)
                    if reason is None:
                        raise
                    report.problems.append(Problem(item.rel, reason))

        return sum(i.size for i in batch)

    def _import_one(
        self, repos: Repos, item: _Item, data: bytes, fp_id: int | None, report: ImportReport
    ) -> None:
        if item.kind == "cache":
            self._import_local_cache(repos, item, data, report)
        elif item.kind == "best_config":
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadInputError(item.rel, f"not UTF-8 text: {exc}") from exc
            added = repos.best_configs.put(item.rel, content, fingerprint_id=fp_id)
            (report.added if added else report.unchanged)["best_config"] += 1
        elif item.kind == "cutlass":
            match = _CUTLASS_FILE.fullmatch(item.rel)
            assert match is not None
            rows = parse_op_list(data, where=item.rel)
            added = repos.cutlass.put(match.group(1), data, rows, arch=infer_arch(rows))
            (report.added if added else report.unchanged)["cutlass_op_list"] += 1

    def _import_local_cache(self, repos: Repos, item: _Item, data: bytes, report: ImportReport) -> None:
        system, cache = doc.parse(data, where=item.rel)
        if system["hash"] != item.path.name:
            raise BadInputError(item.rel, f"system hash {system['hash']!r} does not match the file name")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInputError(item.rel, f"not UTF-8 text: {exc}") from exc
        if doc.render(system, cache) != text:
            report.notes.append(
                Problem(item.rel, "imported, but not in the form CacheBase.update_local_cache "
                        "writes (json.dumps indent=4): an export will not be byte-identical")
            )
        fp = self.fingerprint
        if fp is None or fp.system_hash != system["hash"]:
            fp = Fingerprint(system=system)
        fp_id = repos.fingerprints.ensure(fp)
        timings, values = doc.split_cache(cache, start=next_position(repos.session))
        added = repos.timings.add_leaves(fp_id, timings)
        report.added["autotune_timings"] += added
        report.unchanged["autotune_timings"] += len(timings) - added
        added = repos.local_values.add_leaves(fp_id, values)
        report.added["local_cache_values"] += added
        report.unchanged["local_cache_values"] += len(values) - added
