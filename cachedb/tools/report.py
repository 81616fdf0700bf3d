"""``cachedb report``: the tuning history and the cache's contents, as one self-contained HTML
file (charts drawn by Plotly, whose JavaScript is inlined: the file works offline) or as rich
tables in a terminal.

What it shows, all read in one snapshot (:func:`collect`):

- **autotuning**, per op and input shape: every choice's current timing (ms) and the winner, one
  series per precision and system fingerprint (GPU or CPU, torch version), from the
  ``autotune_current``/``autotune_winners`` views; each choice labelled by its name and config
  (:func:`choice_label`: a Triton template's blocks, stages and warps), its hash in a column
  and on hover, the bare hash where no description is stored (timings imported from
  Inductor's files); the same op and shape on every series side by side
  (:meth:`ReportData.side_by_side`); the benchmarks over time (``autotune_history``) where a
  shape has several series or re-benchmarks;
- **series**: every system fingerprint with timings, its device, torch version, Triton, CUDA
  or HIP, CPU and ISA;
- **best configs** per kernel (``best_configs``): the config, how it was found, the tuning time
  (ms) and when it was first and last written;
- **cache contents** by kind and fingerprint (:func:`cachedb.tools.stats.collect`);
- **kernels** (the ``kernels`` view): key, files, bytes, stored bytes, hits;
- **hits over time**: hit counts and last use of guarded entries and kernels;
- **seconds saved over time**: the compile seconds FX graph and AOTAutograd hits saved
  (``entry_value``: compile time × hits), per kind and UTC day. The schema keeps per entry a hit
  count and the time of its last hit, not a time per hit, so each entry's seconds saved fall on
  the day of its last hit (entries never hit saved nothing and are left out): the chart shows
  when the saving entries were last used, not when each hit was served.

The HTML needs the ``report`` extra (``pip install 'cachedb[report]'``, Plotly); the text form
needs nothing beyond cachedb's own dependencies.
"""

from __future__ import annotations

import ast
import datetime as dt
import html
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from .._errors import CacheDBError
from ..db import CacheDB

#: Op/shape groups drawn as charts (all of them are in the tables).
DEFAULT_MAX_GROUPS = 40
#: Choices drawn per op/shape chart (the fastest ones).
MAX_CHOICES_PER_CHART = 15
#: Rows of the kernel and hit tables (largest / most used first).
MAX_TABLE_ROWS = 200


class ReportError(CacheDBError):
    """The report could not be made (e.g. Plotly is not installed for ``--format html``)."""


# --------------------------------------------------------------------------- data


@dataclass
class ReportData:
    """Everything a report shows, read in one snapshot of the database."""

    where: str
    revision: str | None
    generated_at: str
    #: current timing of every choice: op, inputs, shape, hint_override, precision, series,
    #: choice_hash, timing_ms, recorded_at, winner (bool)
    timings: list[dict[str, Any]] = field(default_factory=list)
    #: one row per op/shape/series: the winner, its margin over the runner-up, candidates
    winners: list[dict[str, Any]] = field(default_factory=list)
    #: every benchmark (autotune_history) with its series label
    history: list[dict[str, Any]] = field(default_factory=list)
    #: every series with timings: label, device, torch version, Triton, CUDA/HIP, CPU, ISA, counts
    series: list[dict[str, Any]] = field(default_factory=list)
    best_configs: list[dict[str, Any]] = field(default_factory=list)
    contents: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    hits: list[dict[str, Any]] = field(default_factory=list)
    #: per UTC day of last hit and kind: day (``YYYY-MM-DD``), kind, entries, hits, seconds_saved (s)
    saved: list[dict[str, Any]] = field(default_factory=list)

    def groups(self) -> list[tuple[str, str, str]]:
        """``(op, shape, group key)`` of every op/shape, in first-seen order."""
        seen: dict[str, tuple[str, str, str]] = {}
        for r in self.timings:
            seen.setdefault(r["group"], (r["op"], r["shape"], r["group"]))
        return list(seen.values())

    def side_by_side(self, group: str) -> tuple[list[str], list[dict[str, Any]]]:
        """One op and input shape on every series side by side: ``(series, rows)``, a row per
        choice (matched across series by name and config, :func:`choice_key`, so a config whose
        hash differs between devices is one row) with its ``label``, ``backend`` and, per
        series, ``{series: timing in ms}`` under ``"ms"`` and the series it won under
        ``"won"``; fastest first (by its best time)."""
        rows = [r for r in self.timings if r["group"] == group]
        series = list(dict.fromkeys(r["series"] for r in rows))
        by_key: dict[str, dict[str, Any]] = {}
        for r in rows:
            entry = by_key.setdefault(r["key"], {"label": r["label"], "backend": r["backend"], "ms": {},
                                                 "won": set(), "hashes": set()})
            previous = entry["ms"].get(r["series"])
            if previous is None or r["timing_ms"] < previous:
                entry["ms"][r["series"]] = r["timing_ms"]
            entry["hashes"].add(r["choice_hash"])
            if r["winner"]:
                entry["won"].add(r["series"])
        ordered = sorted(by_key.values(), key=lambda e: (min(e["ms"].values()), e["label"]))
        return series, ordered


