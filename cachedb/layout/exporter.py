"""Export a :class:`CacheDB` back to the directory layout Inductor reads.

Every file is written atomically (a dot-prefixed temporary in the same directory, then
``os.replace``), so a reader never sees half a file and an interrupted export leaves only
whole files (plus dot-temporaries that Inductor skips). The bytes written are exactly the bytes
imported: pickles and op lists are stored verbatim, best configs as their JSON text, and
``cache/<system hash>`` documents are rebuilt in their original key order.

Dynamo's caches: PGO profiles go to ``dynamo/code_state_<key>.pkl``, precompiled packages to
``dynamo/<source id>/entry``, their pickles as stored.

Kernels: Triton's key directories go to ``triton/0/<key>/`` (the key does not depend on the
device index), their group files' child paths pointing into the exported directory (so an
export to the directory that was imported gives back its bytes, and an export elsewhere is a
working cache); C++ kernel libraries go to ``<key[1:3]>/<name>``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import DatabaseError

from ..formats import local_cache_doc as doc
from .._errors import ExportError
from ..store.files import write_atomic
from ..formats.triton_layout import EXPORT_DIR, GROUP_PREFIX, relocate_group
from ..db import CacheDB
from ..repositories.dynamo import FILE_KINDS as DYNAMO_FILE_KINDS
from ..repositories.dynamo import LABELS as _DYNAMO_LABELS
from ..repositories.dynamo import file_of, newest_per_file


@dataclass
class ExportReport:
    """Files written (``written[kind]``) and already present with the same bytes."""

    written: Counter[str] = field(default_factory=Counter)
    unchanged: Counter[str] = field(default_factory=Counter)
    bytes_written: int = 0


def _write_atomic(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` via a temporary and rename. False if already identical."""
    try:
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
        write_atomic(path, data)
    except OSError as exc:
        raise ExportError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    return True


def _check_target(target: Path) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"{target}: cannot create the export directory: {exc.strerror or exc}") from exc
    if not target.is_dir():
        raise ExportError(f"{target}: not a directory")
    if not os.access(target, os.W_OK | os.X_OK):
        raise ExportError(f"{target}: the export directory is not writable")


def export_cache_dir(
    db: CacheDB, target: str | os.PathLike[str], *, prefer_host: str | None = None
) -> ExportReport:
    """See :func:`_export`. Raises :class:`~cachedb.ExportError` also when the database is
    too damaged to read (``cachedb verify`` says what)."""
    try:
        return _export(db, target, prefer_host=prefer_host)
    except (DatabaseError, UnicodeDecodeError) as exc:
        reason = str(getattr(exc, "orig", None) or exc)
        raise ExportError(f"{db.where}: cannot read the database ({reason}); run cachedb verify") from exc


def _export(db: CacheDB, target: str | os.PathLike[str], *, prefer_host: str | None = None) -> ExportReport:
    """Write every stored entry under ``target`` in Inductor's layout.

    A C++ library stored for several hosts is written once: ``prefer_host``'s
    (:func:`cachedb.fingerprint.cpp_host_key` of this machine, say) if stored, else the first.

    Raises :class:`~cachedb.ExportError` naming the path when ``target`` (or a file in it)
    cannot be written; files written before the error are whole.
    """
    root = Path(target)
    _check_target(root)
    report = ExportReport()

    resolved_root = root.resolve()

    def put(kind: str, rel: str, data: bytes) -> None:
        path = root / rel
        if rel.startswith("/") or not path.resolve().is_relative_to(resolved_root):
            raise ExportError(f"{rel}: stored key would be written outside {root}; refused")
        if _write_atomic(path, data):
            report.written[kind] += 1
            report.bytes_written += len(data)
        else:
            report.unchanged[kind] += 1

    with db.read() as repos:
        for entry in repos.guarded.iter_all():
            if entry.kind == "fxgraph":
                rel = f"fxgraph/{entry.key[1:3]}/{entry.key}/{entry.variant}"
            else:
                rel = f"aotautograd/{entry.key}/{entry.variant}"
            put(entry.kind, rel, entry.payload)

        for system_hash, system_json in repos.fingerprints.system_hashes().items():
            fp_ids = repos.fingerprints.ids_for_system_hash(system_hash)
            cache = doc.build_cache(
                repos.timings.current_leaves(fp_ids), repos.local_values.current_leaves(fp_ids)
            )
            if cache:
                text = doc.render(json.loads(system_json), cache)
                put("local_cache", f"cache/{system_hash}", text.encode("utf-8"))

        for key, content in repos.best_configs.iter_all():
            put("best_config", key, content.encode("utf-8"))

        for request_key, data in repos.cutlass.iter_all():
            put("cutlass_op_list", f"configs_{request_key}.json", data)

        for kind in DYNAMO_FILE_KINDS:
            label = _DYNAMO_LABELS[kind]
            for key, data, _ in newest_per_file(kind, repos.dynamo(kind).iter_all()):
                put(label, file_of(kind, key), data)

        triton_dir = resolved_root / EXPORT_DIR
        chosen = repos.artifacts.cpp_hosts(prefer_host)
        for f in repos.artifacts.iter_all():
            if f.kind == "triton":
                data = f.data
                if f.name.startswith(GROUP_PREFIX):
                    try:
                        data = relocate_group(data, str(triton_dir / f.key), f.key)
                    except ValueError:
                        pass  # not a group file after all: written as stored
                put("triton_kernel_file", f"{EXPORT_DIR}/{f.key}/{f.name}", data)
            elif f.kind == "cpp" and chosen.get((f.key, f.name)) == f.host_key:
                put("cpp_kernel", f"{f.key[1:3]}/{f.name}", f.data)
    return report
