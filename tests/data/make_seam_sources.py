"""Write tests/data/seam_sources.json: per torch (and Triton) release, the SHA-256 of the
source of each function a cachedb backport replaces (tests/test_backports.py checks the
installed release against it).

    python tests/data/make_seam_sources.py SITE_PACKAGES [SITE_PACKAGES ...]

Each SITE_PACKAGES holds ``torch/`` (or ``triton/``) of one release, installed or unpacked from
its wheel; the release is read from ``torch/version.py`` (``triton/__init__.py``). Entries of
releases not given are kept.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).with_name("seam_sources.json")

#: What each backport replaces: ``(package, file, qualified name)``.
TARGETS = {
    "recheck_autotune_cache": ("torch", "torch/_inductor/runtime/triton_heuristics.py",
                               "CachingAutotuner.recheck_autotune_cache"),
    "_dynamic_scale_rblock": ("torch", "torch/_inductor/runtime/triton_heuristics.py",
                              "CachingAutotuner._dynamic_scale_rblock"),
    "_load_cached_autotuning": ("torch", "torch/_inductor/runtime/autotune_cache.py", "_load_cached_autotuning"),
    "Config.__setstate__": ("triton", "triton/runtime/autotuner.py", "Config.__setstate__"),
}


def source_of(path: Path, qualname: str) -> str | None:
    """The source lines of ``qualname`` in ``path`` (its decorators included), as
    ``inspect.getsource`` gives them; ``None`` where the file has no such definition."""
    text = path.read_text(encoding="utf-8")
    node: ast.AST = ast.parse(text)
    for part in qualname.split("."):
        found = [c for c in ast.iter_child_nodes(node)
                 if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and c.name == part]
        if not found:
            return None
        node = found[-1]
    lines = text.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])  # type: ignore[attr-defined]
    return "".join(lines[start - 1:node.end_lineno])  # type: ignore[attr-defined]


def digest(path: Path, qualname: str) -> str | None:
    source = source_of(path, qualname)
    return hashlib.sha256(source.encode("utf-8")).hexdigest() if source is not None else None


def release(site: Path, package: str) -> str | None:
    """``major.minor`` of the torch or Triton release in ``site``."""
    if package == "torch":
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", (site / "torch" / "version.py").read_text(), re.M)
    else:
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", (site / "triton" / "__init__.py").read_text(), re.M)
    return ".".join(found.group(1).split(".")[:2]) if found else None


def main(sites: list[str]) -> None:
    table: dict[str, dict[str, str | None]] = json.loads(OUT.read_text()) if OUT.exists() else {}
    for site in map(Path, sites):
        for name, (package, file, qualname) in TARGETS.items():
            if not (site / file).is_file():
                continue
            table.setdefault(name, {})[f"{package} {release(site, package)}"] = digest(site / file, qualname)
    table = {name: dict(sorted(table[name].items(), key=lambda kv: [int(p) for p in kv[0].split()[1].split(".")]))
             for name in sorted(table)}
    OUT.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
