"""Import an Inductor cache directory (as torch 2.9–2.13 write it) into a :class:`CacheDB`.

What is read, relative to the cache directory (``cache_dir()``, torch/_inductor/runtime/
cache_dir_utils.py):

- ``fxgraph/<key[1:3]>/<key>/<variant>`` and ``aotautograd/<key>/<variant>``: guarded entries.
  The pickles are never executed: ``guards_expr`` and the compile time are read from the opcode
  stream (:mod:`cachedb.formats.pickle_scan`) or, in the worker processes that check large imports
  (:mod:`cachedb.layout.pool`), by the C unpickler over inert stand-ins
  (:mod:`cachedb.formats.own_pickle`).
- ``cache/<system hash>``: autotune timings and LocalCache values.
- every ``*.best_config``: autotune best configs, keyed by their relative path.
- ``configs_<request key>.json``: CUTLASS op lists.
- ``dynamo/code_state_<key>.pkl`` and ``dynamo/<source id>/entry``: Dynamo's PGO profiles and
  precompiled packages (stored as they are, never unpickled; of a stored row and a file of one
  key, the one modified later wins).
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

import datetime as dt
import gc
import hashlib
import os
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..formats import local_cache_doc as doc
from .._errors import input_error_reason, BadInputError
from ..formats.cutlass_ops import infer_arch, parse_op_list
from ..db import CacheDB, Repos
from ..store.signing import Signer
from ..fingerprint import Fingerprint
from .pool import default_workers, map_in_workers
from .walk import CUTLASS_FILE, GUARDED_KINDS, Item, Problem, Scanner, bytes_of, scan
from ..formats.own_pickle import read_own_entry_fields
from ..store.payload import guarded_level, pack
from ..formats.pickle_scan import EntryFields, read_entry_fields
from ..keys import sha256_digest_name
from ..repositories.best_configs import prepare_columns
from ..repositories.dynamo import PGO_FILE
from ..repositories.guarded import ScannedPayload
from ..repositories.timings import next_position

__all__ = ["KINDS", "ImportReport", "Importer", "Problem", "scan"]

#: Kinds of files, as counted in reports.
KINDS = (
    "fxgraph", "aotautograd", "autotune_timings", "local_cache_values", "best_config", "cutlass_op_list",
    "triton_kernel_file", "cpp_kernel", "pgo_profile", "dynamo_package",
)

#: Guarded entry files from which an import checks them in worker processes
#: (:mod:`cachedb.layout.pool`); fewer are checked in-process (starting workers costs more).
_POOL_MIN_FILES = 1024
#: Bytes of guarded entry files the workers may check ahead of the writer (they start while the
#: directory is still being walked): more batches than the pool's default two per worker when
#: they are small, bounding the memory their results hold (payload and compressed copy).
_AHEAD_BYTES = 64 << 20
#: Batches between two collections of the young generations (``gc.collect(1)``) while an
#: import runs with automatic collection off (:meth:`Importer.run`): the reference cycles a
#: batch leaves (a session and its transaction) are freed within that many.
_GC_EVERY_BATCHES = 16
#: Files and bytes (from stat) written per transaction: batches (:data:`~cachedb.layout.walk.
#: BATCH_FILES` files) are written into one transaction until it holds this many, then it
#: commits. Each commit writes every page the inserts changed to the WAL, and the unique
#: index of guarded entries takes its keys in random order, so small transactions rewrite the
#: same index pages again and again: 1,024 files a commit imports the 10,000 small files of
#: ``benchmarks`` §5 in ~0.69 s against ~0.76 s at 256 (4,096: ~0.75 s, the first commit waits
#: longer). A kill loses at most the transaction being written.
_COMMIT_FILES = 1024
_COMMIT_BYTES = 64 << 20


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


_O_READ = os.O_RDONLY | getattr(os, "O_BINARY", 0)


def _read(path: str, size: int) -> bytes:
    """The bytes of the file at ``path``, ``size`` (bytes, from its stat) a hint for one read.
    Raises OSError."""
    fd = os.open(path, _O_READ)
    try:
        data = os.read(fd, size + 1)
        if not data:
            return data
        chunks = [data]  # read to the end: a read may return less, the file may have grown
        while chunk := os.read(fd, max(size + 1 - len(data), 1 << 16)):
            chunks.append(chunk)
        return data if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def _check_guarded(
    kind: str, rel: str, data: bytes, reader: Callable[..., EntryFields] = read_entry_fields, *,
    pack_for: str | None = None,
) -> Problem | ScannedPayload:
    """A guarded entry file (``kind``, path ``rel`` relative to the cache directory) ready to
    store, or why it cannot be imported: its name must be ``sha256_hash`` of its bytes (as
    Inductor names it) and its pickle must scan (``reader``: the opcode walk, or in a worker
    process the C reader that falls back to it). The SHA-256 and the scan are done once here;
    the repository reuses them. ``pack_for`` (a dialect name, ``"sqlite"`` ...): the entry comes
    compressed as that database stores it (:func:`~cachedb.store.payload.guarded_level`), its bytes
    dropped; else it holds its bytes and the repository compresses it if it adds it."""
    parts = rel.split("/")
    digest = hashlib.sha256(data).digest()
    variant = sha256_digest_name(digest)
    if variant != parts[-1]:
        return Problem(rel, "file name is not sha256_hash of its bytes (renamed or corrupted)")
    if len(parts[-2]) > 128:
        return Problem(rel, "key longer than 128 characters")
    try:
        fields = reader(data, where=rel)
        for text in (fields.guards_expr, fields.reason):
            if text is not None:
                text.encode("utf-8")
        if fields.time_taken_ns is not None and not -(2**63) <= fields.time_taken_ns < 2**63:
            raise OverflowError(f"time taken {fields.time_taken_ns} ns is outside int64")
    except Exception as exc:  # noqa: BLE001
        reason = input_error_reason(exc)
        if reason is None:
            raise
        return Problem(rel, reason)
    size = len(data)
    if pack_for is not None:
        # the stored frame alone, not the content beside it (an FX graph entry under 1 MiB is
        # stored as it is: a worker's pipe would carry its bytes twice)
        blob: bytes | None = pack(data, digest=digest, level=guarded_level(size, pack_for)).blob
        payload: bytes | None = None
    else:
        blob, payload = None, data
    return ScannedPayload(kind, parts[-2], variant, fields.guards_expr, fields.guards_known, fields.reason, size,
                          digest.hex(), fields.time_taken_ns, payload, blob)


#: A guarded entry file as :func:`_check_guarded_files` takes it: ``(kind, path, path relative
#: to the cache directory, size from its stat)`` (a plain tuple: the batches go to the worker
#: processes pickled, and an :class:`Item` costs ~2 us a file to pickle and ~2 to unpickle,
#: against ~0.2).
_GuardedFile = tuple[str, str, str, int]


def _guarded_files(batch: Sequence[Item]) -> list[_GuardedFile]:
    """The guarded entry files of ``batch``, as :func:`_check_guarded_files` takes them."""
    return [(i.kind, i.full, i.rel, i.size) for i in batch if i.kind in GUARDED_KINDS]


def _weigh(files: Sequence[_GuardedFile]) -> int:
    """Bytes (from stat) of ``files``."""
    return sum(f[3] for f in files)


#: A checked guarded entry file as :func:`_check_guarded_files` returns it: ``(bytes read,
#: reason)`` for a file that cannot be imported, else ``(bytes read, ScannedPayload)`` (a named
#: tuple: a worker's results are pickled back, and dataclasses cost ~18 us a file to pickle and
#: unpickle against ~1 us). :func:`_decode_checked` makes it a Problem or the ScannedPayload.
_Checked = tuple[int, "str | ScannedPayload"]


@dataclass(frozen=True, slots=True)
class _Staged:
    """A batch read and checked, ready to write (:meth:`Importer._store_batch`): guarded entries,
    best configs ``(key, content, columns)``, files stored one by one (timings document, CUTLASS
    op list) with their bytes, and kernel files by ``(kind, key)`` as ``(name, bytes)``."""

    guarded: list[tuple[Item, ScannedPayload]]
    best: list[tuple[Item, tuple[str, str, dict[str, Any]]]]
    others: list[tuple[Item, bytes]]
    kernels: dict[tuple[str, str], list[tuple[str, bytes]]]


def _check_guarded_files(files: Sequence[_GuardedFile], *, contained: bool, dialect: str = "sqlite") -> list[_Checked]:
    """Read and check guarded entry files (:func:`_check_guarded`), one :data:`_Checked` per
    file.

    ``contained``: this runs in a disposable worker process (:mod:`cachedb.layout.pool`), so
    pickles are read by the C unpickler over inert stand-ins (:func:`cachedb.formats.own_pickle.
    read_own_entry_fields`, the same fields as the opcode walk, several times faster; a file
    that crashes or hangs it takes down the worker, not the import) and payloads are
    compressed here, at the level of a ``dialect`` database (:func:`~cachedb.store.payload.
    guarded_level`). Otherwise the opcode walk reads them and the repository compresses only
    the entries it adds."""
    out: list[_Checked] = []
    reader = read_own_entry_fields if contained else read_entry_fields
    pack_for = dialect if contained else None
    for kind, full, rel, size in files:
        try:
            data = _read(full, size)
        except OSError as exc:
            out.append((0, f"cannot read: {exc}"))
            continue
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            out.append((len(data), "file name is not valid UTF-8"))
            continue
        checked = _check_guarded(kind, rel, data, reader, pack_for=pack_for)
        out.append((len(data), checked.reason if isinstance(checked, Problem) else checked))
    return out


def _decode_checked(item: Item, checked: _Checked) -> Problem | ScannedPayload:
    """The :data:`_Checked` of ``item`` as the repository takes it."""
    result = checked[1]
    return Problem(item.rel, result) if isinstance(result, str) else result


def _check_best_config(item: Item, data: bytes, signer: Signer | None) -> Problem | tuple[str, str, dict[str, Any]]:
    """``(key, content, columns)`` of a best config file ready to store
    (:meth:`~cachedb.repositories.best_configs.BestConfigRepository.put_many`), or why it cannot
    be imported (not UTF-8, not a JSON object, ...)."""
    try:
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInputError(item.rel, f"not UTF-8 text: {exc}") from exc
        return item.rel, content, prepare_columns(signer, item.rel, content)
    except Exception as exc:  # noqa: BLE001
        reason = input_error_reason(exc)
        if reason is None:
            raise
        return Problem(item.rel, reason)


_V = TypeVar("_V")


def _store(
    repos: Repos,
    checked: list[tuple[Item, _V]],
    report: ImportReport,
    store_many: Callable[[Sequence[_V]], list[bool]],
    store_one: Callable[[_V], bool],
) -> None:
    """Store checked files of one kind: all at once (``store_many``, one bulk INSERT) in a
    savepoint; when the database refuses one of them (a value it cannot store, a row another
    writer inserted meanwhile), that is rolled back and each file is stored by ``store_one``
    in its own savepoint, so only the bad one is reported and skipped. Counts each file as
    added or unchanged under its kind."""
    results: list[bool | None]
    try:
        with repos.savepoint():
            results = list(store_many([value for _, value in checked]))
    except Exception as exc:  # noqa: BLE001 - bad input fails in many ways
        if input_error_reason(exc) is None:
            raise
        results = []
        for item, value in checked:
            try:
                with repos.savepoint():
                    results.append(store_one(value))
            except Exception as one_exc:  # noqa: BLE001
                reason = input_error_reason(one_exc)
                if reason is None:
                    raise
                report.problems.append(Problem(item.rel, reason))
                results.append(None)
    for (item, _), added in zip(checked, results):
        if added is not None:
            (report.added if added else report.unchanged)[item.kind] += 1


@contextmanager
def _automatic_gc_off() -> Iterator[None]:
    """Python's automatic garbage collection off for the block (as it was after)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class Importer:
    """Imports cache directories into ``db``.

    ``fingerprint``, when given, is attributed to every imported entry (e.g. the current
    process's, :func:`cachedb.fingerprint.current`, for a directory written on this machine
    by this torch); by default guarded entries and best configs carry none, and timings carry
    the system description found in their own file.

    ``workers``: processes that read, check and compress guarded entry files while this one
    writes (:mod:`cachedb.layout.pool`; forked, Linux only); default
    :func:`~cachedb.layout.pool.default_workers` (one fewer than the usable CPUs, at most 4) for imports of
    1,024 guarded files or more, none for fewer; 0 = all in this process.
    """

    def __init__(
        self, db: CacheDB, *, fingerprint: Fingerprint | None = None, host_key: str | None = None,
        workers: int | None = None,
    ) -> None:
        self.db = db
        self.fingerprint = fingerprint
        #: the host key C++ libraries are stored under ("" = unknown host: never served)
        self.host_key = host_key or ""
        self.workers = workers

    def run(
        self, cache_dir: str | os.PathLike[str], *, progress: Callable[[int, int], None] | None = None
    ) -> ImportReport:
        """Import ``cache_dir``. ``progress(done_bytes, total_bytes)`` is called after each batch
        (at most 256 files) is written, with the bytes of every file the import reads as the
        total. Batches are committed together, one transaction per :data:`_COMMIT_FILES` files
        or :data:`_COMMIT_BYTES` bytes: an error or a kill loses the open one only, and a
        re-import adds what it lacks.

        Python's automatic garbage collection is off while it runs (restored after): the walk
        and the batches allocate hundreds of thousands of short-lived containers, and in a
        process holding torch each full collection walks torch's millions of objects too. The
        young generations are collected every :data:`_GC_EVERY_BATCHES` batches instead."""
        with _automatic_gc_off():
            return self._run(Path(cache_dir), progress)

    def _run(self, cache_dir: Path, progress: Callable[[int, int], None] | None) -> ImportReport:
        scanner = Scanner(cache_dir)
        # Walk as far as choosing the workers needs: to _POOL_MIN_FILES guarded entry files by
        # default, else to the first one (none: nothing for workers to check).
        scanner.walk_until(_POOL_MIN_FILES if self.workers is None else 1)
        if self.workers is None:
            workers = default_workers() if scanner.guarded_files >= _POOL_MIN_FILES else 0
        else:
            workers = self.workers if scanner.guarded_files else 0
        if workers == 0:
            scanner.finish()
        report = ImportReport(problems=scanner.problems)
        handed_out: deque[list[Item]] = deque()

        def guarded_batches() -> Iterator[list[_GuardedFile]]:
            for batch in scanner.batches():
                handed_out.append(batch)
                yield _guarded_files(batch)

        done = 0
        # The workers start on the first batches while this thread walks the rest of the
        # directory (map_in_workers takes batches as it submits them, up to _AHEAD_BYTES ahead);
        # nothing is written before the walk has ended: the directory is known to be a cache
        # and ``progress`` gets the final total from its first call.
        # Closed here, in this thread, even on an error or Ctrl-C: closing stops the workers
        # (after the open transaction, if any, is rolled back).
        with closing(map_in_workers(
            partial(_check_guarded_files, contained=True, dialect=self.db.engine.dialect.name),
            partial(_check_guarded_files, contained=False),
            guarded_batches(), workers=workers, ahead_bytes=_AHEAD_BYTES, weigh=_weigh,
        )) as checked, ExitStack() as open_transaction:
            repos: Repos | None = None
            pending_files = pending_bytes = 0
            for n, checked_guarded in enumerate(checked, 1):
                scanner.finish()
                batch = handed_out.popleft()
                staged = self._stage_batch(batch, checked_guarded, report)
                if repos is None:
                    repos = open_transaction.enter_context(self.db.transaction())
                self._store_batch(repos, staged, report)
                batch_bytes = bytes_of(batch)
                done += batch_bytes
                pending_files += len(batch)
                pending_bytes += batch_bytes
                if pending_files >= _COMMIT_FILES or pending_bytes >= _COMMIT_BYTES:
                    open_transaction.close()  # commits
                    repos, pending_files, pending_bytes = None, 0, 0
                if n % _GC_EVERY_BATCHES == 0:
                    gc.collect(1)
                if progress:
                    progress(done, scanner.total_bytes)
        scanner.finish()  # a walk with no batch still has to be a cache
        report.ignored_files = scanner.ignored
        return report

    def _stage_batch(self, batch: list[Item], checked_guarded: list[_Checked], report: ImportReport) -> _Staged:
        """A batch's files read and checked, ready for :meth:`_store_batch`, outside any
        transaction. Guarded entries come checked (:func:`_check_guarded_files`: name =
        ``sha256_hash`` of the bytes, pickle scannable); best configs are checked here (UTF-8
        JSON objects); the other files are read. A file that cannot be read or fails its check
        goes to ``report.problems``."""
        guarded: list[tuple[Item, ScannedPayload]] = []
        best: list[tuple[Item, tuple[str, str, dict[str, Any]]]] = []
        others: list[tuple[Item, bytes]] = []
        kernels: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
        signer = self.db.signer
        guarded_items = [item for item in batch if item.kind in GUARDED_KINDS]
        for item, checked in zip(guarded_items, checked_guarded, strict=True):
            report.bytes_read += checked[0]
            scanned = _decode_checked(item, checked)
            if isinstance(scanned, Problem):
                report.problems.append(scanned)
            else:
                guarded.append((item, scanned))
        for item in batch:
            kind = item.kind
            if kind in GUARDED_KINDS:
                continue
            try:
                data = _read(item.full, item.size)
            except OSError as exc:
                report.problems.append(Problem(item.rel, f"cannot read: {exc}"))
                continue
            report.bytes_read += len(data)
            try:
                item.rel.encode("utf-8")
            except UnicodeEncodeError:
                report.problems.append(Problem(item.rel, "file name is not valid UTF-8"))
                continue
            if kind == "best_config":
                config = _check_best_config(item, data, signer)
                if isinstance(config, Problem):
                    report.problems.append(config)
                else:
                    best.append((item, config))
            elif kind == "triton":
                _, _, key, name = item.rel.split("/")
                kernels.setdefault(("triton", key), []).append((name, data))
            elif kind == "cpp":
                name = item.rel.split("/")[-1]
                kernels.setdefault(("cpp", name.split(".", 1)[0]), []).append((name, data))
            else:
                others.append((item, data))
        return _Staged(guarded, best, others, kernels)

    def _store_batch(self, repos: Repos, staged: _Staged, report: ImportReport) -> None:
        """Write a staged batch in the open transaction: guarded entries and best configs in
        bulk (:func:`_store`), the other files one by one, each in a savepoint so a bad one
        leaves the rest."""
        guarded, best, others, kernels = staged.guarded, staged.best, staged.others, staged.kernels
        fp_id = repos.fingerprints.ensure(self.fingerprint) if self.fingerprint else None
        if guarded:
            g = repos.guarded
            _store(
                repos, guarded, report,
                lambda entries: g.put_many_pickled(entries, fingerprint_id=fp_id),
                lambda e: g.put(e.kind, e.key, e.content(), guards_expr=e.guards_expr,
                                guards_known=e.guards_known, guards_note=e.guards_note,
                                time_taken_ns=e.time_taken_ns, fingerprint_id=fp_id)[1],
            )
        if best:
            b = repos.best_configs
            _store(
                repos, best, report,
                lambda configs: b.put_many(configs, fingerprint_id=fp_id),
                lambda c: b.put(c[0], c[1], fingerprint_id=fp_id, columns=c[2]),
            )
        for (kind, key), files in kernels.items():
            label = "triton_kernel_file" if kind == "triton" else "cpp_kernel"
            host = self.host_key if kind == "cpp" else ""
            added = repos.artifacts.put_files(kind, key, files, host_key=host, fingerprint_id=fp_id)
            report.added[label] += added
            report.unchanged[label] += len(files) - added
        for item, data in others:
            try:
                with repos.savepoint():
                    self._import_one(repos, item, data, fp_id, report)
            except Exception as exc:  # noqa: BLE001 - bad input fails in many ways
                reason = input_error_reason(exc)
                if reason is None:
                    raise
                report.problems.append(Problem(item.rel, reason))

    def _import_one(
        self, repos: Repos, item: Item, data: bytes, fp_id: int | None, report: ImportReport
    ) -> None:
        if item.kind == "cache":
            self._import_local_cache(repos, item, data, report)
        elif item.kind == "cutlass":
            match = CUTLASS_FILE.fullmatch(item.rel)
            assert match is not None
            rows = parse_op_list(data, where=item.rel)
            added = repos.cutlass.put(match.group(1), data, rows, arch=infer_arch(rows))
            (report.added if added else report.unchanged)["cutlass_op_list"] += 1
        elif item.kind == "pgo":
            pgo = PGO_FILE.fullmatch(item.rel.rsplit("/", 1)[-1])
            assert pgo is not None
            self._import_dynamo(repos, "pgo", pgo.group(1), item, data, fp_id, report, "pgo_profile")
        elif item.kind == "precompile":
            self._import_dynamo(repos, "precompile", item.rel.split("/")[1], item, data, fp_id, report,
                                "dynamo_package")

    @staticmethod
    def _import_dynamo(
        repos: Repos, kind: str, key: str, item: Item, data: bytes, fp_id: int | None, report: ImportReport,
        label: str,
    ) -> None:
        """One of Dynamo's caches (:mod:`cachedb.repositories.dynamo`), as written at its file's
        modification time: it replaces a stored row of its key only if it is newer."""
        try:
            mtime = dt.datetime.fromtimestamp(os.stat(item.full).st_mtime, dt.timezone.utc)
        except OSError:
            mtime = None
        added = repos.dynamo(kind).put(key, data, fingerprint_id=fp_id, updated_at=mtime)
        (report.added if added else report.unchanged)[label] += 1

    def _import_local_cache(self, repos: Repos, item: Item, data: bytes, report: ImportReport) -> None:
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
        timings, values = doc.split_cache(cache, start=next_position(repos.bind))
        added = repos.timings.add_leaves(fp_id, timings)
        report.added["autotune_timings"] += added
        report.unchanged["autotune_timings"] += len(timings) - added
        added = repos.local_values.add_leaves(fp_id, values)
        report.added["local_cache_values"] += added
        report.unchanged["local_cache_values"] += len(values) - added
