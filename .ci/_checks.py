"""One line per check of a compatibility run, read from the JUnit report of the one pytest
session that ran them all (.ci/compat).

    python .ci/_checks.py CHECKS REPORT LOG

CHECKS has a line per check, ``name<TAB>node id ...`` (a node id: ``tests/x.py`` or
``tests/x.py::test_y``, parameters included where given); REPORT is pytest's ``--junitxml``
file, LOG the session's output (named in the lines). Prints ``PASS name (3 passed, 1 skipped)``,
``SKIP name (...)`` where every test of the check skipped, or ``FAIL name (...)`` where one
failed or errored, or where none of its node ids ran; exits 1 if a check failed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def _selector(node_id: str) -> tuple[str, str | None]:
    """``tests/x.py::test_y`` as JUnit names it: (``tests.x``, ``test_y``); a file: (``tests.x``, None)."""
    path, _, name = node_id.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    return module, (name.replace("::", ".") or None)


def _matches(classname: str, name: str, module: str, test: str | None) -> bool:
    if test is None:
        return classname == module or classname.startswith(module + ".")
    full = f"{classname}.{name}"
    return full == f"{module}.{test}" or full.startswith(f"{module}.{test}[")


def _outcome(case: ET.Element) -> str:
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed"
    if case.find("skipped") is not None:
        return "skipped"
    return "passed"


def main(checks_file: str, report: str, log: str) -> int:
    try:
        cases = [(c.get("classname", ""), c.get("name", ""), _outcome(c))
                 for c in ET.parse(report).getroot().iter("testcase")]
    except (OSError, ET.ParseError) as exc:
        cases = []
        print(f"note: no JUnit report from the checks' pytest session ({exc}); see {log}")
    failed = False
    for line in open(checks_file, encoding="utf-8"):
        if not line.strip():
            continue
        name, _, ids = line.rstrip("\n").partition("\t")
        selectors = [_selector(i) for i in ids.split()]
        counts: Counter[str] = Counter()
        for classname, case_name, outcome in cases:
            if any(_matches(classname, case_name, m, t) for m, t in selectors):
                counts[outcome] += 1
            elif classname == "" and any(case_name == m for m, _ in selectors):
                counts["failed"] += 1  # the file of a check could not be collected
        summary = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped") if counts[k])
        if counts["failed"] or not counts:
            print(f"FAIL {name} ({summary or 'nothing ran'}; see {log})")
            failed = True
        elif counts["passed"]:
            print(f"PASS {name} ({summary})")
        else:
            print(f"SKIP {name} ({summary}; see {log})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
