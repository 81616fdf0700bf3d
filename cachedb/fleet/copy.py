"""Database-to-database copy and merge (``cachedb copy SRC DST``, ``cachedb merge SRC... --into DST``).

Any location to any other: an SQLite file or a SQLAlchemy URL (PostgreSQL) on either side.
Every table's rows go over, source table by table in id order, in batches of at most
``batch_rows`` rows or ``batch_bytes`` bytes, **one DST transaction per batch**. Ids are not
copied: DST assigns its own and every foreign key is remapped through the parent's natural
key (fingerprints by ``fingerprint_key``, kernel blobs by ``sha256``, CUTLASS op lists by
``request_key``). Payloads (zstd frames) and signatures are copied as stored: nothing is
re-signed, so a signed database still verifies under its key afterwards. FX graph /
AOTAutograd payloads are re-encoded in the form this version writes to DST
(:func:`cachedb.store.payload.repacked_guarded`: on SQLite entries under 1 MiB stored as they are,
larger ones compressed; on PostgreSQL all compressed) between an SQLite file and PostgreSQL,
whose forms differ, and between two of a kind with ``repack``: each is verified first, keeps
its content and SHA-256, and so its signature; one that fails its checks is copied as stored
and counted.

Rows move through the database drivers (:mod:`cachedb.store.bulk`: SQLite's cursor or a
PostgreSQL server-side binary cursor in; a binary ``COPY ... FROM STDIN`` or sqlite3's
``executemany`` out) with the values SQLAlchemy would have stored, and a reader thread reads
the next batch while the current one is written where that overlaps (a PostgreSQL DST, or a
PostgreSQL SRC). ``merge`` finds what DST holds with one indexed query per 500 keys of a
batch. An SQLite DST's WAL is checkpointed once, at the end, not every few batches.

Natural keys decide what DST already holds, so an interrupted run (any exception, Ctrl-C, a
crash) keeps the batches it committed and a re-run continues where it stopped:

==========================  ====================================================  ==========================
table                       natural key                                           when DST already has it
==========================  ====================================================  ==========================
``system_fingerprints``     ``fingerprint_key``                                   DST's row is kept (unified)
``kernel_blobs``            ``sha256``                                            DST's row is kept
``kernel_artifacts``        ``(kind, host_key, key, name)``                       DST's row is kept
``guarded_entries``         ``(kind, key, variant)`` (variant = payload's hash)   DST's row is kept
``key_factors``             ``(factor, hash)``: those the ``entry_factors``       DST's row is kept
                            copied name (not the miss log's)
``entry_factors``           ``(kind, key)``, its ``key_factors`` ids remapped     DST's row is kept
``autotune_timings``        ``(fingerprint key, op, inputs, hint_override,        never the same row: every
                            precision, choice_hash, recorded_at)``                benchmark is history, kept
``autotune_choices``        ``choice_hash`` (what torch said of the choice)       DST's row is kept
``local_cache_values``      ``(fingerprint key, key_path)``                       the newer ``updated_at`` wins
``best_configs``            ``key``                                               the newer ``updated_at`` wins
``cutlass_op_lists``        ``request_key`` (with its ``cutlass_ops``)            DST's list is kept
``quarantined_entries``     ``(kind, key, variant, checksum, quarantined_at)``    DST's row is kept
``pgo_profiles``            ``key``                                               the newer ``updated_at`` wins
``dynamo_packages``         ``key`` (the compiled function's source id)           the newer ``updated_at`` wins
``precompile_refusals``     ``key`` (as the package's)                            the newer ``updated_at`` wins
==========================  ====================================================  ==========================

Best configs (and LocalCache values, and Dynamo's caches) cannot keep both rows, their
key being unique: the one with the newer ``updated_at`` is stored and served, the older one is
dropped (a tie keeps DST's); the summary counts replaced DST rows as ``replaced`` and dropped
SRC rows as ``skipped``. A CUTLASS request key names the generator's inputs, so two lists under
one key are the same list; DST's stays.

Timings and LocalCache values share a document position (the order Inductor's JSON document
is written back in). ``copy`` keeps the positions; ``merge`` shifts the positions of the rows
it adds past DST's last one, so DST's documents keep their order and SRC's entries follow.

``copy`` needs an empty or absent DST (created at the code's head revision). While it runs,
DST holds a marker table (:data:`MARKER_TABLE`, naming SRC) so that a re-run recognises an
interrupted copy of the same SRC and continues; the marker is dropped when the copy completes.
``merge`` unions into any DST (created if absent) and is idempotent: merging twice adds nothing.

Sources are never modified: an SQLite SRC is opened read-only (``mode=ro``), PostgreSQL in a
``READ ONLY`` ``REPEATABLE READ`` transaction; either way the whole run reads one snapshot.
A SRC at an older schema revision (0001, 0002) is **read as is**, not upgraded: tables it
lacks count as empty, and columns it lacks get what the migration would give them
(``guarded_entries.last_used_at`` = ``created_at``, ``signature`` = NULL). An SQLite SRC is
checked with ``PRAGMA quick_check`` before anything is written; a damaged one is refused
(:class:`DamagedSourceError`, pointing at ``cachedb recover``).

With ``require_signed``, every SRC is checked before anything is written; otherwise
:class:`UnsignedInputError`. Under public keys (``trusted``, default ``CACHEDB_TRUSTED_KEYS``)
every row that carries code or steers code generation (:data:`cachedb.fleet.trust.SIGNED_TABLES`:
FX graph / AOTAutograd entries, kernel files, best configs, timings, LocalCache values, CUTLASS
op lists, Dynamo's caches) must carry an Ed25519 signature a trusted key verifies, its payload
hashing to what was signed; into an SQLite DST (a machine's file) the rows' signers are
recorded (``row_origins``), so removing a key later removes them there. Under the team's HMAC
key (``CACHEDB_HMAC_KEY``) every FX graph / AOTAutograd entry, best config and row of Dynamo's
caches must verify.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Literal, cast

from sqlalchemy import Connection, insert
from sqlalchemy.exc import SQLAlchemyError

from ..store.engine import WRITE_OPTION, sqlite_path, to_url
from .._errors import CopyError, DatabaseOpenError
from ..store.signing import Signer, TrustedKeys
from ..db import CacheDB

# The work is done in private modules, one per concern (errors, tables, report, source, target,
# transfer); the names other code imports from this module are re-exported here (``_prefetched``,
# the sources' read-ahead, for its tests).
from ._copy_errors import DamagedSourceError, TargetNotEmptyError, UnsignedInputError
from ._copy_report import COLUMNS, CopyProgress, CopyReport, ProgressCallback, TableCopy
from ._copy_source import _check_signed, _open_sources, _prefetched
from ._copy_tables import MARKER_TABLE, TABLES, _MARKER
from ._copy_target import _dry_run_target, _target_state
from ._copy_transfer import _Transfer
from .trust import TrustPolicy, TrustRefusedError, check_source, record_origin_keys

#: Default batch bounds: rows, and bytes of row values (payloads included).
DEFAULT_BATCH_ROWS = 20000
DEFAULT_BATCH_BYTES = 16 << 20

_UTC = dt.timezone.utc


def _where(location: CacheDB | str | os.PathLike[str]) -> str:
    if isinstance(location, CacheDB):
        return location.where
    try:
        url = to_url(location)
    except (ValueError, SQLAlchemyError) as exc:
        raise DatabaseOpenError(f"{location}: not a usable database location or URL: {exc}") from exc
    path = sqlite_path(url)
    return str(path) if path is not None else url.render_as_string(hide_password=True)


def _run(
    mode: Literal["copy", "merge"],
    sources: Sequence[CacheDB | str | os.PathLike[str]],
    target: CacheDB | str | os.PathLike[str],
    *,
    progress: ProgressCallback | None,
    require_signed: bool,
    signer: Signer | None,
    batch_rows: int,
    batch_bytes: int,
    timeout_s: float,
    repack: bool = False,
    dry_run: bool = False,
    trusted: TrustedKeys | None = None,
) -> CopyReport:
    started = time.monotonic()
    if batch_rows < 1 or batch_bytes < 1:
        raise ValueError("batch_rows and batch_bytes must be positive")
    if not sources:
        raise CopyError("no source database given")
    target_where = _where(target)
    for location in sources:
        if _where(location) == target_where:
            raise CopyError(f"{target_where}: source and target are the same database")
    policy: TrustPolicy | None = None
    if require_signed:
        signer = signer if signer is not None else Signer.from_environment()
        keys = trusted if trusted is not None else TrustedKeys.from_environment()
        policy = TrustPolicy(trusted=keys) if keys else None
        if signer is None and policy is None:
            raise CopyError("--require-signed needs the writers' public keys in CACHEDB_TRUSTED_KEYS (or the "
                            "team's key in CACHEDB_HMAC_KEY); nothing was written")
    srcs = _open_sources(sources, timeout_s, target_where)
    report = CopyReport(mode, [s.where for s in srcs], target_where,
                        source_revisions={s.where: s.revision for s in srcs}, dry_run=dry_run)
    dst: CacheDB | None = None
    scratch: tempfile.TemporaryDirectory[str] | None = None
    try:
        # Every refusal comes before DST is opened or created: nothing is written then.
        for s in srcs:
            s.check_integrity(target_where)
        totals = [0, 0]
        origins: list[tuple[str, str, str]] = []
        for s in srcs:
            with s.snapshot(target_where) as conn:
                if require_signed and signer is not None:
                    _check_signed(s, conn, signer, target_where)
                if policy is not None:
                    try:
                        origins += check_source(conn, policy, s.where)
                    except TrustRefusedError as exc:
                        raise UnsignedInputError(f"{exc}; --require-signed refuses it, nothing was written to "
                                                 f"{target_where}") from exc
                for table in TABLES:
                    rows, nbytes = s.count(conn, table)
                    totals[0] += rows
                    totals[1] += nbytes
        if mode == "copy":
            rows, marker = _target_state(target, timeout_s)
            if marker is not None and marker != srcs[0].where:
                raise TargetNotEmptyError(
                    f"{target_where}: holds an unfinished copy of {marker}; re-run that copy to finish it, "
                    f"or remove {target_where}")
            if rows and marker is None:
                raise TargetNotEmptyError(
                    f"{target_where}: not empty ({rows} rows); `cachedb copy` needs an empty or absent target "
                    f"(`cachedb merge SRC --into {target_where}` unions into it)")
            report.resumed = marker is not None
        if dry_run:
            dst, scratch = _dry_run_target(mode, target, target_where, timeout_s)
        else:
            dst = target if isinstance(target, CacheDB) else CacheDB(target, busy_timeout_s=timeout_s)
        if mode == "copy" and not report.resumed and not dry_run:
            with dst.write() as repos:
                conn = cast(Connection, repos.session)
                _MARKER.create(conn, checkfirst=True)
                conn.execute(insert(_MARKER), {"source": srcs[0].where, "started_at": dt.datetime.now(_UTC)})
        done = [0, 0]
        # A dry run: the same transfer, every batch in one DST transaction that is rolled back.
        shared = dst.engine.connect().execution_options(**{WRITE_OPTION: True}) if dry_run else None
        try:
            if shared is not None:
                shared.begin()
            for s in srcs:
                with s.snapshot(target_where) as conn:
                    _Transfer(s, conn, dst, report, mode=mode, progress=progress, done=done,
                              totals=(totals[0], totals[1]), batch_rows=batch_rows, batch_bytes=batch_bytes,
                              fresh=mode == "copy" and not report.resumed, repack=repack, shared=shared).run()
        finally:
            if shared is not None:
                shared.rollback()
                shared.close()
        if origins and not dry_run and dst.engine.dialect.name == "sqlite":  # a machine's file: where rows came from
            with dst.write() as repos:
                record_origin_keys(cast(Connection, repos.session), origins)
        if mode == "copy" and not dry_run:
            with dst.write() as repos:
                _MARKER.drop(cast(Connection, repos.session), checkfirst=True)
        if dst.engine.dialect.name == "sqlite" and not dry_run:  # the batches left the WAL to this one checkpoint
            with dst.engine.connect() as conn:
                conn.connection.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        for s in srcs:
            s.close()
        if dst is not None and dst is not target:
            dst.close()
        if scratch is not None:
            scratch.cleanup()
    report.seconds = time.monotonic() - started
    return report


def copy_database(
    source: CacheDB | str | os.PathLike[str],
    target: CacheDB | str | os.PathLike[str],
    *,
    progress: ProgressCallback | None = None,
    require_signed: bool = False,
    signer: Signer | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    timeout_s: float = 30.0,
    repack: bool = False,
    dry_run: bool = False,
    trusted: TrustedKeys | None = None,
) -> CopyReport:
    """Copy every row of ``source`` into ``target`` (empty or absent; created at the code's
    head revision), resumably. See the module docstring for what is copied and how.

    ``source``/``target``: a :class:`CacheDB` (used as opened; a source ``CacheDB`` has been
    upgraded by its own open) or a location (file path or SQLAlchemy URL; a source location is
    opened read-only and never upgraded or created). ``progress`` is called after each
    committed batch; an exception it raises stops the copy, committed batches stay, and a
    re-run continues. ``batch_rows`` (rows) and ``batch_bytes`` (bytes of row values) bound a
    batch, one DST transaction each; ``timeout_s``: seconds to wait on a locked database.
    ``signer`` (default: ``CACHEDB_HMAC_KEY``) and ``trusted`` (default: the public keys of
    ``CACHEDB_TRUSTED_KEYS``) are what ``require_signed`` checks against (either or both).
    ``repack``: FX graph / AOTAutograd payloads re-encoded as this version writes them to
    ``target`` also when both are SQLite (or both PostgreSQL), as they always are between the
    two (see the module docstring; a database written before small entries were stored as they
    are reads them ~12x faster after, at the bytes their files take: ~5 against 64 µs for
    100 KB; one written before payload format 3 reads them ~2x faster, 5 against 10.6 µs).

    ``dry_run``: the same run, every check included, with every batch written in one ``target``
    transaction that is then rolled back (into an absent or empty ``target``: an empty scratch
    SQLite database in a temporary directory), so the report counts what the run would write
    and ``target`` is left as it was, neither created nor upgraded (on PostgreSQL, id
    sequences advance as in any rolled-back insert).

    Returns a :class:`CopyReport` (rows and bytes per table, seconds, entries re-encoded).

    Raises:
        CopyError: no source database, source and target the same, or the target not a usable
            location.
        TargetNotEmptyError: ``target`` holds rows and no unfinished copy of ``source``.
        DamagedSourceError: an SQLite ``source`` fails ``PRAGMA quick_check`` (nothing written).
        UnsignedInputError: ``require_signed`` and unsigned or foreign-signed entries (nothing
            written).
        SchemaTooNewError: ``source`` is at a revision newer than this code.
        DatabaseOpenError: either database cannot be opened.
        sqlalchemy.exc.SQLAlchemyError: a write to ``target`` failed (that batch rolled back).
    """
    return _run("copy", [source], target, progress=progress, require_signed=require_signed, signer=signer,
                batch_rows=batch_rows, batch_bytes=batch_bytes, timeout_s=timeout_s, repack=repack, dry_run=dry_run,
                trusted=trusted)


def merge_databases(
    sources: Sequence[CacheDB | str | os.PathLike[str]],
    target: CacheDB | str | os.PathLike[str],
    *,
    progress: ProgressCallback | None = None,
    require_signed: bool = False,
    signer: Signer | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    timeout_s: float = 30.0,
    repack: bool = False,
    dry_run: bool = False,
    trusted: TrustedKeys | None = None,
) -> CopyReport:
    """Union every row of each of ``sources`` (in order) into ``target`` (created if absent):
    natural keys deduplicate, timings keep every benchmark of both, best configs and
    LocalCache values keep the newer row (module docstring). Idempotent. Arguments, return
    value and errors as :func:`copy_database` (no :class:`TargetNotEmptyError`); with
    ``require_signed`` every source is checked before anything is written; ``dry_run`` as
    there."""
    return _run("merge", list(sources), target, progress=progress, require_signed=require_signed, signer=signer,
                batch_rows=batch_rows, batch_bytes=batch_bytes, timeout_s=timeout_s, repack=repack, dry_run=dry_run,
                trusted=trusted)


__all__ = [
    "COLUMNS",
    "CopyProgress",
    "CopyReport",
    "DamagedSourceError",
    "MARKER_TABLE",
    "TABLES",
    "TableCopy",
    "TargetNotEmptyError",
    "UnsignedInputError",
    "copy_database",
    "merge_databases",
]
