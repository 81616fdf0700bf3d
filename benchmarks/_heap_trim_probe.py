"""Why §4's live 20 MB get pays ~12k minor page faults per call where the file get pays none.

``python -m benchmarks._heap_trim_probe [OUT.md]`` runs §4's 20 MB case (files, repository
and live rows; no fresh-process pairs) in two child processes: one with glibc's malloc as it
comes, one where ``mallopt`` first fixes the trim threshold at 512 MiB and the mmap threshold
at 32 MiB (what glibc's dynamic thresholds would reach anyway, minus the trimming). Each child
prints §4's rows and the minor page faults per live and per file get; the probe prints both
side by side (ms per call, medians) and writes them to ``OUT.md`` if given.

The hypothesis it tests: a 20 MB ``free`` raises glibc's mmap threshold to 20 MB and its trim
threshold to twice that (40 MB). A file get holds 20 MB read + 20 MB unpickled at its peak;
a live get also holds the compressed row (5.5 MB at level 1) beneath them, so the heap's top passes
40 MB when everything is freed and glibc gives it back to the kernel (``brk``), to fault it
in again on the next get. Linux/glibc only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import ctypes, json, os, sys, tempfile
from pathlib import Path
if sys.argv[1] == "fixed":
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    assert libc.mallopt(M_TRIM_THRESHOLD, 512 << 20) == 1 and libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
from benchmarks._context import Context
import benchmarks.s4_guarded as s4
s4.CASES = [("20 MB", 20_000_000, 7, 3)]
s4._first_gets = lambda *a, **k: None
res = s4.run(Context(quick=False, scratch=Path(tempfile.mkdtemp()), verbose=False))
payload = res.extra["payloads"]["20 MB"]
print(json.dumps({
    "rows": [[r.case, r.cachedb.median, r.baseline.median] for r in res.rows],
    "faults_live": payload["get_page_faults_live"], "faults_files": payload["get_page_faults_files"],
}))
"""


def _child(mode: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if not sys.platform.startswith("linux"):
        print("glibc's malloc (Linux) only", file=sys.stderr)
        return 2
    got = {mode: _child(mode) for mode in ("default", "fixed")}
    lines = [
        "| §4 row, 20 MB | glibc default: cachedb ms | files ms | ratio | trim threshold fixed: cachedb ms | files ms | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for (case, c0, b0), (_, c1, b1) in zip(got["default"]["rows"], got["fixed"]["rows"]):
        lines.append(f"| {case} | {c0:.2f} | {b0:.2f} | {c0 / b0:.2f}x | {c1:.2f} | {b1:.2f} | {c1 / b1:.2f}x |")
    lines.append("")
    lines.append(
        f"Minor page faults per get: live {got['default']['faults_live']:,.0f} / files "
        f"{got['default']['faults_files']:,.0f} (glibc default); live {got['fixed']['faults_live']:,.0f} / files "
        f"{got['fixed']['faults_files']:,.0f} (trim threshold 512 MiB, mmap threshold 32 MiB)."
    )
    text = "\n".join(lines)
    print(text)
    if argv:
        Path(argv[0]).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
