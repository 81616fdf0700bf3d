"""A populated database for the fuzz tests, and the check that nothing in it was lost."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from cachedb import CacheDB, CacheDBError
from cachedb.layout.importer import ImportReport, Importer

from . import _synth

_TIMINGS = text(
    "SELECT f.system_hash, t.op, t.inputs, t.hint_override, t.precision, t.choice_hash, t.timing_ms "
    "FROM autotune_timings t JOIN system_fingerprints f ON f.id = t.fingerprint_id ORDER BY t.id"
)
_VALUES = text(
    "SELECT f.system_hash, v.key_path, v.value_json FROM local_cache_values v "
    "JOIN system_fingerprints f ON f.id = v.fingerprint_id ORDER BY v.id"
)


@dataclass
class Store:
    """A database populated from a synthetic cache dir, with a snapshot of what it holds."""

    db: CacheDB
    scratch: Path
    synth: _synth.SynthCache
    guarded: dict[tuple[str, str, str], bytes] = field(default_factory=dict)
    best_configs: dict[str, str] = field(default_factory=dict)
    timings: list[tuple] = field(default_factory=list)
    values: list[tuple] = field(default_factory=list)
    imports: int = 0

    @classmethod
    def create(cls, location: str | Path, scratch: Path, seed: int = 7) -> "Store":
        synth = _synth.build(scratch / "populated", seed=seed, fx_keys=10, aot_keys=5, best_configs=8, docs=1)
        db = CacheDB(location)
        report = Importer(db).run(synth.root)
        assert report.problems == []
        store = cls(db, scratch, synth)
        store.guarded, store.best_configs, store.timings, store.values = store._read()
        assert store.guarded == synth.guarded and store.best_configs == synth.best_configs
        return store

    def _read(self) -> tuple[dict, dict, list, list]:
        hashes = tuple(self.synth.docs)
        with self.db.read() as repos:
            guarded = {(e.kind, e.key, e.variant): e.payload for e in repos.guarded.iter_all()
                       if (e.kind, e.key, e.variant) in self.synth.guarded}
            best = {k: c for k, c in repos.best_configs.iter_all() if k in self.synth.best_configs}
            timings = [tuple(r) for r in repos.session.execute(_TIMINGS) if r[0] in hashes]
            values = [tuple(r) for r in repos.session.execute(_VALUES) if r[0] in hashes]
        return guarded, best, timings, values

    def lost(self) -> int:
        """How many populated entries are missing or changed (every payload re-verified)."""
        guarded, best, timings, values = self._read()
        n = sum(1 for k, v in self.guarded.items() if guarded.get(k) != v)
        n += sum(1 for k, v in self.best_configs.items() if best.get(k) != v)
        n += abs(len(timings) - len(self.timings)) + sum(1 for a, b in zip(timings, self.timings) if a != b)
        n += abs(len(values) - len(self.values)) + sum(1 for a, b in zip(values, self.values) if a != b)
        return n

    def import_files(self, files: dict[str, bytes], check: Callable[[ImportReport], None] | None = None
                     ) -> ImportReport | None:
        """Import a fresh directory holding ``files``. A :class:`CacheDBError` is an accepted
        refusal (``None``); any other exception propagates (the failure being hunted)."""
        self.imports += 1
        root = Path(tempfile.mkdtemp(dir=self.scratch, prefix="fuzz"))
        try:
            for rel, data in files.items():
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            try:
                report = Importer(self.db).run(root)
            except CacheDBError:
                return None
            if check is not None:
                check(report)
            return report
        finally:
            shutil.rmtree(root, ignore_errors=True)
