"""A/B probe: §4's live FX graph get cases from this tree and from an older one, alternating.

``python -m benchmarks._guarded_ab_probe OLD_DIR [--pairs N] [--case 100kb|variants]``

OLD_DIR holds older sources (``git archive SHA | tar -x -C OLD_DIR``). Each pair runs the case
once in a fresh process from each tree, in alternating order, so both sides see the same spells
of a noisy VM; each process prints the case's live and file medians (ms) and their ratio, as
§4's row does. The cases are §4's own code, run alone from each tree:

- ``100kb``: ``s4_guarded.run`` limited to its 100 KB case (puts and gets, files / cachedb /
  live interleaved; the first get in a fresh process is skipped);
- ``variants``: ``s4_guarded._variants_case`` (four 100 KB variants a key, the first holds).

Used in the fifteenth session to measure payload format 3 against the code before it
(docs/hot-paths.md, "Taken (2026-11-27, fifteenth session)"). Both trees must read the same
torch; each runs with its own directory first on ``sys.path``. A probe, not a section: its
figures are not in the report.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from benchmarks._context import Context
from benchmarks import s4_guarded as S
case = sys.argv[2]
ctx = Context(quick=False, scratch=Path(tempfile.mkdtemp(prefix="guarded-ab-")), verbose=False)
if case == "100kb":
    S.CASES = [c for c in S.CASES if c[0] == "100 KB"]
    S._variants_case = S._real_case = S._scale_case = lambda ctx, res: None
    S._first_gets = lambda *a, **k: None
    rows = S.run(ctx).rows
    row = next(r for r in rows if r.case.startswith("get 100 KB (live"))
else:
    from benchmarks._report import SectionResult
    res = SectionResult("guarded", "guarded")
    S._variants_case(ctx, res)
    row = res.rows[0]
print(json.dumps({"live_ms": row.cachedb.median, "files_ms": row.baseline.median}))
"""


def _one(tree: Path, case: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tree), case], check=True, capture_output=True, text=True, cwd=tree
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the older sources (git archive SHA | tar -x -C OLD)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of processes (default 3)")
    parser.add_argument("--case", choices=("100kb", "variants"), default="100kb")
    args = parser.parse_args(argv)
    trees = {"this": HERE, "old": args.old.resolve()}
    for pair in range(args.pairs):
        for name in (("old", "this") if pair % 2 == 0 else ("this", "old")):
            got = _one(trees[name], args.case)
            print(f"pair {pair + 1} {name:4} live {got['live_ms'] * 1e3:6.1f} us  files "
                  f"{got['files_ms'] * 1e3:6.1f} us  ratio {got['live_ms'] / got['files_ms']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
