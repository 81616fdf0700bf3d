"""The figures of a reliability run: what was tried, how often, with what outcome.

Tests call :func:`add` (counters, summed) and :func:`note` (values, replaced) while they run;
``tests/reliability/conftest.py`` writes everything to ``$CACHEDB_RELIABILITY_FIGURES`` when the
session ends (this script sets it: ``--out``, else ``tests/reliability/figures.json``); a plain
test run writes nothing.

As a script::

    python tests/reliability/figures.py            # run the suite, write figures.json, print the table
    python tests/reliability/figures.py --show     # print the table of an existing figures.json
    python tests/reliability/figures.py --out F    # write the JSON to F instead

The table printed is the one in RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_PATH = HERE / "figures.json"
ENV_PATH = "CACHEDB_RELIABILITY_FIGURES"

#: section -> name -> value. Counters are summed over a run; notes are replaced.
FIGURES: dict[str, dict[str, Any]] = {}


def add(section: str, **counts: int) -> None:
    """Add ``counts`` to the counters of ``section``."""
    bucket = FIGURES.setdefault(section, {})
    for name, n in counts.items():
        bucket[name] = bucket.get(name, 0) + int(n)


def note(section: str, **values: Any) -> None:
    """Set ``values`` (seeds, durations, backends, ...) in ``section``."""
    FIGURES.setdefault(section, {}).update(values)


def output_path() -> Path:
    return Path(os.environ.get(ENV_PATH) or DEFAULT_PATH)


def totals(figures: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The headline numbers over all sections."""

    def total(name: str) -> int:
        return sum(int(v.get(name, 0)) for v in figures.values() if isinstance(v, dict))

    return {
        "crash_trials": total("trials"),
        "sigkills": total("kills"),
        "corruptions_injected": total("corruptions_injected"),
        "corruptions_detected": total("corruptions_detected"),
        "corruptions_harmless": total("corruptions_harmless"),
        "corruptions_undetected": total("corruptions_undetected"),
        "corruptions_hit_known_bug": total("corruptions_hit_known_bug"),
        "fuzz_cases": total("fuzz_cases"),
        "exceptions_reaching_callers": total("exceptions"),
        "committed_entries_checked": total("committed_checked"),
        "entries_lost": total("entries_lost"),
    }


_ROWS = [
    ("crash_import", "SIGKILL during `Importer.run` of a synthetic cache dir (SQLite)"),
    ("crash_puts", "SIGKILL during a stream of committed `transaction()` puts (SQLite)"),
    ("concurrency_sqlite", "8 processes, mixed reads/writes, same keys (SQLite)"),
    ("concurrency_postgresql", "8 processes, mixed reads/writes, same keys (PostgreSQL)"),
    ("migration_sqlite", "8 processes open a revision-0001 DB at once (SQLite)"),
    ("migration_postgresql", "8 processes open a revision-0001 DB at once (PostgreSQL)"),
    ("corruption_payload", "bytes flipped / truncated in stored payloads and checksums"),
    ("corruption_file", "bytes overwritten in the SQLite file's pages"),
    ("fuzz_importer", "hypothesis: best configs, cache/<hash> docs, pickles, CUTLASS lists, dir layouts"),
    ("fuzz_pickle_scan", "hypothesis: `read_entry_fields` on pickles, mutations, opcode soup"),
    ("fuzz_cutlass_parse", "hypothesis: `parse_op_list` on op lists, mutations, any JSON"),
    ("fuzz_mega_cache", "hypothesis: `mega_cache.import_artifacts` on Mega-Cache blobs"),
    ("fuzz_cli", "hypothesis: argument lists for `cachedb` (CliRunner)"),
    ("fuzz_cli_safety_sqlite", "hypothesis: every command's option values and paths on a real database (SQLite)"),
    ("fuzz_cli_safety_postgresql", "hypothesis: every command's option values and paths on a real database "
                                   "(PostgreSQL)"),
]


def markdown(data: dict[str, Any]) -> str:
    """The tables of RELIABILITY.md for a figures JSON document."""
    figures = data.get("figures", {})
    lines = ["| figure | value |", "|---|---:|"]
    for name, value in data.get("totals", totals(figures)).items():
        lines.append(f"| {name.replace('_', ' ')} | {value} |")
    lines += ["", "| section | what | figures |", "|---|---|---|"]
    described = dict(_ROWS)
    for section in sorted(figures):
        values = ", ".join(f"{k}={v}" for k, v in sorted(figures[section].items()))
        lines.append(f"| `{section}` | {described.get(section, '')} | {values} |")
    run = data.get("run", {})
    if run:
        lines += ["", "Run: " + ", ".join(f"{k}={v}" for k, v in run.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: $CACHEDB_RELIABILITY_FIGURES, else tests/reliability/figures.json)")
    parser.add_argument("--show", action="store_true", help="only print the table of an existing JSON file")
    args = parser.parse_args(argv)
    path = args.out or output_path()
    if not args.show:
        env = dict(os.environ)
        env[ENV_PATH] = str(path.resolve())
        proc = subprocess.run([sys.executable, "-m", "pytest", str(HERE), "-q"], cwd=ROOT, env=env, check=False)
        if proc.returncode != 0:
            print(f"pytest failed (exit {proc.returncode}); figures (if any) in {path}", file=sys.stderr)
            return proc.returncode
    data = json.loads(path.read_text())
    print(markdown(data))
    print(f"\n(figures from {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
