"""Repositories on SQLite and PostgreSQL: the same behaviour on both backends."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import Connection, text, update

from cachedb import CacheDB, CorruptPayloadError
from cachedb.formats.cutlass_ops import CutlassOpRow
from cachedb.fingerprint import Fingerprint
from cachedb.keys import sha256_hash
from cachedb.store.models import GuardedEntry

CPU_SYSTEM = {"hash": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}
GPU_SYSTEM = {
    "device": {"name": "NVIDIA H100 80GB HBM3"},
    "version": {"triton": "3.5.0-abc", "cuda": "12.8"},
    "hash": "2b00ebb9" + "0" * 56,
}
INPUTS = "[('cpu', 'torch.float32', 64, 32, 32, 1, 0), ('cpu', 'torch.float32', 32, 16, 16, 1, 0)]"


def test_fingerprints_are_deduplicated_by_natural_key(db: CacheDB) -> None:
    a = Fingerprint(system=CPU_SYSTEM, torch_version="2.13.0+cpu", cpu_model="Xeon A", isa="AVX512")
    b = Fingerprint(system=CPU_SYSTEM, torch_version="2.13.0+cpu", cpu_model="EPYC B", isa="AVX2")
    with db.transaction() as repos:
        ids = [repos.fingerprints.ensure(fp) for fp in (a, b, a, Fingerprint(system=GPU_SYSTEM))]
    assert ids[0] == ids[2] and len(set(ids)) == 3
    with db.read() as repos:
        assert repos.fingerprints.get(ids[1]) == b
        assert sorted(repos.fingerprints.ids_for_system_hash(CPU_SYSTEM["hash"])) == sorted(ids[:2])
        assert repos.fingerprints.get(ids[3]).device_name == "NVIDIA H100 80GB HBM3"


def test_guarded_entries_keep_every_variant(db: CacheDB) -> None:
    payloads = [b"variant-one" * 1000, b"variant-two" * 1000, b"\x00\xff" * 50_000]
    with db.transaction() as repos:
        results = [
            repos.guarded.put("fxgraph", "fkey", p, guards_expr=f"{i} <= L['t0']", time_taken_ns=i)
            for i, p in enumerate(payloads)
        ]
        again = repos.guarded.put("fxgraph", "fkey", payloads[0], guards_expr="ignored")
        repos.guarded.put("aotautograd", "akey", payloads[0], guards_expr=None)
    assert [variant for variant, _ in results] == [sha256_hash(p) for p in payloads]
    assert all(added for _, added in results) and again == (sha256_hash(payloads[0]), False)
    with db.read() as repos:
        found = repos.guarded.candidates("fxgraph", "fkey")
        assert [v for v, _ in found] == sorted(sha256_hash(p) for p in payloads)
        assert {p for _, p in found} == set(payloads)
        assert repos.guarded.candidates("fxgraph", "missing") == []
        assert repos.guarded.count("fxgraph") == 3 and repos.guarded.count() == 4
        guards = {e.variant: e.guards_expr for e in repos.guarded.iter_all("fxgraph")}
    assert guards[sha256_hash(payloads[1])] == "1 <= L['t0']"


def test_corrupt_payload_is_never_returned(db: CacheDB) -> None:
    with db.transaction() as repos:
        variant, _ = repos.guarded.put("fxgraph", "fkey", b"good bytes" * 100, guards_expr=None)
    with db.engine.begin() as conn:
        conn.execute(update(GuardedEntry).values(checksum="0" * 64))
    with db.read() as repos, pytest.raises(CorruptPayloadError) as info:
        repos.guarded.candidates("fxgraph", "fkey")
    assert variant in str(info.value)


def test_failed_transaction_stores_nothing(db: CacheDB) -> None:
    with pytest.raises(RuntimeError), db.transaction() as repos:
        repos.guarded.put("fxgraph", "fkey", b"payload", guards_expr=None)
        raise RuntimeError("boom")
    with db.read() as repos:
        assert repos.guarded.count() == 0


def test_timings_keep_history_and_lookups_see_the_latest(db: CacheDB) -> None:
    with db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system=CPU_SYSTEM, torch_version="2.13.0+cpu"))
        repos.timings.record(fp, "addmm", INPUTS, "highest", {"aten": 0.5, "cpp": 0.25})
    with db.transaction() as repos:
        repos.timings.record(fp, "addmm", INPUTS, "highest", {"aten": 0.125, "cpp": 0.25})
        repos.timings.record(fp, "addmm", INPUTS, "highest", {"aten": 9.0}, hint_override=64)
    with db.read() as repos:
        assert repos.timings.lookup([fp], "addmm", INPUTS, "highest") == {"aten": 0.125, "cpp": 0.25}
        assert repos.timings.lookup([fp], "addmm", INPUTS, "highest", hint_override=64) == {"aten": 9.0}
        assert repos.timings.lookup([fp], "addmm", INPUTS, "high") == {}
        rows = repos.session.execute(
            text("SELECT op, choice_hash, timing_ms, candidates FROM autotune_winners")
        ).all()
        history = repos.session.execute(
            text("SELECT count(*) FROM autotune_history WHERE choice_hash = 'aten'")
        ).scalar_one()
    assert sorted(tuple(r) for r in rows) == [("addmm", "aten", 0.125, 2), ("addmm", "aten", 9.0, 1)]
    assert history == 3


def test_timings_lookup_over_every_fingerprint_of_a_system_hash(db: CacheDB) -> None:
    """Two fingerprints under one system hash (two hosts of a fleet): a lookup over both ids
    sees the latest timing of each choice on either, one over a single id only its own."""
    with db.transaction() as repos:
        a = repos.fingerprints.ensure(Fingerprint(system=CPU_SYSTEM, torch_version="2.13.0+cpu", cpu_model="A"))
        b = repos.fingerprints.ensure(Fingerprint(system=CPU_SYSTEM, torch_version="2.13.0+cpu", cpu_model="B"))
        repos.timings.record(a, "addmm", INPUTS, "highest", {"aten": 0.5, "cpp": 0.25})
        repos.timings.record(a, "addmm", INPUTS, "highest", {"aten": 7.0}, hint_override=32)
    with db.transaction() as repos:
        repos.timings.record(b, "addmm", INPUTS, "highest", {"aten": 0.125, "triton": 0.375})
        repos.timings.record(b, "addmm", INPUTS, "highest", {"aten": 9.0}, hint_override=32)
    with db.read() as repos:
        ids = repos.fingerprints.ids_for_system_hash(CPU_SYSTEM["hash"])
        assert ids == [a, b]
        assert repos.timings.lookup(ids, "addmm", INPUTS, "highest") == {"aten": 0.125, "cpp": 0.25, "triton": 0.375}
        assert repos.timings.lookup(ids, "addmm", INPUTS, "highest", hint_override=32) == {"aten": 9.0}
        assert repos.timings.lookup([a], "addmm", INPUTS, "highest") == {"aten": 0.5, "cpp": 0.25}
        assert repos.timings.lookup([a], "addmm", INPUTS, "highest", hint_override=32) == {"aten": 7.0}
        assert repos.timings.lookup(iter([b]), "addmm", INPUTS, "highest") == {"aten": 0.125, "triton": 0.375}
        assert repos.timings.lookup([], "addmm", INPUTS, "highest") == {}
        assert repos.fingerprints.ids_for_system_hash("0" * 64) == []


def test_local_cache_values(db: CacheDB) -> None:
    from cachedb.formats.local_cache_doc import ValueLeaf

    with db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system=CPU_SYSTEM))
        leaves = [ValueLeaf(("pad_mm", "key1"), True, 0), ValueLeaf(("estimate",), {"a": [1, 2.5]}, 1)]
        assert repos.local_values.add_leaves(fp, leaves) == 2
        assert repos.local_values.add_leaves(fp, leaves) == 0
        assert repos.local_values.add_leaves(fp, [ValueLeaf(("pad_mm", "key1"), False, 5)]) == 1
    with db.read() as repos:
        assert repos.local_values.get([fp], ("pad_mm", "key1")) is False
        assert repos.local_values.get([fp], ("estimate",)) == {"a": [1, 2.5]}
        assert repos.local_values.get([fp], ("nothing",)) is None
        positions = {leaf.key_path: leaf.position for leaf in repos.local_values.current_leaves([fp])}
    assert positions == {("pad_mm", "key1"): 0, ("estimate",): 1}


def test_best_configs(db: CacheDB) -> None:
    content = json.dumps(
        {"XBLOCK": 512, "num_warps": 2, "num_stages": 1, "configs_hash": "3ca5c3e3",
         "found_by_coordesc": True, "time_taken_ms": 1497, "triton_cache_hash": None}
    )
    key = "ab/abcdef.best_config"
    with db.transaction() as repos:
        assert repos.best_configs.put(key, content) is True
        assert repos.best_configs.put(key, content) is False
    with db.read() as repos:
        assert repos.best_configs.get(key) == content
        assert repos.best_configs.get("zz/none.best_config") is None
        row = repos.session.execute(
            text("SELECT configs_hash, num_warps, num_stages, found_by_coordesc, time_taken_ms, "
                 "kernel_kwargs FROM best_configs")
        ).one()
    assert tuple(row[:5]) == ("3ca5c3e3", 2, 1, True, 1497)
    assert json.loads(row[5]) == {"XBLOCK": 512}


def test_cutlass_op_lists(db: CacheDB) -> None:
    data = b'["{}", "{}"]'
    rows = [
        CutlassOpRow(position=i, gemm_kind="Universal3x", arch=90, element_a="f16", element_b="f16",
                     element_c="f16", element_d="f16", element_accumulator="f32", element_epilogue="f32",
                     layout_a="RowMajor", layout_b="ColumnMajor", layout_c="RowMajor", layout_d="RowMajor",
                     alignment_a=8, alignment_b=8, alignment_c=8, alignment_d=8, tile_shape="128x256x64",
                     cluster_shape="1x2x1", stages=0, kernel_schedule="TmaWarpSpecializedCooperative",
                     epilogue_schedule="TmaWarpSpecializedCooperative", tile_scheduler="Persistent",
                     epilogue_functor="LinearCombination", swizzling_functor="Identity1")
        for i in range(2)
    ]
    with db.transaction() as repos:
        assert repos.cutlass.put("b15d29dd", data, rows, arch=90, cuda_version="12.8", instantiation_level="0")
        assert not repos.cutlass.put("b15d29dd", data, rows, arch=90)
    with db.read() as repos:
        assert repos.cutlass.get("b15d29dd") == data
        assert repos.cutlass.get("00000000") is None
        n = repos.session.execute(text("SELECT count(*) FROM cutlass_ops WHERE tile_shape = '128x256x64'")).scalar()
    assert n == 2
    with db.transaction() as repos:
        assert repos.cutlass.put("b15d29dd", b"[]", [], arch=90)
    with db.read() as repos:
        assert repos.session.execute(text("SELECT count(*) FROM cutlass_ops")).scalar() == 0
        assert repos.cutlass.get("b15d29dd") == b"[]"


def test_read_is_one_snapshot_and_ends_with_its_block(sqlite_db: CacheDB) -> None:
    """``CacheDB.read()`` on the kept connection (SQLite: the driver's own BEGIN, point reads
    on the driver): every statement of the block, the repositories' and the ORM Session's,
    reads the snapshot its first read took, although another connection commits meanwhile;
    the block leaves no transaction open, and the next block reads the new row."""
    from sqlalchemy import select

    from cachedb.store.models import BestConfig

    key = "ab/snap.best_config"
    with sqlite_db.transaction() as repos:
        repos.best_configs.put(key, '{"num_warps": 1}')
    with sqlite_db.read() as repos:
        assert repos.best_configs.get(key) == '{"num_warps": 1}'
        with sqlite_db.transaction() as other:  # a pooled connection: the reader is the kept one
            assert other.best_configs.put(key, '{"num_warps": 2}') is True
        assert repos.best_configs.get(key) == '{"num_warps": 1}'
        assert repos.session.scalars(select(BestConfig.content).where(BestConfig.key == key)).one() == '{"num_warps": 1}'
        assert repos.best_configs.get(key) == '{"num_warps": 1}'
    assert sqlite_db.kept._dbapi is not None and not sqlite_db.kept._dbapi.in_transaction
    with sqlite_db.read() as repos:
        assert repos.best_configs.get(key) == '{"num_warps": 2}'
    with sqlite_db.lookup() as repos:
        assert repos.best_configs.get(key) == '{"num_warps": 2}'
    assert not sqlite_db.kept._dbapi.in_transaction


def test_session_savepoints_hold_repository_writes(db: CacheDB) -> None:
    """In ``CacheDB.transaction()`` the repositories run on the block's connection, and
    ``repos.session`` (made on first use) shares it: a savepoint begun through the Session
    holds the repositories' writes (rolled back with it), and what the caller added to the
    Session is flushed before a repository reads."""
    from cachedb.store.models import BestConfig
    from cachedb.store.tables import utcnow

    with db.transaction() as repos:
        configs = repos.best_configs  # taken before the Session exists: runs on the connection
        assert configs.put("ab/kept.best_config", '{"num_warps": 4}') is True
        with pytest.raises(RuntimeError):
            with repos.session.begin_nested():
                assert configs.put("ab/undone.best_config", '{"num_warps": 8}') is True
                assert configs.get("ab/undone.best_config") == '{"num_warps": 8}'
                raise RuntimeError("roll the savepoint back")
        now = utcnow()
        repos.session.add(BestConfig(key="ab/orm.best_config", content='{"num_warps": 2}', created_at=now,
                                     updated_at=now))
        assert repos.best_configs.get("ab/orm.best_config") == '{"num_warps": 2}'
    with db.read() as repos:
        assert repos.best_configs.get("ab/kept.best_config") == '{"num_warps": 4}'
        assert repos.best_configs.get("ab/undone.best_config") is None
        assert repos.best_configs.get("ab/orm.best_config") == '{"num_warps": 2}'


@pytest.mark.parametrize("with_session", [False, True])
def test_repos_savepoint_undoes_only_its_block(db: CacheDB, with_session: bool) -> None:
    """``Repos.savepoint()``: a ``SAVEPOINT`` on the block's connection (what the importer's
    batches use, no ORM), or on the ORM ``Session`` once one was made. An error inside undoes
    the savepoint's writes alone, the rest of the transaction commits, and a block that ends
    normally keeps its writes."""
    with db.transaction() as repos:
        if with_session:
            session = repos.session  # made now: the repositories and the savepoint go through it
            assert repos.bind is session
        else:
            assert isinstance(repos.bind, Connection)
        assert repos.best_configs.put("aa/kept.best_config", '{"num_warps": 1}') is True
        with pytest.raises(RuntimeError):
            with repos.savepoint():
                assert repos.best_configs.put("bb/undone.best_config", '{"num_warps": 2}') is True
                raise RuntimeError("roll the savepoint back")
        with repos.savepoint():
            assert repos.best_configs.put("cc/released.best_config", '{"num_warps": 4}') is True
        assert repos.best_configs.get("bb/undone.best_config") is None
    with db.read() as repos:
        assert repos.best_configs.get("aa/kept.best_config") == '{"num_warps": 1}'
        assert repos.best_configs.get("bb/undone.best_config") is None
        assert repos.best_configs.get("cc/released.best_config") == '{"num_warps": 4}'