def _iso(value: Any) -> str | None:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` (UTC), from a datetime (PostgreSQL) or the
    string SQLite returns for a view's column."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="seconds")
    s = str(value)
    return s[:19] if len(s) >= 19 and s[4] == "-" else s


def series_label(device_name: str | None, torch_version: str | None, cpu_model: str | None,
                 system_hash: str | None, precision: str | None = None) -> str:
    """How a report names one system fingerprint (and precision): ``NVIDIA H100 · torch
    2.11.0 · 1a2b3c4d · highest``."""
    parts = [device_name or cpu_model or "CPU", f"torch {torch_version}" if torch_version else "torch ?"]
    if system_hash:
        parts.append(system_hash[:8])
    if precision:
        parts.append(precision)
    return " · ".join(parts)


#: What a label keeps of a Triton template's description (``TritonTemplate.generate``'s kwargs,
#: torch/_inductor/select_algorithm.py) after its ``BLOCK_*`` sizes, in this order, and the
#: short names it gives them.
_CONFIG_KEYS = {"GROUP_M": "GROUP_M", "num_stages": "stages", "num_warps": "warps",
                "num_consumer_groups": "consumer_groups", "num_buffers_warp_spec": "buffers_warp_spec"}
_BLOCKS = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
_PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^,]*)")


def config_label(description: str | None, tile_shape: str | None = None, num_stages: int | None = None,
                 num_warps: int | None = None) -> str:
    """A choice's config in a few words: from a Triton template's description
    (``BLOCK_K=32, BLOCK_M=64, BLOCK_N=128, ..., num_stages=3, num_warps=4``) its blocks, group,
    stages and warps (``BLOCK_M=64 BLOCK_N=128 BLOCK_K=32 stages=3 warps=4``); else from the
    ``info_dict()`` columns (a CUTLASS op's ``tile [128, 256, 64]``); else the description
    itself, cut to 60 characters; ``""`` when torch gave none (extern and C++ choices)."""
    pairs = {k: v.strip() for k, v in _PAIR.findall(description or "")}
    blocks = [k for k in _BLOCKS if k in pairs]
    blocks += sorted(k for k in pairs if k.startswith("BLOCK_") and k not in _BLOCKS)
    rest = [k for k in _CONFIG_KEYS if k in pairs]
    if blocks or rest:
        return " ".join(f"{_CONFIG_KEYS.get(k, k)}={pairs[k]}" for k in blocks + rest)
    parts = [f"tile {tile_shape}"] if tile_shape and tile_shape != "(-1, -1, -1)" else []
    if num_stages is not None:
        parts.append(f"stages={num_stages}")
    if num_warps is not None:
        parts.append(f"warps={num_warps}")
    if parts:
        return " ".join(parts)
    text = (description or "").strip()
    return text if len(text) <= 60 else text[:59] + "…"


def choice_label(choice_hash: str, name: str | None, description: str | None = None, tile_shape: str | None = None,
                 num_stages: int | None = None, num_warps: int | None = None) -> str:
    """How the report names a choice: its name and config (``triton_mm_4 · BLOCK_M=64
    BLOCK_N=128 BLOCK_K=32 stages=3 warps=4``, ``_mkl_linear``), or, where no description is
    stored (timings imported from Inductor's files), its hash shortened."""
    if not name:
        return short_choice(choice_hash)
    config = config_label(description, tile_shape, num_stages, num_warps)
    return f"{name} · {config}" if config else name


def choice_key(choice_hash: str, name: str | None, description: str | None) -> str:
    """What matches one choice across series (devices, torch versions) in
    :meth:`ReportData.side_by_side`: its name less the trailing number a process gives each
    template choice (``triton_mm_12`` → ``triton_mm``) with its description, or its hash
    where none is stored."""
    if not name:
        return f"hash:{choice_hash}"
    return f"{re.sub(r'_[0-9]+$', '', name)}\x00{description or ''}"


def _dtype(name: Any) -> str:
    short = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float64": "f64",
             "torch.int8": "i8", "torch.int32": "i32", "torch.int64": "i64", "torch.uint8": "u8",
             "torch.float8_e4m3fn": "f8e4m3", "torch.float8_e5m2": "f8e5m2"}
    return short.get(str(name), str(name).removeprefix("torch."))


def shape_label(inputs: str) -> str:
    """A short label of an autotune ``inputs`` key: ``f32[32,64] × f32[64,64] × f32[64]``.

    Inductor's key lists, per input node, ``(device, dtype, *sizes, *strides, offset)``
    (``AlgorithmSelectorCache.key_of``). The text is parsed as a Python literal (never
    evaluated); anything else is returned shortened.
    """
    try:
        nodes = ast.literal_eval(inputs)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return inputs if len(inputs) <= 80 else inputs[:77] + "..."
    out = []
    if isinstance(nodes, (list, tuple)):
        for node in nodes:
            if isinstance(node, (list, tuple)) and len(node) >= 3 and len(node) % 2 == 1:
                ndim = (len(node) - 3) // 2
                sizes = ",".join(str(s) for s in node[2:2 + ndim])
                out.append(f"{_dtype(node[1])}[{sizes}]")
            else:
                out.append(str(node)[:30])
    label = " × ".join(out)
    return label if label else inputs[:80]


def _rows(session: Session, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    result = session.execute(text(sql), dict(params or {}))
    return [dict(r._mapping) for r in result]


def collect(db: CacheDB) -> ReportData:
    """Read everything the report shows, in one read-only snapshot of ``db``."""
    from .stats import collect as collect_stats

    with db.read() as repos:
        s = repos.session
        data = ReportData(
            where=db.where, revision=db.revision(),
            generated_at=dt.datetime.now(dt.timezone.utc).isoformat(sep=" ", timespec="seconds"),
        )
        current = _rows(s, """
            SELECT c.fingerprint_id, c.op, c.inputs, c.hint_override, c.precision, c.choice_hash,
                   c.timing_ms, c.recorded_at, c.choice_name, c.backend, c.description, c.tile_shape,
                   c.num_stages, c.num_warps, f.system_hash, f.device_name, f.torch_version, f.cpu_model
            FROM autotune_current c JOIN system_fingerprints f ON f.id = c.fingerprint_id
            ORDER BY c.op, c.inputs, c.hint_override, f.device_name, f.torch_version, c.fingerprint_id,
                     c.precision, c.timing_ms, c.choice_hash""")
        winners = {(w["fingerprint_id"], w["op"], w["inputs"], w["hint_override"], w["precision"]): w
                   for w in _rows(s, "SELECT fingerprint_id, op, inputs, hint_override, precision, choice_hash, "
                                     "timing_ms, candidates FROM autotune_winners")}
        shapes: dict[str, str] = {}
        per_series: dict[tuple, list[dict[str, Any]]] = {}
        for r in current:
            shape = shapes.setdefault(r["inputs"], shape_label(r["inputs"]))
            if r["hint_override"] is not None:
                shape += f" (hint {r['hint_override']})"
            wkey = (r["fingerprint_id"], r["op"], r["inputs"], r["hint_override"], r["precision"])
            w = winners.get(wkey)
            row = {
                "op": r["op"], "inputs": r["inputs"], "shape": shape, "hint_override": r["hint_override"],
                "group": f"{r['op']}\x00{r['inputs']}\x00{r['hint_override']}",
                "precision": r["precision"],
                "series": series_label(r["device_name"], r["torch_version"], r["cpu_model"], r["system_hash"],
                                       r["precision"]),
                "device_name": r["device_name"], "torch_version": r["torch_version"],
                "choice_hash": r["choice_hash"], "timing_ms": float(r["timing_ms"]),
                "recorded_at": _iso(r["recorded_at"]),
                "winner": bool(w and w["choice_hash"] == r["choice_hash"]),
                "choice_name": r["choice_name"], "backend": r["backend"], "description": r["description"],
                "label": choice_label(r["choice_hash"], r["choice_name"], r["description"], r["tile_shape"],
                                      r["num_stages"], r["num_warps"]),
                "key": choice_key(r["choice_hash"], r["choice_name"], r["description"]),
            }
            data.timings.append(row)
            per_series.setdefault(wkey, []).append(row)
        for wkey, rows in per_series.items():
            ordered = sorted(rows, key=lambda x: (x["timing_ms"], x["choice_hash"]))
            best = ordered[0]
            runner = ordered[1] if len(ordered) > 1 else None
            data.winners.append({
                "op": best["op"], "shape": best["shape"], "series": best["series"],
                "winner": best["choice_hash"], "winner_label": best["label"], "backend": best["backend"],
                "winner_ms": best["timing_ms"],
                "runner_up": runner["choice_hash"] if runner else None,
                "runner_up_label": runner["label"] if runner else None,
                "runner_up_ms": runner["timing_ms"] if runner else None,
                "margin_pct": round(100.0 * (runner["timing_ms"] / best["timing_ms"] - 1.0), 2)
                if runner and best["timing_ms"] > 0 else None,
                "candidates": len(rows), "group": best["group"],
            })
        for r in _rows(s, """
                SELECT op, inputs, hint_override, precision, choice_hash, timing_ms, recorded_at,
                       system_hash, device_name, torch_version, cpu_model, choice_name, description,
                       tile_shape, num_stages, num_warps
                FROM autotune_history ORDER BY recorded_at, id"""):
            data.history.append({
                "group": f"{r['op']}\x00{r['inputs']}\x00{r['hint_override']}",
                "series": series_label(r["device_name"], r["torch_version"], r["cpu_model"], r["system_hash"],
                                       r["precision"]),
                "choice_hash": r["choice_hash"], "timing_ms": float(r["timing_ms"]),
                "recorded_at": _iso(r["recorded_at"]),
                "label": choice_label(r["choice_hash"], r["choice_name"], r["description"], r["tile_shape"],
                                      r["num_stages"], r["num_warps"]),
            })
        for r in _rows(s, """
                SELECT f.id, f.system_hash, f.device_name, f.torch_version, f.triton_key, f.cuda_version,
                       f.hip_version, f.cpu_model, f.isa, COUNT(*) AS benchmarks,
                       COUNT(DISTINCT t.choice_hash) AS choices, COUNT(DISTINCT c.choice_hash) AS named
                FROM autotune_timings t JOIN system_fingerprints f ON f.id = t.fingerprint_id
                LEFT JOIN autotune_choices c ON c.choice_hash = t.choice_hash
                GROUP BY f.id, f.system_hash, f.device_name, f.torch_version, f.triton_key, f.cuda_version,
                         f.hip_version, f.cpu_model, f.isa
                ORDER BY f.device_name, f.torch_version, f.id"""):
            data.series.append({
                "series": series_label(r["device_name"], r["torch_version"], r["cpu_model"], r["system_hash"]),
                "device": r["device_name"] or r["cpu_model"] or "CPU",
                "torch_version": r["torch_version"] or "unknown",
                "triton": r["triton_key"], "cuda": r["cuda_version"] or r["hip_version"],
                "cpu_model": r["cpu_model"], "isa": r["isa"], "system_hash": r["system_hash"],
                "benchmarks": int(r["benchmarks"]), "choices": int(r["choices"]), "described": int(r["named"]),
            })
        for r in _rows(s, """
                SELECT b.key, b.num_warps, b.num_stages, b.found_by_coordesc, b.time_taken_ms, b.kernel_kwargs,
                       b.configs_hash, b.triton_cache_hash, b.created_at, b.updated_at,
                       f.system_hash, f.device_name, f.torch_version, f.cpu_model
                FROM best_configs b LEFT JOIN system_fingerprints f ON f.id = b.fingerprint_id
                ORDER BY b.updated_at DESC, b.key"""):
            data.best_configs.append({
                "kernel": r["key"].rsplit("/", 1)[-1].removesuffix(".best_config"), "key": r["key"],
                "config": r["kernel_kwargs"] or "", "num_warps": r["num_warps"], "num_stages": r["num_stages"],
                "found_by": None if r["found_by_coordesc"] is None
                else ("coordinate descent" if r["found_by_coordesc"] else "autotune"),
                "time_taken_ms": r["time_taken_ms"],
                "fingerprint": series_label(r["device_name"], r["torch_version"], r["cpu_model"], r["system_hash"])
                if r["system_hash"] else "-",
                "created_at": _iso(r["created_at"]), "updated_at": _iso(r["updated_at"]),
                "rewritten": _iso(r["updated_at"]) != _iso(r["created_at"]),
            })
        data.contents = collect_stats(s)
        for r in _rows(s, """
                SELECT kind, host_key, key, files, size_bytes, stored_bytes, shared_files, hit_count,
                       created_at, last_used_at
                FROM kernels ORDER BY stored_bytes DESC, key"""):
            data.kernels.append({
                "kind": r["kind"], "key": r["key"], "host_key": r["host_key"] or "",
                "files": int(r["files"] or 0), "bytes": int(r["size_bytes"] or 0),
                "stored_bytes": int(r["stored_bytes"] or 0), "shared_files": int(r["shared_files"] or 0),
                "hits": int(r["hit_count"] or 0), "created_at": _iso(r["created_at"]),
                "last_used_at": _iso(r["last_used_at"]),
            })
        for r in _rows(s, """
                SELECT kind, key, variant, hit_count, size_bytes, created_at, last_used_at
                FROM guarded_entries ORDER BY last_used_at, id"""):
            data.hits.append({"kind": r["kind"], "key": r["key"], "variant": r["variant"],
                              "hits": int(r["hit_count"] or 0), "bytes": int(r["size_bytes"] or 0),
                              "created_at": _iso(r["created_at"]), "last_used_at": _iso(r["last_used_at"])})
        for k in data.kernels:
            data.hits.append({"kind": f"{k['kind']}_kernel", "key": k["key"], "variant": "",
                              "hits": k["hits"], "bytes": k["bytes"], "created_at": k["created_at"],
                              "last_used_at": k["last_used_at"]})
        data.hits.sort(key=lambda h: (h["last_used_at"] or "", h["kind"], h["key"]))
        data.saved = _saved_by_day(_rows(s, """
                SELECT kind, hits, seconds_saved, last_used_at FROM entry_value WHERE hits > 0"""))
    return data


def _saved_by_day(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``entry_value`` rows summed per UTC day of their last use and kind, oldest day first."""
    days: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        used = r["last_used_at"]
        if isinstance(used, str):  # a driver that returns the text SQLite holds
            used = dt.datetime.fromisoformat(used)
        if used.tzinfo is not None:
            used = used.astimezone(dt.timezone.utc)
        key = (used.date().isoformat(), str(r["kind"]))
        day = days.setdefault(key, {"day": key[0], "kind": key[1], "entries": 0, "hits": 0, "seconds_saved": 0.0})
        day["entries"] += 1
        day["hits"] += int(r["hits"] or 0)
        day["seconds_saved"] += float(r["seconds_saved"] or 0.0)
    for day in days.values():
        day["seconds_saved"] = round(day["seconds_saved"], 3)
    return [days[k] for k in sorted(days)]


# --------------------------------------------------------------------------- charts (Plotly figure specs)

_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {"title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
                              "font": _FONT, "margin": {"l": 60, "r": 20, "t": 80, "b": 50}, "height": 380,
                              "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom",
                                         "font": {"size": 11}},
                              "paper_bgcolor": "white", "plot_bgcolor": "#f7f7f9"}
    layout.update(extra)
    return layout


def short_choice(choice: str, width: int = 48) -> str:
    """A choice hash cut to ``width`` characters (head and tail kept: tails tell hashes apart)."""
    return choice if len(choice) <= width else f"{choice[:width - 13]}…{choice[-12:]}"


def _tick(label: str, width: int = 64) -> str:
    return label if len(label) <= width else label[:width - 1] + "…"


def group_chart(data: ReportData, group: str, title: str) -> dict[str, Any]:
    """Horizontal bars: every choice's current timing (ms), labelled by name and config
    (:func:`choice_label`; the hash on hover), one trace per series, so one config on several
    devices or torch versions stands side by side (choices matched by :func:`choice_key`);
    the winner of each series marked ★ and outlined."""
    rows = [r for r in data.timings if r["group"] == group]
    best: dict[str, float] = {}
    labels: dict[str, str] = {}
    for r in rows:
        best[r["key"]] = min(best.get(r["key"], r["timing_ms"]), r["timing_ms"])
        labels.setdefault(r["key"], r["label"])
    ranked = sorted(best.items(), key=lambda kv: (kv[1], labels[kv[0]]))
    keep = [k for k, _ in ranked[:MAX_CHOICES_PER_CHART]]
    ticks: dict[str, str] = {}
    for n, k in enumerate(keep):  # a tick names one choice: a second of one label is numbered
        tick = _tick(labels[k])
        ticks[k] = f"{tick} [{n + 1}]" if tick in ticks.values() else tick
    traces = []
    for series in dict.fromkeys(r["series"] for r in rows):
        mine: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["series"] == series and (r["key"] not in mine or r["timing_ms"] < mine[r["key"]]["timing_ms"]):
                mine[r["key"]] = r
        chosen = [k for k in keep if k in mine]
        traces.append({
            "type": "bar", "orientation": "h", "name": series,
            "y": [ticks[k] for k in chosen], "x": [mine[k]["timing_ms"] for k in chosen],
            "text": [f"{mine[k]['timing_ms']:.4g} ms" + (" ★" if mine[k]["winner"] else "") for k in chosen],
            "textposition": "auto",
            "hovertext": [f"{html.escape(mine[k]['label'])}<br>{html.escape(mine[k]['choice_hash'])}"
                          + (f"<br>{html.escape(mine[k]['backend'])}" if mine[k]["backend"] else "") for k in chosen],
            "hovertemplate": "%{hovertext}<br>%{x:.4g} ms<extra>%{fullData.name}</extra>",
            "marker": {"line": {"width": [2.5 if mine[k]["winner"] else 0 for k in chosen], "color": "#111"}},
        })
    more = len(ranked) - len(keep)
    subtitle = f" (fastest {len(keep)} of {len(ranked)} choices)" if more > 0 else ""
    height = max(240, 110 + 24 * len(keep) * max(1, min(len(traces), 3)))
    return {"data": traces, "layout": _layout(title + subtitle, height=height, barmode="group",
                                              xaxis={"title": {"text": "time (ms), lower is better"}},
                                              yaxis={"autorange": "reversed", "automargin": True})}


def history_chart(data: ReportData, group: str, title: str) -> dict[str, Any] | None:
    """Every benchmark of the group over time (ms), one trace per series (each point's choice
    and hash on hover); ``None`` when the history holds nothing beyond the current timings of
    one series."""
    rows = [r for r in data.history if r["group"] == group]
    series = list(dict.fromkeys(r["series"] for r in rows))
    current = sum(1 for r in data.timings if r["group"] == group)
    if len(series) < 2 and len(rows) <= current:
        return None
    traces = []
    for sname in series:
        mine = [r for r in rows if r["series"] == sname]
        traces.append({"type": "scatter", "mode": "markers", "name": sname,
                       "x": [r["recorded_at"] for r in mine], "y": [r["timing_ms"] for r in mine],
                       "hovertext": [f"{html.escape(r['label'])}<br>{html.escape(r['choice_hash'])}" for r in mine],
                       "hovertemplate": "%{hovertext}<br>%{y:.4g} ms at %{x}<extra>%{fullData.name}</extra>",
                       "marker": {"size": 9, "opacity": 0.8}})
    return {"data": traces, "layout": _layout(title, height=320, xaxis={"title": {"text": "recorded at (UTC)"}},
                                              yaxis={"title": {"text": "time (ms)"}, "type": "log"})}


def contents_chart(data: ReportData) -> dict[str, Any]:
    """Stored bytes per kind, stacked by fingerprint."""
    kinds = list(dict.fromkeys(r["kind"] for r in data.contents))
    traces = []
    for fp in dict.fromkeys(r["fingerprint"] for r in data.contents):
        by_kind = {r["kind"]: r for r in data.contents if r["fingerprint"] == fp}
        traces.append({"type": "bar", "name": fp, "x": kinds,
                       "y": [by_kind[k]["stored_bytes"] if k in by_kind else 0 for k in kinds],
                       "customdata": [by_kind[k]["entries"] if k in by_kind else 0 for k in kinds],
                       "hovertemplate": "%{x}: %{y:,} stored bytes, %{customdata} entries<extra>%{fullData.name}</extra>"})
    return {"data": traces, "layout": _layout("Stored bytes by kind and fingerprint", barmode="stack",
                                              yaxis={"title": {"text": "stored bytes"}})}


def kernels_chart(data: ReportData, top: int = 30) -> dict[str, Any]:
    """Bytes and stored bytes of the largest kernels."""
    rows = data.kernels[:top]
    labels = [f"{r['kind']} {r['key'][:12]}…" for r in rows]
    return {"data": [
        {"type": "bar", "name": "bytes", "x": labels, "y": [r["bytes"] for r in rows],
         "hovertext": [r["key"] for r in rows]},
        {"type": "bar", "name": "stored bytes", "x": labels, "y": [r["stored_bytes"] for r in rows],
         "hovertext": [r["key"] for r in rows]},
    ], "layout": _layout(f"Kernels: bytes and stored bytes (largest {len(rows)})", barmode="group",
                         yaxis={"title": {"text": "bytes"}}, xaxis={"tickangle": -40, "automargin": True})}


def hits_chart(data: ReportData) -> dict[str, Any]:
    """Each entry's hits against its last use, one trace per kind."""
    traces = []
    for kind in dict.fromkeys(h["kind"] for h in data.hits):
        mine = [h for h in data.hits if h["kind"] == kind]
        traces.append({"type": "scatter", "mode": "markers", "name": kind,
                       "x": [h["last_used_at"] for h in mine], "y": [h["hits"] for h in mine],
                       "hovertext": [h["key"] for h in mine],
                       "hovertemplate": "%{hovertext}<br>%{y} hits, last used %{x}<extra>%{fullData.name}</extra>",
                       "marker": {"size": 9, "opacity": 0.75}})
    return {"data": traces, "layout": _layout("Hits by last use", xaxis={"title": {"text": "last used (UTC)"}},
                                              yaxis={"title": {"text": "hits"}, "rangemode": "tozero"})}


def saved_chart(data: ReportData) -> dict[str, Any]:
    """Compile seconds saved per UTC day of the entries' last hit, stacked by kind."""
    days = list(dict.fromkeys(r["day"] for r in data.saved))
    traces = []
    for kind in dict.fromkeys(r["kind"] for r in data.saved):
        by_day = {r["day"]: r for r in data.saved if r["kind"] == kind}
        traces.append({"type": "bar", "name": kind, "x": days,
                       "y": [by_day[d]["seconds_saved"] if d in by_day else 0 for d in days],
                       "customdata": [[by_day[d]["entries"], by_day[d]["hits"]] if d in by_day else [0, 0]
                                      for d in days],
                       "hovertemplate": "%{x}: %{y:,.1f} s saved by %{customdata[1]} hits of %{customdata[0]} "
                                        "entries last hit that day<extra>%{fullData.name}</extra>"})
    return {"data": traces, "layout": _layout("Compile seconds saved, by the day of each entry's last hit",
                                              barmode="stack", xaxis={"title": {"text": "day of last hit (UTC)"},
                                                                      "type": "category"},
                                              yaxis={"title": {"text": "compile seconds saved"}})}


def best_configs_chart(data: ReportData) -> dict[str, Any]:
    """Tuning time (ms) of each best config, by kernel."""
    rows = [b for b in data.best_configs if b["time_taken_ms"] is not None][:40]
    trace: dict[str, Any] = {
        "type": "bar", "name": "time taken", "x": [b["kernel"][:14] + "…" for b in rows],
        "y": [b["time_taken_ms"] for b in rows], "text": [b["config"] for b in rows], "textposition": "auto",
        "hovertext": [f"{b['key']}<br>{b['config']} warps={b['num_warps']} stages={b['num_stages']}" for b in rows],
        "hovertemplate": "%{hovertext}<br>%{y} ms<extra></extra>",
    }
    if len(rows) < 4:
        trace["width"] = 0.4
    return {"data": [trace],
            "layout": _layout("Best configs: tuning time per kernel", yaxis={"title": {"text": "time taken (ms)"}},
                              xaxis={"tickangle": -40, "automargin": True})}


# --------------------------------------------------------------------------- HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fff}
header{background:#24292f;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;font-size:13px;color:#c9d1d9}
nav{padding:8px 24px;border-bottom:1px solid #ddd;font-size:14px}nav a{margin-right:16px}
main{padding:8px 24px 40px}section{margin-top:18px}h2{font-size:18px;border-bottom:2px solid #eee;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 4px}.muted{color:#666;font-size:13px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px}
.card b{display:block;font-size:20px}.chart{width:100%;min-height:200px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:12px}
table{border-collapse:collapse;font-size:12px;margin:6px 0 12px}th,td{border:1px solid #ddd;padding:3px 6px;text-align:left}
th{background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}tr.win td{background:#eaf7ea}
code{font-size:11px}details{margin:4px 0}
"""

_DRAW = """
(function () {
  var specs = JSON.parse(document.getElementById('cachedb-charts').textContent);
  var config = {responsive: true, displaylogo: false};
  var jobs = specs.map(function (s) {
    return Plotly.newPlot(s.id, s.figure.data, s.figure.layout, config);
  });
  Promise.all(jobs).then(function () {
    document.body.setAttribute('data-charts-drawn', String(jobs.length));
  }, function (e) {
    document.body.setAttribute('data-charts-error', String(e));
  });
})();
"""


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, numeric: Iterable[str] = (),
           highlight: str | None = None, limit: int | None = None, titles: Mapping[str, str] | None = None,
           headers: Mapping[str, str] | None = None) -> str:
    """An HTML table of ``rows``' ``columns``; ``titles``: ``{column: key}``, the row's value of
    ``key`` on hover over that column's cells (a choice's hash over its label); ``headers``:
    the headings of columns named otherwise."""
    if not rows:
        return '<p class="muted">nothing stored</p>'
    numeric = set(numeric)
    titles = titles or {}
    headers = headers or {}
    shown = rows[:limit] if limit else rows
    head = "".join(f"<th>{html.escape(headers.get(c, c))}</th>" for c in columns)
    body = []
    for r in shown:
        cls = ' class="win"' if highlight and r.get(highlight) else ""
        cells = []
        for c in columns:
            title = r.get(titles[c]) if c in titles else None
            attrs = (" class=n" if c in numeric else "") + (f' title="{html.escape(str(title))}"' if title else "")
            cells.append(f"<td{attrs}>{html.escape(_fmt(r.get(c)))}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    note = f'<p class="muted">{len(rows) - len(shown)} more rows not shown</p>' if len(shown) < len(rows) else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}"


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise ReportError("the HTML report needs Plotly: pip install 'cachedb[report]' "
                          "(or use --format text)") from exc
    return get_plotlyjs()


def _script_json(value: Any) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</`` can close it)."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


#: The columns of the winners' table (HTML and text).
WINNER_COLUMNS = ("op", "shape", "series", "winner_label", "backend", "winner_ms", "runner_up_label",
                  "runner_up_ms", "margin_pct", "candidates")
#: Headings of the columns whose keys say less (the text report's tables; the HTML's winners).
_HEADINGS = {"winner_label": "winner", "runner_up_label": "runner-up", "winner_ms": "ms", "runner_up_ms": "ms",
             "margin_pct": "margin %", "candidates": "n", "torch_version": "torch", "benchmarks": "timings",
             "timing_ms": "ms"}
#: The columns of the series' table.
SERIES_COLUMNS = ("series", "device", "torch_version", "cuda", "triton", "cpu_model", "isa", "benchmarks",
                  "choices", "described")


def comparison(data: ReportData, group: str) -> tuple[list[str], list[dict[str, Any]]]:
    """:meth:`ReportData.side_by_side` as a table: ``(columns, rows)``, the columns ``choice``
    (its label), ``backend`` and one per series, each cell the choice's time there in ms
    (``★`` where it won), empty where that series did not benchmark it; ``hashes``: the choice
    hashes of the row (for hover)."""
    series, entries = data.side_by_side(group)
    rows = []
    for entry in entries:
        row: dict[str, Any] = {"choice": entry["label"], "backend": entry["backend"],
                               "hashes": " ".join(sorted(entry["hashes"]))}
        for name in series:
            ms = entry["ms"].get(name)
            row[name] = None if ms is None else f"{ms:.4g}" + (" ★" if name in entry["won"] else "")
        rows.append(row)
    return ["choice", "backend", *series], rows


def render_html(data: ReportData, *, max_groups: int = DEFAULT_MAX_GROUPS, plotly_js: str | None = None) -> str:
    """The report as one self-contained HTML document (Plotly's JavaScript inlined, no URL
    fetched). ``max_groups`` bounds the op/shape charts; the tables hold every row."""
    charts: list[dict[str, Any]] = []

    def chart(figure: dict[str, Any], css: str = "chart") -> str:
        cid = f"chart-{len(charts)}"
        charts.append({"id": cid, "figure": figure})
        return f'<div id="{cid}" class="{css}"></div>'

    e = html.escape
    n_kernels = len(data.kernels)
    total_stored = sum(r["stored_bytes"] for r in data.contents)
    cards = [("op/shape groups", len(data.groups())), ("benchmarks", len(data.history)),
             ("best configs", len(data.best_configs)), ("kernels", n_kernels),
             ("cached entries", sum(1 for h in data.hits if not h["kind"].endswith("_kernel"))),
             ("hits", sum(h["hits"] for h in data.hits)), ("stored bytes", total_stored)]
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>cachedb report: {e(data.where)}</title><style>{_CSS}</style>",
        f"<script>{plotly_js if plotly_js is not None else _plotly_js()}</script></head><body>",
        f"<header><h1>cachedb report</h1><p>{e(data.where)} · schema {e(str(data.revision))} · "
        f"generated {e(data.generated_at)} UTC</p></header>",
        '<nav><a href="#autotune">Autotuning</a><a href="#best-configs">Best configs</a>'
        '<a href="#contents">Contents</a><a href="#kernels">Kernels</a><a href="#hits">Hits</a></nav><main>',
        '<div class="cards">' + "".join(f"<div class=card><b>{_fmt(v)}</b>{e(k)}</div>" for k, v in cards) + "</div>",
        '<section id="autotune"><h2>Autotuning: choices and winners per op and input shape</h2>',
        '<p class="muted">Current timing of every choice (its latest benchmark), in milliseconds; '
        "★ and a dark outline mark the winner of each series (precision × GPU/CPU × torch version). "
        "Margin: how much slower the runner-up is. ",
        "Choices are named by torch's name and config (hover for the choice hash); a bare hash is a "
        "choice no stored description names (timings imported from Inductor's files).</p>",
        _table(data.winners, WINNER_COLUMNS, numeric=("winner_ms", "runner_up_ms", "margin_pct", "candidates"),
               titles={"winner_label": "winner", "runner_up_label": "runner_up"}, headers=_HEADINGS),
        "<h3>Series</h3><p class=muted>Every system the history holds timings of, with its torch "
        "version.</p>",
        _table(data.series, SERIES_COLUMNS, numeric=("benchmarks", "choices", "described"), headers=_HEADINGS),
    ]
    groups = data.groups()
    for op, shape, group in groups[:max_groups]:
        title = f"{op} · {shape}"
        parts.append(f"<h3>{e(title)}</h3><div class=grid>")
        parts.append(chart(group_chart(data, group, "Current timings (ms)")))
        hist = history_chart(data, group, "Benchmarks over time (ms)")
        if hist is not None:
            parts.append(chart(hist))
        parts.append("</div>")
        columns, compared = comparison(data, group)
        if len(columns) > 3:  # two series or more: side by side
            parts.append('<p class=muted>Side by side (ms; ★ the series\' winner):</p>'
                         + _table(compared, columns, numeric=columns[2:], titles={"choice": "hashes"}))
        rows = [r for r in data.timings if r["group"] == group]
        parts.append(f"<details><summary>{len(rows)} timings</summary>"
                     + _table(rows, ("series", "label", "backend", "timing_ms", "recorded_at", "winner",
                                     "choice_hash"),
                              numeric=("timing_ms",), highlight="winner", titles={"label": "choice_hash"},
                              headers={"label": "choice"}) + "</details>")
    if len(groups) > max_groups:
        parts.append(f'<p class="muted">{len(groups) - max_groups} more op/shape groups: in the table above '
                     "and in <code>cachedb report --format text</code>.</p>")
    if not groups:
        parts.append('<p class="muted">no autotune timings stored</p>')
    parts.append("</section>")

    parts.append('<section id="best-configs"><h2>Best configs per kernel</h2>'
                 '<p class="muted">The config Inductor keeps per Triton kernel, how it was found, the tuning '
                 "time (ms), and when it was first written and last rewritten.</p>")
    if any(b["time_taken_ms"] is not None for b in data.best_configs):
        parts.append(chart(best_configs_chart(data)))
    parts.append(_table(data.best_configs, ("kernel", "config", "num_warps", "num_stages", "found_by",
                                            "time_taken_ms", "fingerprint", "created_at", "updated_at",
                                            "rewritten"),
                        numeric=("num_warps", "num_stages", "time_taken_ms")) + "</section>")

    parts.append('<section id="contents"><h2>Cache contents by kind and fingerprint</h2>'
                 '<p class="muted">bytes: uncompressed payloads; stored bytes: what the database holds '
                 "(zstd frames, kernel blobs stored once).</p>")
    if data.contents:
        parts.append(chart(contents_chart(data)))
    parts.append(_table(data.contents, ("kind", "fingerprint", "entries", "bytes", "stored_bytes"),
                        numeric=("entries", "bytes", "stored_bytes")) + "</section>")

    parts.append('<section id="kernels"><h2>Kernels</h2>'
                 '<p class="muted">One row per kernel key (Triton cache directory or C++ library): files, '
                 "bytes, stored bytes, files sharing a blob with another key, hits.</p>")
    if data.kernels:
        parts.append(chart(kernels_chart(data)))
    parts.append(_table(data.kernels, ("kind", "key", "files", "bytes", "stored_bytes", "shared_files", "hits",
                                       "created_at", "last_used_at"),
                        numeric=("files", "bytes", "stored_bytes", "shared_files", "hits"),
                        limit=MAX_TABLE_ROWS) + "</section>")

    parts.append('<section id="saved"><h2>Seconds saved over time</h2>'
                 '<p class="muted">Compile seconds FX graph and AOTAutograd hits saved (the compile time torch '
                 "recorded × hits), per day of each entry's last hit: hits carry no time of their own, so all of an "
                 "entry's saving falls on the day it was last hit.</p>")
    if data.saved:
        parts.append(chart(saved_chart(data)))
    parts.append(_table(data.saved, ("day", "kind", "entries", "hits", "seconds_saved"),
                        numeric=("entries", "hits", "seconds_saved")) + "</section>")

    parts.append('<section id="hits"><h2>Hits over time</h2>'
                 '<p class="muted">Served hits of FX graph / AOTAutograd entries and kernels (counted by the '
                 "live backend) against their last use.</p>")
    if data.hits:
        parts.append(chart(hits_chart(data)))
    top = sorted(data.hits, key=lambda h: (-h["hits"], h["kind"], h["key"]))
    parts.append(_table(top, ("kind", "key", "variant", "hits", "bytes", "created_at", "last_used_at"),
                        numeric=("hits", "bytes"), limit=MAX_TABLE_ROWS) + "</section>")

    parts.append("</main>")
    parts.append(f'<script type="application/json" id="cachedb-charts">{_script_json(charts)}</script>')
    parts.append(f"<script>{_DRAW}</script></body></html>")
    return "\n".join(parts)


def write_html(db: CacheDB, out: str | Path, *, max_groups: int = DEFAULT_MAX_GROUPS) -> Path:
    """Write the HTML report of ``db`` to ``out`` (atomically) and return its path."""
    from ..store.files import write_atomic

    document = render_html(collect(db), max_groups=max_groups)
    target = Path(out).expanduser().resolve()
    try:
        write_atomic(target, document.encode("utf-8"), mode=0o644)
    except OSError as exc:
        raise ReportError(f"{out}: cannot write the report: {exc.strerror or exc}") from exc
    return target


# --------------------------------------------------------------------------- text


def render_text(data: ReportData, console: Any = None) -> None:
    """Print the report's tables in a terminal (rich): the same rows as the HTML."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()

    def table(title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
              numeric: Iterable[str] = (), highlight: str | None = None, limit: int | None = None) -> None:
        numeric = set(numeric)
        t = Table(title=title, title_justify="left", title_style="bold")
        for c in columns:
            t.add_column(_HEADINGS.get(c, c), justify="right" if c in numeric else "left", overflow="fold")
        shown = rows[:limit] if limit else rows
        for r in shown:
            style = "bold green" if highlight and r.get(highlight) else None
            t.add_row(*(Text(_fmt(r.get(c))) for c in columns), style=style)
        if not rows:
            console.print(Text(f"{title}: nothing stored", style="dim"))
            return
        console.print(t)
        if len(shown) < len(rows):
            console.print(Text(f"{len(rows) - len(shown)} more rows not shown", style="dim"))

    console.print(Text(f"cachedb report: {data.where} (schema {data.revision}, {data.generated_at} UTC)",
                       style="bold"))
    table("Autotune winners per op and input shape (ms; choices by name and config, hashes below)",
          data.winners, WINNER_COLUMNS, numeric=("winner_ms", "runner_up_ms", "margin_pct", "candidates"))
    table("Series (every system with timings, its torch version)", data.series, SERIES_COLUMNS,
          numeric=("benchmarks", "choices", "described"))
    for op, shape, group in data.groups():
        rows = [dict(r, choice=r["label"], hash=short_choice(r["choice_hash"], 40))
                for r in data.timings if r["group"] == group]
        table(f"{op} · {shape}: current timings (ms; winners in green)", rows,
              ("series", "choice", "backend", "timing_ms", "recorded_at", "winner", "hash"), numeric=("timing_ms",),
              highlight="winner")
        columns, compared = comparison(data, group)
        if len(columns) > 3:
            table(f"{op} · {shape}: side by side (ms; ★ the series' winner)", compared, columns,
                  numeric=columns[2:])
    table("Best configs per kernel", data.best_configs,
          ("kernel", "config", "num_warps", "num_stages", "found_by", "time_taken_ms", "fingerprint", "created_at",
           "updated_at"), numeric=("num_warps", "num_stages", "time_taken_ms"))
    table("Cache contents by kind and fingerprint", data.contents,
          ("kind", "fingerprint", "entries", "bytes", "stored_bytes"), numeric=("entries", "bytes", "stored_bytes"))
    table("Kernels", data.kernels, ("kind", "key", "files", "bytes", "stored_bytes", "hits", "last_used_at"),
          numeric=("files", "bytes", "stored_bytes", "hits"), limit=MAX_TABLE_ROWS)
    table("Compile seconds saved, by the day of each entry's last hit", data.saved,
          ("day", "kind", "entries", "hits", "seconds_saved"), numeric=("entries", "hits", "seconds_saved"))
    top = sorted(data.hits, key=lambda h: (-h["hits"], h["kind"], h["key"]))
    table("Hits (most used first)", top, ("kind", "key", "hits", "bytes", "last_used_at"),
          numeric=("hits", "bytes"), limit=MAX_TABLE_ROWS)
