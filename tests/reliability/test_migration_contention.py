"""Migrations under contention: 8 processes open a revision-0001 database holding real rows at
the same instant. Exactly one runs the upgrade; the others wait (``<db>.lock`` on SQLite, an
advisory lock on PostgreSQL) and find the head revision; every row survives with its values
(payloads byte-identical, ``last_used_at`` backfilled from ``created_at``, timings unchanged).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import MetaData, insert, select

from cachedb.store import migrate as _migrate
from cachedb.store.engine import WRITE_OPTION, create_cachedb_engine, to_url
from cachedb.store.payload import pack
from cachedb.keys import sha256_hash

from . import _work, figures

PROCESSES = 8
TABLES = ("system_fingerprints", "guarded_entries", "autotune_timings", "local_cache_values", "best_configs",
          "cutlass_op_lists", "cutlass_ops")
BASE = dt.datetime(2026, 1, 2, 3, 4, 5, 678900, tzinfo=dt.timezone.utc)


def _rows_0001() -> dict[str, list[dict]]:
    fps = [
        {"id": 1, "fingerprint_key": "1" * 64, "system_hash": "a" * 64,
         "system_json": json.dumps({"device": {"name": "NVIDIA H100"}, "hash": "a" * 64}),
         "device_name": "NVIDIA H100", "triton_key": "t", "cuda_version": "12.8", "hip_version": None,
         "torch_version": "2.13.0", "torch_key": "k" * 64, "cpu_model": "Xeon", "isa": "AVX512",
         "created_at": BASE},
        {"id": 2, "fingerprint_key": "2" * 64, "system_hash": "b" * 64, "system_json": json.dumps({"hash": "b" * 64}),
         "device_name": None, "triton_key": None, "cuda_version": None, "hip_version": None, "torch_version": None,
         "torch_key": None, "cpu_model": None, "isa": None, "created_at": BASE},
    ]
    guarded = []
    for i in range(40):
        payload = (f"entry {i} ".encode() * (50 + 37 * i)) + bytes(range(i % 256)) * 3
        packed = pack(payload)
        kind = "fxgraph" if i % 3 else "aotautograd"
        guarded.append({
            "id": i + 1, "kind": kind, "key": ("f" if kind == "fxgraph" else "a") + sha256_hash(str(i // 2).encode()),
            "variant": sha256_hash(payload), "guards_expr": None if i % 4 == 0 else f"L['x'].size()[0] == {i}",
            "guards_known": i % 5 != 0, "guards_note": None if i % 5 else "no guards_expr field",
            "payload": packed.blob, "size_bytes": packed.size_bytes, "checksum": packed.checksum,
            "time_taken_ns": 10**6 * i if i % 6 else None,
            "created_at": BASE + dt.timedelta(minutes=i),
            "last_used_at": None if i % 2 == 0 else BASE + dt.timedelta(days=1, minutes=i),
            "hit_count": i, "fingerprint_id": (1, 2, None)[i % 3],
        })
    timings = [
        {"id": i + 1, "fingerprint_id": 1 + i % 2, "op": ("mm", "addmm", "bmm")[i % 3],
         "inputs": f"[('cuda', 'torch.float16', {64 << (i % 5)}, 64, 64)]", "hint_override": (None, 4096)[i % 2],
         "precision": ("high", "highest")[i % 2], "choice_hash": f"choice{i % 7}", "timing_ms": 0.125 + i / 64,
         "position": i, "recorded_at": BASE + dt.timedelta(seconds=i)}
        for i in range(60)
    ]
    values = [
        {"id": i + 1, "fingerprint_id": 1, "namespace": "pad_mm", "key_path": json.dumps(["pad_mm", f"k{i}"]),
         "value_json": json.dumps(i % 2 == 0), "position": 100 + i, "updated_at": BASE}
        for i in range(6)
    ]
    best = [
        {"id": i + 1, "key": f"c{i}/c{i}kernel.best_config",
         "content": json.dumps({"XBLOCK": 64 << i, "num_warps": 4, "num_stages": 1, "configs_hash": f"{i:064x}"}),
         "configs_hash": f"{i:064x}", "num_warps": 4, "num_stages": 1, "found_by_coordesc": bool(i % 2),
         "time_taken_ms": i * 10, "triton_cache_hash": None, "kernel_kwargs": json.dumps({"XBLOCK": 64 << i}),
         "fingerprint_id": (1, None)[i % 2], "created_at": BASE, "updated_at": BASE + dt.timedelta(hours=i)}
        for i in range(8)
    ]
    op_list = b'["{\\"tile\\": 1}"]'
    lists = [{"id": 1, "request_key": "b15d29dd", "arch": 90, "cuda_version": "12.8", "instantiation_level": "0",
              "op_count": 2, "payload": pack(op_list).blob, "size_bytes": len(op_list),
              "checksum": pack(op_list).checksum, "created_at": BASE}]
    ops = [{"id": j + 1, "op_list_id": 1, "position": j, "gemm_kind": "Universal3x", "arch": 90,
            "element_a": "f16", "element_b": "f16", "element_c": None, "element_d": "f16",
            "element_accumulator": "f32", "element_epilogue": "f32", "layout_a": "RowMajor", "layout_b": "ColumnMajor",
            "layout_c": None, "layout_d": "RowMajor", "alignment_a": 8, "alignment_b": 8, "alignment_c": None,
            "alignment_d": 8, "tile_shape": "128x128x64", "cluster_shape": "1x1x1", "stages": 4,
            "kernel_schedule": "KernelTmaWarpSpecialized", "epilogue_schedule": "TmaWarpSpecialized",
            "tile_scheduler": "Persistent", "epilogue_functor": None, "swizzling_functor": None} for j in range(2)]
    return {"system_fingerprints": fps, "guarded_entries": guarded, "autotune_timings": timings,
            "local_cache_values": values, "best_configs": best, "cutlass_op_lists": lists, "cutlass_ops": ops}


def _snapshot(engine, columns: dict[str, list[str]]) -> dict[str, list[dict]]:
    md = MetaData()
    md.reflect(engine, only=list(TABLES), views=True)  # autotune_timings: a view since 0004
    out = {}
    with engine.connect() as conn:
        for name in TABLES:
            t = md.tables[name]
            cols = [t.c[c] for c in columns[name]]
            out[name] = [dict(r._mapping) for r in conn.execute(select(*cols).order_by(t.c.id))]
    return out


def _make_rev_0001(location: str) -> tuple[dict[str, list[dict]], dict[str, list[str]]]:
    """An SQLite file or PostgreSQL schema at revision 0001 holding real rows."""
    engine = create_cachedb_engine(to_url(location))
    try:
        with engine.connect().execution_options(**{WRITE_OPTION: True}) as conn:
            with conn.begin():
                command.upgrade(_migrate.alembic_config(conn), "0001")
        with engine.connect() as conn:
            assert _migrate.current_revision(conn) == "0001"
        md = MetaData()
        md.reflect(engine, only=list(TABLES), views=True)  # autotune_timings: a view since 0004
        rows = _rows_0001()
        with engine.begin() as conn:
            for name in TABLES:
                conn.execute(insert(md.tables[name]), rows[name])
        columns = {name: [c.name for c in md.tables[name].columns] for name in TABLES}
        return _snapshot(engine, columns), columns
    finally:
        engine.dispose()


def _round(mp, location: str, mode: str, tmp: Path) -> list[dict]:
    tmp.mkdir()
    go = tmp / "go"
    procs = []
    for i in range(PROCESSES):
        p = mp.Process(target=_work.migration_worker,
                       args=(location, mode, str(go), str(tmp / f"ready{i}"), str(tmp / f"result{i}.json")))
        p.start()
        procs.append(p)
    deadline = time.monotonic() + 120
    while not all((tmp / f"ready{i}").exists() for i in range(PROCESSES)):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    go.touch()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return [json.loads((tmp / f"result{i}.json").read_text()) for i in range(PROCESSES)]


@pytest.mark.parametrize(
    "backend, modes",
    [("sqlite", ("open", "upgrade", "open")), ("postgresql", ("upgrade",))],
)
def test_eight_processes_open_an_old_database_at_once(mp, backend: str, modes: tuple, tmp_path: Path,
                                                      request) -> None:
    head = _migrate.head_revision()
    upgrades = waited = 0
    for r, mode in enumerate(modes):
        if backend == "sqlite":
            location = str(tmp_path / f"old{r}.db")
        else:
            location = request.getfixturevalue("pg_url") if r == 0 else _fresh_pg_schema(request)
        before, columns = _make_rev_0001(location)
        results = _round(mp, location, mode, tmp_path / f"round{r}")

        assert [res.get("error") for res in results] == [None] * PROCESSES, results
        assert {res["revision"] for res in results} == {head}
        assert sum(res["upgrade_logs"] for res in results) == 1, "exactly one process upgrades"
        if mode == "upgrade":
            assert sorted(res["upgraded"] for res in results) == [False] * (PROCESSES - 1) + [True]
        assert {res["guarded"] for res in results} == {len(before["guarded_entries"])}
        upgrades += 1
        waited += PROCESSES - 1

        engine = create_cachedb_engine(to_url(location))
        after = _snapshot(engine, columns)
        engine.dispose()
        for row in before["guarded_entries"]:
            if row["last_used_at"] is None:
                row["last_used_at"] = row["created_at"]  # the 0002 backfill
        assert after["guarded_entries"] == before["guarded_entries"]  # payload blobs byte-identical
        for name in TABLES:
            assert after[name] == before[name], name
    figures.add(f"migration_{backend}", rounds=len(modes), processes=PROCESSES * len(modes), upgrades=upgrades,
                waited_then_saw_head=waited, rows_checked=len(modes) * sum(len(v) for v in _rows_0001().values()))


def _fresh_pg_schema(request) -> str:
    """A second PostgreSQL schema for a second round (the pg_url fixture gives one per test)."""
    import uuid

    from sqlalchemy import create_engine, text

    from ..conftest import PG_URL

    schema = f"cachedb_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    request.addfinalizer(drop)
    return f"{PG_URL}?options=-csearch_path%3D{schema}"


def test_eight_processes_create_a_new_database_at_once(mp, tmp_path: Path) -> None:
    """The same race from nothing: the file does not exist yet when the 8 processes open it."""
    location = str(tmp_path / "new.db")
    results = _round(mp, location, "open", tmp_path / "round")
    assert [res.get("error") for res in results] == [None] * PROCESSES, results
    assert {res["revision"] for res in results} == {_migrate.head_revision()}
    assert sum(res["upgrade_logs"] for res in results) == 1, "exactly one process creates the schema"
    figures.add("migration_sqlite", rounds=1, processes=PROCESSES, upgrades=1, waited_then_saw_head=PROCESSES - 1)
