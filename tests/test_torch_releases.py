"""What changed in the files torch releases write, on real files (no torch needed).

``tests/data/cache-doc-torch-2.15.0.json`` is a ``cache/<system hash>`` document written by
torch 2.15.0 (CUDA build, Triton 3.9.0, no GPU) through ``PersistentCache.lookup`` (precision
``"highest"`` then ``"high"``, once with a hint override) and ``LocalCache.set_value``: its
system records Triton's key without a GPU and its timings are keyed by
``fp32_matmul_precision_key()`` (``"cuda:<p>,mkldnn:<p>"``) instead of ``"highest"``/``"high"``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cachedb import CacheDB, keys
from cachedb.fingerprint import Fingerprint
from cachedb.formats.local_cache_doc import build_cache, split_cache
from cachedb.layout.exporter import export_cache_dir
from cachedb.layout.importer import Importer

DOC_2_15 = Path(__file__).parent / "data" / "cache-doc-torch-2.15.0.json"
SYSTEM_HASH_2_15 = "9d9e988e92ae288b4b7d10a5ac69bc37785420d97a5bede70a408c052779b3fd"


def test_torch_2_15_timings_are_timings() -> None:
    doc = json.loads(DOC_2_15.read_text())
    timings, values = split_cache(doc["cache"])
    assert sorted((t.precision, t.hint_override, t.choice_hash, t.timing_ms) for t in timings) == [
        ("cuda:none,mkldnn:none", None, "aten_mm-c2", 0.25),
        ("cuda:none,mkldnn:none", None, "cpp_mm-c1", 0.125),
        ("cuda:tf32,mkldnn:tf32", 7, "cpp_mm-c1", 0.0625),
    ]
    assert [(v.key_path, v.value) for v in values] == [(("pad_mm", "key1"), True)]
    assert json.dumps({"system": doc["system"], "cache": build_cache(timings, values)}, indent=4) == DOC_2_15.read_text()


def test_torch_2_15_system_hash() -> None:
    system = json.loads(DOC_2_15.read_text())["system"]
    assert list(system) == ["version", "hash"] and system["hash"] == SYSTEM_HASH_2_15
    assert keys.system_hash(system, torch_version="2.15.0") == SYSTEM_HASH_2_15
    assert keys.system_info(None, system["version"]["triton"], torch_version="2.15.0") == system
    assert Fingerprint(system=system, torch_version="2.15.0+cu132").recomputed_system_hash() == SYSTEM_HASH_2_15


def test_torch_2_15_document_imports_as_timings_and_exports_byte_identical(tmp_path: Path) -> None:
    cache_dir = tmp_path / "inductor"
    (cache_dir / "cache").mkdir(parents=True)
    shutil.copyfile(DOC_2_15, cache_dir / "cache" / SYSTEM_HASH_2_15)
    db = CacheDB(tmp_path / "cache.db")
    try:
        report = Importer(db).run(cache_dir)
        assert report.problems == []
        assert report.added["autotune_timings"] == 3 and report.added["local_cache_values"] == 1
        export_cache_dir(db, tmp_path / "exported")
    finally:
        db.close()
    assert (tmp_path / "exported" / "cache" / SYSTEM_HASH_2_15).read_bytes() == DOC_2_15.read_bytes()
