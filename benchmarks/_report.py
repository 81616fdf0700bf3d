"""Result rows, the Markdown table and the JSON document written to ``benchmarks/results/``."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._stats import Dist, sig

#: Version of the JSON layout below; bump on incompatible changes.
SCHEMA_VERSION = 1


@dataclass
class Row:
    """One comparison: cachedb against a baseline on the same case, in the same unit.

    ``ratio`` = cachedb median / baseline median (for times: below 1 means cachedb is faster).
    Rows without a baseline carry an absolute number (``cachedb`` only) and ``ratio`` None.
    """

    case: str
    cachedb: Dist | None
    baseline: Dist | None = None
    baseline_name: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.cachedb is None or self.baseline is None or self.baseline.median == 0:
            return None
        return self.cachedb.median / self.baseline.median

    def to_json(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "case": self.case,
            "unit": (self.cachedb or self.baseline).unit if (self.cachedb or self.baseline) else None,
            "cachedb": self.cachedb.to_json() if self.cachedb else None,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "baseline_name": self.baseline_name,
            "ratio": None if ratio is None else round(ratio, 5),
            "target": self.target,
            "met": self.met,
            "note": self.note,
        }


@dataclass
class SectionResult:
    """What one section measured: its rows, free-form notes and any extra numbers."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    #: CPU seconds (user + system) of the section's process and the children it waited for.
    cpu_seconds: float | None = None
    error: str | None = None
    #: 1-minute load average before and after the section (other processes skew timings).
    load_average: tuple[float | None, float | None] = (None, None)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "seconds": round(self.seconds, 2),
            "cpu_seconds": None if self.cpu_seconds is None else round(self.cpu_seconds, 2),
            "load_average_1min": list(self.load_average),
            "rows": [r.to_json() for r in self.rows],
            "notes": self.notes,
            "extra": self.extra,
            "error": self.error,
        }


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken: CPU, cores, Python, torch, SQLite, OS."""
    cpu = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        torch_version: str | None = str(torch.__version__)
    except ImportError:
        torch_version = None
    gpu = None
    try:
        if torch_version is not None and torch.cuda.is_available():
            count = torch.cuda.device_count()
            gpu = torch.cuda.get_device_name(0) if count == 1 else f"{count}x {torch.cuda.get_device_name(0)}"
    except Exception:  # a broken CUDA set-up: the report says no GPU rather than failing
        gpu = None
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "python": sys.version.split()[0],
        "torch": torch_version,
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def cachedb_source_digest() -> str:
    """SHA-256 (first 16 hex digits) over the measured cachedb package's ``*.py`` files, so a
    result can be matched to the code it measured."""
    import hashlib

    import cachedb

    root = Path(cachedb.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _fmt_ratio(row: Row) -> str:
    ratio = row.ratio
    if ratio is None:
        return "—"
    return f"{sig(ratio)}x"


def _fmt_met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: ""}[met]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _run_kind(meta: dict[str, Any]) -> str:
    """``full run``, ``quick run``, or the sections of a partial run, for the report's title."""
    kind = "quick run" if meta["quick"] else "full run"
    if meta.get("partial"):
        kind = f"{'quick ' if meta['quick'] else ''}run of {', '.join(meta['sections_run'])}"
    return kind


def result_name(device: str, sections: list[str], all_sections: list[str], quick: bool) -> str:
    """The stem of the files a run writes: ``cpu`` for a full CPU run, ``gpu`` for a run with
    ``--device cuda`` (§1's GPU workloads), ``cpu-<section>-...`` for a CPU run of some
    sections, with ``-quick`` added for a quick run, so that a partial or quick run never
    overwrites the full run's figures."""
    if device == "cuda":
        stem = "gpu"
    elif list(sections) == list(all_sections):
        stem = "cpu"
    else:
        stem = "-".join(["cpu", *sections])
    return f"{stem}-quick" if quick else stem


