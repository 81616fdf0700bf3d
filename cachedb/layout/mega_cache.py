"""Mega-Cache interop: the blob ``torch.compiler.save_cache_artifacts()`` returns, to and from
the database.

Format (formats doc §4; torch/utils/_appending_byte_serializer.py, torch/compiler/_cache.py):
``crc32 (4 bytes, big endian) ‖ u64 version=1 ‖ repeat{ str(type) ‖ u64 n ‖ n × (str(key) ‖
bytes(content)) }``. cachedb never re-implements it: it writes with torch's
``AppendingByteSerializer`` + ``_serialize_single_cache`` and artifacts made by
``CacheArtifactFactory`` (the classes torch registers: ``InductorCacheArtifact``,
``AOTAutogradCacheArtifact``, ``AutotuneCacheArtifact``, ...), and reads with torch's
``BytesReader`` and ``CacheArtifact.deserialize``.

==================  =======================================  ==================================
Mega-Cache type     key, content                             cachedb
==================  =======================================  ==================================
``inductor``        FX graph key, pickled ``CompiledFxGraph``  ``guarded_entries`` kind fxgraph
``aot_autograd``    AOTAutograd key, pickled entry           ``guarded_entries`` kind aotautograd
``autotune``        ``"<k[1:3]>/<name>.best_config"``, JSON   ``best_configs``
``pgo``             PGO cache key, pickled code state        ``pgo_profiles`` (key: its file
                                                             name's, :func:`~cachedb.repositories.
                                                             dynamo.pgo_key`)
``precompile``      source id, pickled Dynamo package         ``dynamo_packages``
others                                                       counted and skipped (not stored)
==================  =======================================  ==================================

Reading differs from ``CacheArtifactManager.deserialize`` in three ways, all on purpose:

- every chunk is kept. torch builds ``dict(to_list(...))``, so a blob with two chunks of one
  type (what a second ``save_cache_artifacts()`` in the same process returns: the serializer
  appends) keeps only the last chunk, and ``load_cache_artifacts`` silently drops the rest;
- lengths are checked against the data (torch's ``BytesReader`` slices past the end and reads
  zeros, which on a crafted blob with a valid checksum loops without end);
- an artifact type torch does not register is skipped with a note instead of failing the blob.

Pickles are never executed: ``guards_expr`` and the compile time of FX / AOTAutograd entries are
read from the opcode stream (:func:`cachedb.formats.pickle_scan.read_entry_fields`); Dynamo's
pickles (PGO profiles, precompiled packages) are stored as they are. Two ``pgo`` artifacts of one key (a blob saved
after the profile changed holds both): the later one in the blob wins, as torch's
``load_cache_artifacts`` writes one after the other.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._errors import input_error_reason, BadInputError, CacheDBError, TorchUnavailableError
from ..db import CacheDB, Repos
from ..fingerprint import Fingerprint
from ..repositories.dynamo import FILE_KINDS as DYNAMO_FILE_KINDS
from ..keys.dynamo_package import package_source_id
from ..repositories.dynamo import newest_per_file, pgo_key
from .importer import Problem

__all__ = [
    "ArtifactExport",
    "ArtifactImportReport",
    "KIND_OF_TYPE",
    "build_artifacts",
    "export_artifacts",
    "import_artifacts",
    "read_artifacts",
]

#: Mega-Cache artifact type -> cachedb kind, for the types cachedb stores.
KIND_OF_TYPE = {"inductor": "fxgraph", "aot_autograd": "aotautograd", "autotune": "best_config", "pgo": "pgo_profile",
                "precompile": "dynamo_package"}
#: The order types are written in (torch writes them in the order of first record).
_EXPORT_ORDER = ("inductor", "aot_autograd", "autotune", "pgo", "precompile")

#: FX / AOTAutograd keys: ``"f"``/``"a"`` + a hash; one path component when exported.
_GUARDED_KEY = {"inductor": re.compile(r"f[A-Za-z0-9_\-]+"), "aot_autograd": re.compile(r"a[A-Za-z0-9_\-]+")}
#: ``AutotuneCache._artifact_key_from_local_cache_key``: the last two parts of the local path.
_BEST_CONFIG_KEY = re.compile(r"(?!\.\.?/)[^/\\]+/[^/\\]+\.best_config")


@dataclass
class ArtifactImportReport:
    """What :func:`import_artifacts` did.

    ``artifacts[type]`` counts the artifacts of each Mega-Cache type in the blob;
    ``added[kind]`` / ``unchanged[kind]`` the stored ones per cachedb kind (``fxgraph``,
    ``aotautograd``, ``best_config``, ``pgo_profile``, ``dynamo_package``); ``skipped[type]`` the artifacts of types
    cachedb does not store (unknown ones). ``problems``: artifacts that were not stored
    (bad pickle, bad key, ...), the rest was; ``notes``: what was skipped and why.
    """

    artifacts: Counter[str] = field(default_factory=Counter)
    added: Counter[str] = field(default_factory=Counter)
    unchanged: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    bytes_read: int = 0


@dataclass
class ArtifactExport:
    """A Mega-Cache blob built by :func:`build_artifacts`: ``data`` (the bytes
    ``torch.compiler.load_cache_artifacts`` takes), ``counts[type]`` artifacts per Mega-Cache
    type, and the stored entries that were left out (with why)."""

    data: bytes
    counts: Counter[str] = field(default_factory=Counter)
    left_out: list[Problem] = field(default_factory=list)


def _torch_cache() -> tuple[Any, Any]:
    """``(torch.compiler._cache, torch.utils._appending_byte_serializer)`` with every artifact
    type registered (``CacheArtifactManager._ensure_cache_artifacts_registered``)."""
    try:
        import torch  # noqa: F401
        from torch.compiler import _cache as cache_mod
        from torch.utils import _appending_byte_serializer as abs_mod
    except ImportError as exc:
        raise TorchUnavailableError(f"Mega-Cache artifacts need torch: {exc}") from exc
    cache_mod.CacheArtifactManager._ensure_cache_artifacts_registered()
    return cache_mod, abs_mod


# --------------------------------------------------------------------------- export


def build_artifacts(db: CacheDB) -> ArtifactExport:
    """A Mega-Cache blob of every FX graph entry (type ``inductor``), AOTAutograd entry
    (``aot_autograd``), best config (``autotune``), PGO profile (``pgo``, keyed by its file
    name's key: torch's ``populate_cache`` writes it to the same file) and precompiled Dynamo
    package (``precompile``) in ``db``.

    Every stored variant of a key becomes one artifact (torch's own blobs hold several
    artifacts per key too: ``CacheArtifactManager.record_artifact`` dedups on key *and*
    content); ``populate_cache`` writes each to its own ``sha256_hash`` file. Best configs whose
    key is not ``"<k[1:3]>/<name>.best_config"`` (an absolute path: a kernel outside the cache
    dir) cannot be placed by ``AutotuneCacheArtifact.populate_cache`` and are left out.

    Built with torch's ``CacheArtifactFactory.create`` and ``AppendingByteSerializer`` /
    ``_serialize_single_cache`` (torch/compiler/_cache.py), as ``CacheArtifactManager.serialize``
    does. Raises :class:`~cachedb.TorchUnavailableError` without torch and
    :class:`~cachedb.CorruptPayloadError` for a stored payload failing its checksum.
    """
    cache_mod, abs_mod = _torch_cache()
    create = cache_mod.CacheArtifactFactory.create
    chunks: dict[str, list[Any]] = {t: [] for t in _EXPORT_ORDER}
    left_out: list[Problem] = []
    with db.read() as repos:
        for entry in repos.guarded.iter_all("fxgraph"):
            chunks["inductor"].append(create("inductor", entry.key, entry.payload))
        for entry in repos.guarded.iter_all("aotautograd"):
            chunks["aot_autograd"].append(create("aot_autograd", entry.key, entry.payload))
        for key, content in repos.best_configs.iter_all():
            if not _BEST_CONFIG_KEY.fullmatch(key):
                left_out.append(Problem(key, "best config key is not '<k[1:3]>/<name>.best_config'"))
                continue
            chunks["autotune"].append(create("autotune", key, content.encode("utf-8")))
        for kind in DYNAMO_FILE_KINDS:  # Dynamo's caches, keyed as their files are named
            for key, content, _ in newest_per_file(kind, repos.dynamo(kind).iter_all()):
                chunks[kind].append(create(kind, key if kind == "pgo" else package_source_id(key), content))
    items = [(t, arts) for t, arts in chunks.items() if arts]
    serializer = abs_mod.AppendingByteSerializer(serialize_fn=cache_mod._serialize_single_cache)
    serializer.extend(items)
    return ArtifactExport(
        data=serializer.to_bytes(),
        counts=Counter({t: len(arts) for t, arts in items}),
        left_out=left_out,
    )


def export_artifacts(db: CacheDB) -> bytes:
    """The Mega-Cache blob of ``db`` (:func:`build_artifacts`): the bytes
    ``torch.compiler.save_cache_artifacts()[0]`` would be for those entries, ready for
    ``torch.compiler.load_cache_artifacts``."""
    return build_artifacts(db).data


# --------------------------------------------------------------------------- import


class _Truncated(Exception):
    pass


def _checked_reader(abs_mod: Any, data: bytes) -> Any:
    """torch's ``BytesReader`` (checksum checked on construction) with every read bounded by
    the data: a length past the end raises instead of reading zeros."""

    class CheckedBytesReader(abs_mod.BytesReader):  # type: ignore[misc, name-defined]
        def _need(self, n: int) -> None:
            if n > len(self._data) - self._i:
                raise _Truncated(
                    f"truncated: {n} bytes needed at offset {self._i}, "
                    f"{len(self._data) - self._i} left"
                )

        def read_uint64(self) -> int:
            self._need(8)
            return int(super().read_uint64())

        def read_bytes(self) -> bytes:
            start = self._i
            size = self.read_uint64()
            self._need(size)
            self._i = start
            return bytes(super().read_bytes())

    return CheckedBytesReader(data)


@dataclass(frozen=True)
class _Raw:
    """An artifact of a type torch does not register: only its type and key are kept."""

    type_: str
    key: str
    size: int


def read_artifacts(data: bytes, *, where: str = "<blob>") -> list[tuple[str, list[Any]]]:
    """Deserialize a Mega-Cache blob into ``[(type, [artifact, ...]), ...]`` chunks, in blob
    order (a type may occur in several chunks). Artifacts of registered types are torch's
    ``CacheArtifact`` objects (``CacheArtifact.deserialize``); others are kept as type, key and
    size only.

    Mirrors ``AppendingByteSerializer.to_list`` with ``_deserialize_single_cache``
    (torch/utils/_appending_byte_serializer.py, torch/compiler/_cache.py), with bounded reads.
    Raises :class:`~cachedb.BadInputError` (``where``, reason) for a bad checksum, an unknown
    encoding version, a truncated or malformed blob; :class:`~cachedb.TorchUnavailableError`
    without torch.
    """
    cache_mod, abs_mod = _torch_cache()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadInputError(where, f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    try:
        reader = _checked_reader(abs_mod, data)
    except (AssertionError, RuntimeError) as exc:  # too short / checksum mismatch
        raise BadInputError(where, f"not a Mega-Cache blob: {exc}") from None
    registered = cache_mod.CacheArtifactFactory._artifact_types
    chunks: list[tuple[str, list[Any]]] = []
    try:
        version = reader.read_uint64()
        if version != abs_mod._ENCODING_VERSION:
            raise BadInputError(
                where, f"encoding version {version}, expected {abs_mod._ENCODING_VERSION} "
                "(torch/utils/_appending_byte_serializer.py)"
            )
        while not reader.is_finished():
            type_ = reader.read_str()
            count = reader.read_uint64()
            artifacts: list[Any] = []
            for _ in range(count):  # each artifact takes >= 16 bytes: bounded by the data
                if type_ in registered:
                    artifacts.append(cache_mod.CacheArtifact.deserialize(type_, reader))
                else:
                    key = reader.read_str()
                    artifacts.append(_Raw(type_, key, len(reader.read_bytes())))
            chunks.append((type_, artifacts))
    except _Truncated as exc:
        raise BadInputError(where, f"malformed Mega-Cache blob: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:  # base64 / UTF-8 of a type or key
        raise BadInputError(where, f"malformed Mega-Cache blob: bad string ({exc})") from None
    return chunks


def _store_one(repos: Repos, type_: str, key: str, content: bytes, fp_id: int | None, report: ArtifactImportReport) -> None:
    where = f"{type_}:{key}"
    kind = KIND_OF_TYPE[type_]
    if type_ == "autotune":
        if not _BEST_CONFIG_KEY.fullmatch(key):
            raise BadInputError(where, "key is not '<k[1:3]>/<name>.best_config'")
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInputError(where, f"not UTF-8 text: {exc}") from None
        added = repos.best_configs.put(key, text, fingerprint_id=fp_id)
    elif type_ in DYNAMO_FILE_KINDS:
        stored = pgo_key(key) if type_ == "pgo" else key
        added = repos.dynamo(type_).put(stored, content, fingerprint_id=fp_id)
    else:
        if not _GUARDED_KEY[type_].fullmatch(key):
            raise BadInputError(where, f"unexpected key: expected {_GUARDED_KEY[type_].pattern}")
        _, added = repos.guarded.put_pickled(kind, key, content, fingerprint_id=fp_id, where=where)
    (report.added if added else report.unchanged)[kind] += 1


def import_artifacts(
    db: CacheDB,
    data: bytes,
    *,
    where: str = "<blob>",
    fingerprint: Fingerprint | None = None,
) -> ArtifactImportReport:
    """Store the FX graph, AOTAutograd, best-config, PGO and precompile artifacts of a Mega-Cache
    blob in ``db`` (one transaction). Re-importing is idempotent. Artifacts of other types (unregistered
    ones) are counted in ``skipped`` with a note; an artifact that
    cannot be stored (a bad pickle, a key that is not a cache key) is listed in ``problems``
    and the others are stored. ``fingerprint``, when given, is attributed to every entry.

    Raises :class:`~cachedb.BadInputError` naming ``where`` when the blob itself is bad
    (:func:`read_artifacts`), :class:`~cachedb.TorchUnavailableError` without torch.
    """
    chunks = read_artifacts(data, where=where)
    report = ArtifactImportReport(bytes_read=len(data))
    skipped_types: Counter[str] = Counter()
    with db.transaction() as repos:
        fp_id = repos.fingerprints.ensure(fingerprint) if fingerprint is not None else None
        for type_, artifacts in chunks:
            report.artifacts[type_] += len(artifacts)
            if type_ not in KIND_OF_TYPE:
                report.skipped[type_] += len(artifacts)
                skipped_types[type_] += len(artifacts)
                continue
            for artifact in artifacts:
                key, content = artifact.key, bytes(artifact.content)
                try:
                    with repos.savepoint():
                        _store_one(repos, type_, key, content, fp_id, report)
                except Exception as exc:  # noqa: BLE001 - bad input fails in many ways
                    reason = input_error_reason(exc)
                    if reason is None:
                        raise
                    report.problems.append(Problem(f"{type_}:{key}", reason))

    for type_, n in skipped_types.items():
        report.notes.append(
            Problem(type_, f"{n} artifact(s) of Mega-Cache type {type_!r} skipped: cachedb stores "
                    f"only {', '.join(KIND_OF_TYPE)} artifacts")
        )
    return report


def read_blob_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a Mega-Cache file; :class:`~cachedb.BadInputError` if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
