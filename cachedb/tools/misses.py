"""Recent misses explained (``cachedb misses``): for each lookup in the miss log, the stored
entry nearest to the key wanted and the factors that differ between them, in words; the
entries those of the same database, or of another (``--remote URL``: the shared tier)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import select

from ..keys.factors import (
    BEST_CONFIG,
    CPP_HOST,
    PACKAGE_SYSTEM,
    choice_factor,
    cpp_library_factors,
    differences,
    equal_count,
    configs_hash_factor,
    package_factors,
    system_words,
    timing_factors,
    timing_key,
)
from ..repositories.artifacts import KernelArtifactRepository
from ..repositories.factors import KeyFactorRepository, MissLogRepository
from ..repositories.timings import lookup_groups
from ..keys.dynamo_package import SEPARATOR
from ..store.tables import best_configs as _BC
from ..store.tables import dynamo_packages as _P
from ..store.tables import guarded_entries as _G

COLUMNS = ("missed_at", "kind", "key", "outcome", "nearest", "differs")
#: The miss log's kind of an autotune timings lookup (``PersistentCache.lookup``).
TIMINGS = "timings"
#: The miss log's kind of a C++ kernel library lookup (``CppCodeCache.load_async``).
CPP = "cpp"
#: The miss log's kind of a precompiled Dynamo package lookup (``DiskDynamoCache.load``).
PRECOMPILE = "precompile"


def _naive(when: Any) -> Any:
    """A timestamp without its zone (SQLite gives them back naive, PostgreSQL aware; both UTC)."""
    return when.replace(tzinfo=None) if isinstance(when, dt.datetime) else when


def explain(session: Any, *, limit: int = 20, kind: str | None = None, against: Any = None) -> list[dict[str, Any]]:
    """The newest ``limit`` misses of the database of ``session`` (of ``kind``, or of every
    kind), newest first, explained against the entries of ``against`` (a session or connection
    of another database, e.g. the shared tier; default: ``session``'s own). Each is a
    dict: ``kind``, ``key`` (torch's key wanted; empty for a bypass), ``outcome``
    (``no_entry``, ``guards_failed``, ``bypass``), ``reason`` (a bypass's), ``missed_at``,
    ``nearest`` (of the keys of that kind stored before the miss, the one whose factors most
    often equal the wanted ones; ``None`` when no stored entry has factors), ``differs`` (a
    list of ``{factor, stored, wanted}``: the factors whose hashes differ, or that one side
    lacks, ``None`` for that side) and, for ``guards_failed``, ``guards`` (the guard
    expressions of the variants stored before the miss, which all failed: torch's
    ``guards_expr``, e.g. ``6 <= L['t0']``).

    For ``guards_failed`` the nearest entry is the key itself (against another database: where
    it holds variants of the key stored before the miss; otherwise the nearest by factors, as
    for ``no_entry``). Against its own database a miss's own key is never the nearest of a
    ``no_entry`` miss (its variant is the one compiled after it); against another it is
    where that database held the key before the miss, with no factor differing.

    Autotune timings misses (kind ``timings``: ``PersistentCache.lookup`` benchmarked; outcome
    ``no_entry``, or ``new_choices`` where the lookup's op, inputs and precision had timings
    but not of every choice) are explained against the stored timings lookups
    (:func:`_nearest_timings`); ``key`` and ``nearest`` are
    :func:`~cachedb.keys.factors.timing_key`'s.

    C++ kernel library misses (kind ``cpp``: ``CppCodeCache.load_async`` found no library of
    that key for this host, outcome ``no_entry``) are explained against the stored libraries
    (:func:`_nearest_library`): the same library on another host, with the host factors that
    differ (compiler version, CPU flags, ...), else the nearest other library. Precompiled
    package misses (kind ``precompile``: ``DiskDynamoCache.load`` found no package of the
    function for this system) likewise: the function's package of another system first, with
    the ``SystemInfo`` fields that differ (``system.python_version``, ...). Best config misses
    (kind ``best_config``: ``AutotuneCache.read_best`` gave nothing, the kernel is tuned again)
    are ``no_entry`` (explained by :func:`_nearest_best_config`) or ``configs_changed`` (the key
    stored for other candidate configs: ``configs_hash`` differs)."""
    misses = MissLogRepository(session).recent(limit, kind)
    entries = session if against is None else against
    factors = KeyFactorRepository(entries)
    stored_by_kind: dict[str, dict[str, tuple[Any, dict[str, tuple[str, str]]]]] = {}
    timing_groups: list[tuple[dict[str, Any], str, dict[str, tuple[str, str]]]] | None = None
    cpp_stored: list[tuple[str, str, Any, dict[str, tuple[str, str]]]] | None = None
    packages: list[tuple[str, str, Any, dict[str, tuple[str, str]]]] | None = None
    best_configs: list[tuple[str, Any, dict[str, tuple[str, str]]]] | None = None
    out = []
    for miss in misses:
        row: dict[str, Any] = {"missed_at": miss["missed_at"], "kind": miss["kind"], "key": miss["key"],
                               "outcome": miss["outcome"], "reason": miss["reason"], "nearest": None, "differs": []}
        wanted = miss["factors"]
        if miss["outcome"] == "guards_failed":
            before = [g for g, at in entries.execute(select(_G.c.guards_expr, _G.c.created_at).where(
                _G.c.kind == miss["kind"], _G.c.key == miss["key"]).order_by(_G.c.created_at))
                if _naive(at) <= _naive(miss["missed_at"])]
            row["guards"] = [g for g in before if g]
            if against is None or before:
                row["nearest"] = miss["key"]
                out.append(row)
                continue
        if wanted and miss["kind"] == TIMINGS:
            if timing_groups is None:  # each stored lookup's key and factors but its choices, once
                timing_groups = [(g, timing_key(g["system_hash"], g["op"], g["inputs"], g["hint_override"],
                                                g["precision"]),
                                  {f.factor: (f.hash, f.value) for f in timing_factors(
                                      g["system_hash"], system_words(g["system_hash"], g["device_name"],
                                                                     g["cuda_version"], g["hip_version"]),
                                      g["op"], g["inputs"], g["hint_override"], g["precision"])})
                                 for g in lookup_groups(entries)]
            _nearest_timings(row, wanted, miss["missed_at"], timing_groups)
        elif wanted and miss["kind"] == CPP:
            if cpp_stored is None:  # each stored library's key and host, with the host's factors
                hosts = factors.of_kind(CPP_HOST)
                cpp_stored = [(key, host, at, {
                    **{f.factor: (f.hash, f.value) for f in cpp_library_factors(key, host, None)},
                    **hosts.get(host, {})}) for key, host, at in KernelArtifactRepository(entries).stored_keys(CPP)]
            _nearest_library(row, wanted, miss["key"], miss["missed_at"], cpp_stored, own=against is None)
        elif miss["kind"] == BEST_CONFIG and miss["outcome"] == "configs_changed" and (
                against is None or entries.execute(select(_BC.c.id).where(_BC.c.key == miss["key"])).first()):
            _configs_changed(row, wanted, miss["reason"])
        elif wanted and miss["kind"] == BEST_CONFIG:
            if best_configs is None:  # each stored best config's factors and configs_hash
                kept = factors.of_kind(BEST_CONFIG)
                best_configs = []
                for key, ch, at in entries.execute(select(_BC.c.key, _BC.c.configs_hash, _BC.c.created_at)):
                    if key in kept:
                        f = configs_hash_factor(ch) if ch else None
                        best_configs.append((key, at, {**kept[key], **({f.factor: (f.hash, f.value)} if f else {})}))
            _nearest_best_config(row, wanted, miss["missed_at"], best_configs)
        elif wanted and miss["kind"] == PRECOMPILE:
            if packages is None:  # each stored package's source id and system, with the system's factors
                systems = factors.of_kind(PACKAGE_SYSTEM)
                packages = []
                for key, at in entries.execute(select(_P.c.key, _P.c.created_at)):
                    source, _, tag = key.partition(SEPARATOR)
                    mine = package_factors(source, tag, None)  # source_id, then system (where tagged)
                    theirs = {f.factor: (f.hash, f.value) for f in (mine if tag else mine[:1])}
                    packages.append((source, tag, at, {**theirs, **systems.get(tag, {})}))
            _nearest_library(row, wanted, miss["key"].partition(SEPARATOR)[0], miss["missed_at"], packages,
                             own=against is None, host="system")
        elif wanted:
            stored = stored_by_kind.get(miss["kind"])
            if stored is None:
                stored = stored_by_kind[miss["kind"]] = factors.all_of_kind(miss["kind"])
            best, best_score = None, -1
            for key, (at, theirs) in stored.items():
                if (key == miss["key"] and against is None) or _naive(at) > _naive(miss["missed_at"]):
                    continue  # its own entry, or one stored after this miss
                score = equal_count(theirs, wanted)
                if score > best_score or score == best_score and best is not None and key < best:
                    best, best_score = key, score
            if best is not None:
                row["nearest"] = best
                row["differs"] = [{"factor": d.factor, "stored": d.stored, "wanted": d.wanted}
                                  for d in differences(stored[best][1], wanted)]
        out.append(row)
    return out


def _nearest_timings(row: dict[str, Any], wanted: dict[str, tuple[str, str]], missed_at: Any,
                     groups: list[tuple[dict[str, Any], str, dict[str, tuple[str, str]]]]) -> None:
    """A timings miss (kind :data:`TIMINGS`): the nearest stored lookup (``groups``: each
    :func:`~cachedb.repositories.timings.lookup_groups` row with its key and its factors but
    the choices) is the one whose factors, with its choices timed before the miss, most often
    equal the wanted ones; the factors that differ, less the stored choices the lookup did not
    ask for (torch needs only those it asks for). Fills ``row["nearest"]`` and ``row["differs"]``."""
    best: tuple[int, str, dict[str, tuple[str, str]]] | None = None
    for g, key, base in groups:
        choices = [choice_factor(h, name) for h, name, at in g["choices"] if _naive(at) <= _naive(missed_at)]
        if not choices:
            continue  # timed after this miss
        theirs = {**base, **{f.factor: (f.hash, f.value) for f in choices}}
        score = equal_count(theirs, wanted)
        if best is None or score > best[0] or score == best[0] and key < best[1]:
            best = (score, key, theirs)
    if best is not None:
        row["nearest"] = best[1]
        row["differs"] = [{"factor": d.factor, "stored": d.stored, "wanted": d.wanted}
                          for d in differences(best[2], wanted)
                          if not (d.wanted is None and d.factor.startswith("choice["))]


def _configs_changed(row: dict[str, Any], wanted: dict[str, tuple[str, str]], reason: str) -> None:
    """A best config stored for the key, for other candidate configs: the key itself is the
    nearest, and ``configs_hash`` differs (the stored one's hash as the miss saw it, in
    ``reason``: the retune that follows replaces the stored config)."""
    row["nearest"] = row["key"]
    stored = reason.rpartition(" ")[2] if reason.startswith("stored for configs_hash ") else None
    row["differs"] = [{"factor": "configs_hash", "stored": stored,
                       "wanted": wanted.get("configs_hash", (None, None))[1]}]


def _nearest_best_config(row: dict[str, Any], wanted: dict[str, tuple[str, str]], missed_at: Any,
                         stored: list[tuple[str, Any, dict[str, tuple[str, str]]]]) -> None:
    """A best config miss with no best config of its key (``no_entry``): the nearest stored
    before it is one of the same kernel where there is one (another ``torch_key`` or
    ``cache_key_tag``), else the one whose factors most often equal the wanted ones (``stored``:
    those with factors; one imported from files has none and is never the nearest)."""
    kernel = wanted.get("kernel", ("", ""))[0]
    best: tuple[bool, int, str, dict[str, tuple[str, str]]] | None = None
    for key, at, theirs in stored:
        if _naive(at) > _naive(missed_at):
            continue  # stored after this miss (its own key's, tuned for it, included)
        cand = (theirs.get("kernel", ("", ""))[0] == kernel, equal_count(theirs, wanted), key, theirs)
        if best is None or cand[:2] > best[:2] or cand[:2] == best[:2] and key < best[2]:
            best = cand
    if best is not None:
        row["nearest"] = best[2]
        row["differs"] = [{"factor": d.factor, "stored": d.stored, "wanted": d.wanted}
                          for d in differences(best[3], wanted)]


def _nearest_library(row: dict[str, Any], wanted: dict[str, tuple[str, str]], key: str, missed_at: Any,
                     stored: list[tuple[str, str, Any, dict[str, tuple[str, str]]]], *, own: bool,
                     host: str = "host") -> None:
    """A miss of an artifact stored per host or system: a C++ kernel library (kind :data:`CPP`,
    ``host`` ``"host"``: the host key) or a precompiled package (kind :data:`PRECOMPILE`,
    ``host`` ``"system"``: the system tag). The nearest stored one (``stored``: ``(key, host,
    first stored at, factors)``, stored before the miss) is one of the same ``key`` where there
    is one (of the host whose factors most often equal this one's), else the one whose factors
    most often equal the wanted ones (another library of this host differs in ``source`` alone).
    Against the miss's own database (``own``) the one stored for the miss is never the nearest.
    A stored host whose parts that database lacks (the shared tier keeps host keys only; a
    package imported from torch's files has no system) differs in ``host`` alone. Fills
    ``row["nearest"]`` (a library: ``<key>@<host key[:12]>``; a package: its database key,
    ``<source id>.<system tag>``) and ``row["differs"]``."""
    wanted_host = wanted.get(host, ("", ""))[0]
    best: tuple[bool, int, str, str, dict[str, tuple[str, str]]] | None = None
    for k, h, at, theirs in stored:
        if _naive(at) > _naive(missed_at) or (own and k == key and h and h[:len(wanted_host)] == wanted_host):
            continue  # stored after this miss, or the one stored for it
        cand = (k == key, equal_count(theirs, wanted), k, h, theirs)
        if best is None or cand[:2] > best[:2] or cand[:2] == best[:2] and (k, h) < best[2:4]:
            best = cand
    if best is not None:
        k, h = best[2], best[3]
        row["nearest"] = (k + SEPARATOR + h if h else k) if host == "system" else f"{k}@{h[:12]}"
        row["differs"] = [{"factor": d.factor, "stored": d.stored, "wanted": d.wanted}
                          for d in differences(best[4], wanted)
                          if not (d.stored is None and d.factor.startswith(host + "."))]


def words(differs: list[dict[str, Any]], *, width: int = 60, sep: str = "; ") -> str:
    """``factor: stored -> wanted``, joined by ``sep`` (``(none)`` for a side without the
    factor; each side cut to ``width`` characters)."""
    def side(v: Any) -> str:
        text = "(none)" if v is None else str(v)
        return text if len(text) <= width else text[:width - 3] + "..."

    return sep.join(f"{d['factor']}: {side(d['stored'])} -> {side(d['wanted'])}" for d in differs)