def markdown(results: list[SectionResult], meta: dict[str, Any]) -> str:
    """The Markdown report: one table of every row, then each section's notes."""
    m = meta["machine"]
    lines = [
        f"# cachedb benchmarks ({_run_kind(meta)}, {meta['created']})",
        "",
        f"{m['cpu']}, {m['cores']} cores{'; ' + m['gpu'] if m.get('gpu') else ''}; Python {m['python']}, torch {m['torch']}, "
        f"SQLite {m['sqlite']}; cachedb sources {meta.get('cachedb_source_sha256')}"
        f"{' (CHANGED during the run)' if meta.get('cachedb_source_changed_during_run') else ''}"
        f"{'; bytecode ' + meta['bytecode'] if meta.get('bytecode') else ''}"
        f"{'; bytecode of installed packages ' + meta['installed_bytecode'] if meta.get('installed_bytecode') else ''}; 1-min load average {meta.get('load_average_1min', {}).get('start')} at start, "
        f"{meta.get('load_average_1min', {}).get('end')} at end. Values: median [p10–p90] over n repetitions; "
        "ratio = cachedb median / baseline median (for times, < 1 means cachedb is faster).",
        "",
    ]
    if meta.get("lanes"):
        lines += ["A quick run: each section at its smallest size, its children on one shared machine (TMPDIR "
                  "and ISA probes built once), the sections in lanes run at once ("
                  + "; ".join(", ".join(lane) for lane in meta["lanes"]) + "): a smoke test, not figures.", ""]
    for run in meta.get("earlier_runs", []):
        em = run.get("machine") or {}
        lines += [f"Sections {', '.join(run['sections'])} come from the run of {run['created']} (`{run['command']}`; "
                  f"{em.get('gpu') or em.get('cpu')}, torch {em.get('torch')}).", ""]
    lines += [
        "| § | case | unit | cachedb | baseline | vs | ratio | n (cachedb/base) | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for idx, res in enumerate(results, 1):
        if res.error:
            lines.append(f"| {res.name} | **failed**: {_cell(res.error)} | | | | | | | | |")
        for row in res.rows:
            unit = (row.cachedb or row.baseline).unit if (row.cachedb or row.baseline) else ""
            n_c = str(row.cachedb.n) if row.cachedb else "—"
            n_b = str(row.baseline.n) if row.baseline else "—"
            lines.append(
                "| "
                + " | ".join(
                    _cell(x)
                    for x in (
                        res.name,
                        row.case,
                        unit,
                        row.cachedb.fmt() if row.cachedb else "—",
                        row.baseline.fmt() if row.baseline else "—",
                        row.baseline_name,
                        _fmt_ratio(row),
                        f"{n_c}/{n_b}",
                        row.target,
                        _fmt_met(row.met),
                    )
                )
                + " |"
            )
    lines.append("")
    for res in results:
        if not res.notes:
            continue
        lo, hi = res.load_average
        cpu = "" if res.cpu_seconds is None else f", {res.cpu_seconds:.0f} CPU-s"
        lines.append(f"**{res.name}** — {res.title} ({res.seconds:.0f} s{cpu}; load average {lo} → {hi})")
        lines.append("")
        lines.extend(f"- {note}" for note in res.notes)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def document(results: list[SectionResult], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: run metadata plus every section's rows, notes and extras."""
    return {
        "schema": SCHEMA_VERSION,
        **meta,
        "sections": {res.name: res.to_json() for res in results},
    }


def write(out_dir: Path, results: list[SectionResult], meta: dict[str, Any], name: str = "cpu") -> tuple[Path, Path, str]:
    """Write ``<name>.json`` and ``<name>.md`` under ``out_dir`` (see :func:`result_name`);
    returns both paths and the Markdown text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(results, meta)
    json_path = out_dir / f"{name}.json"
    md_path = out_dir / f"{name}.md"
    json_path.write_text(json.dumps(document(results, meta), indent=1, sort_keys=False) + "\n")
    md_path.write_text(md)
    return json_path, md_path, md


def _dist(doc: dict[str, Any] | None) -> Dist | None:
    if doc is None:
        return None
    return Dist(**{k: doc[k] for k in ("n", "unit", "median", "p10", "p90", "q1", "q3", "min", "max")})


def load_sections(doc: dict[str, Any]) -> list[SectionResult]:
    """The sections of a written JSON document, as :class:`SectionResult` objects."""
    out = []
    for name, sec in doc.get("sections", {}).items():
        res = SectionResult(name, sec["title"], notes=list(sec.get("notes", [])), extra=sec.get("extra", {}),
                            seconds=sec.get("seconds", 0.0), cpu_seconds=sec.get("cpu_seconds"),
                            error=sec.get("error"),
                            load_average=tuple(sec.get("load_average_1min") or (None, None)))  # type: ignore[arg-type]
        res.rows = [Row(r["case"], _dist(r["cachedb"]), _dist(r["baseline"]), r.get("baseline_name", ""),
                        r.get("target", ""), r.get("met"), r.get("note", "")) for r in sec.get("rows", [])]
        out.append(res)
    return out


def merged(path: Path, results: list[SectionResult], meta: dict[str, Any],
           order: list[str]) -> tuple[list[SectionResult], dict[str, Any]]:
    """This run's ``results`` and ``meta`` merged into the document at ``path`` (if any): the
    earlier run's sections that this run did not measure are kept, each noting the run it
    came from, and ``meta["earlier_runs"]`` lists those runs."""
    if not path.exists():
        return results, meta
    old = json.loads(path.read_text())
    fresh = {r.name for r in results}
    kept = [r for r in load_sections(old) if r.name not in fresh]
    if not kept:
        return results, meta
    m = old.get("machine", {})
    origin = (f"measured in the run of {old.get('created')} (`{old.get('command')}`; "
              f"{m.get('gpu') or m.get('cpu')}, torch {m.get('torch')})")
    for res in kept:
        if not any(n.startswith("measured in the run of") for n in res.notes):
            res.notes.insert(0, origin)
    before = [run for run in old.get("earlier_runs", []) if set(run["sections"]) & {r.name for r in kept}]
    attributed = {name for run in before for name in run["sections"]}
    own = [r.name for r in kept if r.name not in attributed]  # measured in the old document's own run
    earlier = [{**run, "sections": [n for n in run["sections"] if n not in fresh]} for run in before]
    if own:
        earlier.append({"created": old.get("created"), "command": old.get("command"), "sections": own, "machine": m})
    everything = {r.name: r for r in [*kept, *results]}
    ordered = [everything[n] for n in order if n in everything]
    meta = {**meta, "sections_run": [r.name for r in ordered], "earlier_runs": earlier}
    return ordered, meta


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
