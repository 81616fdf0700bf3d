"""What each hit is worth: the view ``entry_value`` and docs/schema.md's queries over it, and
``cachedb prune --order value``, on SQLite and PostgreSQL, with real rows written through the
repositories."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import bindparam, text

from cachedb import CacheDB
from cachedb.cli import main
from cachedb.keys.factors import Factor
from cachedb.repositories.guarded import eviction_value
from cachedb.tools import prune as pruning
from cachedb.tools.stats import collect

ROOT = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.timezone.utc)


def put(db: CacheDB, kind: str, key: str, nbytes: int, compile_s: float | None, hits: int,
        used: dt.datetime = NOW) -> None:
    """One variant of ``nbytes`` incompressible bytes, compiled in ``compile_s`` seconds
    (``None``: torch recorded none), hit ``hits`` times, last used at ``used``."""
    payload = random.Random(key).randbytes(nbytes)
    with db.transaction() as repos:
        variant, _ = repos.guarded.put(kind, key, payload, guards_expr=None,
                                       time_taken_ns=None if compile_s is None else int(compile_s * 1e9))
        repos.guarded.record_hits({(kind, key, variant): (hits, used)})


def _documented_queries() -> list[str]:
    doc = (ROOT / "docs" / "schema.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc.split("## Queries", 1)[1], re.S)
    return [q for q in queries if "entry_value" in q]


def test_entry_value_and_its_documented_queries(db: CacheDB) -> None:
    """Per variant: compile seconds, hits, seconds saved = compile seconds × hits (0 where
    torch recorded no compile time), bytes; per kind the sum is ``cachedb stats``' figure."""
    put(db, "fxgraph", "fpointwise", 40_000, 0.5, 10)
    put(db, "fxgraph", "fautotuned", 200_000, 90.0, 2)
    put(db, "fxgraph", "fimported", 1_000, None, 7)
    put(db, "aotautograd", "aforward", 10_000, 3.0, 1)
    per_kind, top = _documented_queries()
    with db.engine.connect() as conn:
        kinds = [dict(r) for r in conn.execute(text(per_kind)).mappings()]
        best = [dict(r) for r in conn.execute(text(top)).mappings()]
    assert [(r["kind"], r["entries"], r["hits"], r["seconds_saved"]) for r in kinds] == [
        ("aotautograd", 1, 1, 3.0), ("fxgraph", 3, 19, 185.0)]
    assert all(r["stored_bytes"] > 0 for r in kinds)
    assert [(r["key"], r["compile_seconds"], r["hits"], r["seconds_saved"]) for r in best] == [
        ("fautotuned", 90.0, 2, 180.0), ("fpointwise", 0.5, 10, 5.0), ("aforward", 3.0, 1, 3.0),
        ("fimported", None, 7, 0.0)]
    assert best[0]["seconds_saved_per_mib"] == pytest.approx(180.0 * 1048576 / best[0]["stored_bytes"])
    with db.read() as repos:
        stats = {r["kind"]: r["seconds_saved"] for r in collect(repos.session)}
    assert (stats["fxgraph"], stats["aotautograd"]) == (185.0, 3.0)


# --------------------------------------------------------------------------- prune --order value

DAY = dt.timedelta(days=1)


def cli(*args: str):
    result = CliRunner().invoke(main, list(args), env={"CACHEDB_URL": None, "CACHEDB_PATH": None, "COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def held(db: CacheDB) -> dict[str, tuple]:
    """``{key: (hits, factors stored)}`` of every variant, and the quarantine's keys."""
    with db.engine.connect() as conn:
        rows = {key: (hits,) for key, hits in conn.execute(text("SELECT key, hit_count FROM guarded_entries"))}
        factors = {key for (key,) in conn.execute(text("SELECT key FROM entry_factors"))}
        quarantined = sorted(k for (k,) in conn.execute(text("SELECT key FROM quarantined_entries")))
    return {**{k: (*v, k in factors) for k, v in rows.items()}, "quarantine": tuple(quarantined)}


def two_entries(db: CacheDB) -> int:
    """A max-autotune graph (90 s to compile, 200 KB) last used 3 days ago and a pointwise
    graph (0.3 s, 100 KB) used now, hit 3 times each and with their key factors, and a third
    entry quarantined; returns a byte bound that holds one of the two."""
    now = dt.datetime.now(dt.timezone.utc)
    put(db, "fxgraph", "fautotuned", 200_000, 90.0, 3, now - 3 * DAY)
    put(db, "fxgraph", "fpointwise", 100_000, 0.3, 3, now)
    put(db, "fxgraph", "fcorrupt", 1_000, 1.0, 0, now)
    with db.transaction() as repos:
        for key in ("fautotuned", "fpointwise"):
            repos.key_factors.put("fxgraph", key, [Factor("gm", key[:16], key), Factor("torch_version", "t" * 16, "2.13")])
        (variant,) = repos.guarded.variant_names("fxgraph", "fcorrupt")
        assert repos.guarded.quarantine("fxgraph", "fcorrupt", variant, "checksum mismatch")
        return repos.guarded.stored_total() - 50_000


@pytest.mark.parametrize(("order", "kept"), [("value", "fautotuned"), ("lru", "fpointwise"), (None, "fpointwise")])
def test_value_order_keeps_the_expensive_entry_that_lru_evicts(db: CacheDB, order: str | None, kept: str) -> None:
    """On SQLite and PostgreSQL, through ``cachedb prune``: under the same bound LRU (the
    default) evicts the max-autotune graph, used longest ago, and ``--order value`` the
    pointwise graph, cheap to compile again; either way the evicted key's factors go with it,
    the kept one's stay, and the quarantine is left as it was."""
    bound = str(two_entries(db))
    assert held(db) == {"fautotuned": (3, True), "fpointwise": (3, True), "quarantine": ("fcorrupt",)}
    args = ["--db", db.where, "prune", "--max-bytes", bound, "--yes"] + (["--order", order] if order else [])
    done = cli(*args)
    assert done.exit_code == 0 and "removed 1 entries" in done.stdout, done.output
    assert held(db) == {kept: (3, True), "quarantine": ("fcorrupt",)}


def test_value_order_dry_run_changes_nothing(db: CacheDB) -> None:
    """``--dry-run --order value`` prints the plan the run then carries out, and leaves every
    row as it was."""
    bound = str(two_entries(db))
    before = held(db)
    dry = cli("--db", db.where, "prune", "--max-bytes", bound, "--order", "value", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would remove 1 of 2 entries" in dry.stdout and "nothing was changed (--dry-run)" in dry.stdout
    assert held(db) == before
    with db.read() as repos:
        plan = pruning.plan(repos, max_bytes=int(bound), order="value")
        (victim,) = plan.guarded.ids
        assert repos.session.execute(text("SELECT key FROM guarded_entries WHERE id = :i"), {"i": victim}).scalar_one() \
            == "fpointwise"


def test_an_unknown_order_is_refused_in_one_line(db: CacheDB) -> None:
    two_entries(db)
    before = held(db)
    result = cli("--db", db.where, "prune", "--max-bytes", "1K", "--order", "cost")
    assert result.exit_code == 2
    assert result.stderr == "error: Invalid value for '--order': 'cost' is not one of 'lru', 'value'.\n"
    assert held(db) == before
    with db.read() as repos, pytest.raises(ValueError, match="order must be one of lru, value"):
        pruning.plan(repos, max_bytes=0, order="cost")


def test_eviction_value_formula() -> None:
    """compile_s × (hits + 1) × 2^(-age / half-life) / stored bytes: a variant not hit yet is
    worth its compile time; hits halve every half-life since the last use; an unknown compile
    time is worth 0."""
    assert eviction_value(2_000_000_000, 0, 1_000, dt.timedelta(0)) == pytest.approx(2.0 / 1_000)
    assert eviction_value(2_000_000_000, 3, 1_000, 7 * DAY) == pytest.approx(2.0 * 4 * 0.5 / 1_000)
    assert eviction_value(2_000_000_000, 3, 1_000, 14 * DAY, half_life=14 * DAY) == pytest.approx(4.0 / 1_000)
    assert eviction_value(2_000_000_000, 3, 1_000, -DAY) == eviction_value(2_000_000_000, 3, 1_000, dt.timedelta(0))
    assert eviction_value(None, 100, 1_000, dt.timedelta(0)) == 0.0
    with pytest.raises(ValueError, match="half_life must be positive"):
        eviction_value(1, 1, 1, DAY, half_life=dt.timedelta(0))


def test_old_hits_fade_and_the_plan_is_what_apply_deletes(db: CacheDB) -> None:
    """Two graphs of the same cost and size: one hit 40 times but last used 8 weeks ago, one hit
    4 times today. At a 7-day half-life the old hits count 40 × 2^-8 < 5: the old one goes; at
    a 60-day half-life it stays. The plan counts what :func:`pruning.apply` deletes."""
    now = dt.datetime.now(dt.timezone.utc)
    put(db, "fxgraph", "fstale", 50_000, 10.0, 40, now - 56 * DAY)
    put(db, "fxgraph", "frecent", 50_000, 10.0, 4, now)
    put(db, "aotautograd", "aunknown", 50_000, None, 1_000, now)  # no compile time: goes first
    with db.read() as repos:
        bound = repos.guarded.stored_total() - 60_000

    def victims(**kwargs: object) -> list[str]:
        with db.read() as repos:
            plan = pruning.plan(repos, max_bytes=bound, order="value", now=now, **kwargs)  # type: ignore[arg-type]
            keys = text("SELECT key FROM guarded_entries WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))
            return sorted(repos.session.execute(keys, {"ids": plan.guarded.ids}).scalars())

    assert victims() == ["aunknown", "fstale"]
    assert victims(half_life=60 * DAY) == ["aunknown", "frecent"]
    with db.read() as repos:
        plan = pruning.plan(repos, max_bytes=bound, order="value")
    with db.transaction() as repos:
        done = pruning.apply(repos, plan)
    assert (done.entries, done.entry_bytes) == (plan.entries, plan.bytes) == (2, plan.guarded.stored_bytes["fxgraph"]
                                                                              + plan.guarded.stored_bytes["aotautograd"])
    assert held(db) == {"frecent": (4, False), "quarantine": ()}


# --------------------------------------------------------------------------- stats --format prometheus


def test_stats_prometheus_parses_and_counts_per_kind_and_fingerprint(db: CacheDB) -> None:
    """On SQLite and PostgreSQL, real rows of each counted kind (FX graph and AOTAutograd
    variants under a fingerprint whose device name needs escaping, a kernel key directory, a PGO
    profile, a compile avoided, FX graph misses of two outcomes and a timings miss): ``prometheus_client``'s parser reads
    every family as a gauge with the figures ``cachedb stats --format json`` gives."""
    parser = pytest.importorskip("prometheus_client.parser")
    from cachedb.fingerprint import Fingerprint

    now = dt.datetime.now(dt.timezone.utc)
    with db.transaction() as repos:
        fp = repos.fingerprints.ensure(Fingerprint(system={"hash": "f" * 64, "device": {"name": 'GPU "A"\\B\nC'}}))
        v, _ = repos.guarded.put("fxgraph", "fk", b"f" * 3_000, guards_expr=None, time_taken_ns=1_500_000_000,
                                 fingerprint_id=fp)
        repos.guarded.record_hits({("fxgraph", "fk", v): (4, now)})
        a, _ = repos.guarded.put("aotautograd", "ak", b"a" * 1_000, guards_expr=None, time_taken_ns=500_000_000)
        repos.guarded.record_hits({("aotautograd", "ak", a): (2, now)})
        repos.artifacts.put_files("triton", "tk", [("k.cubin", b"c" * 500), ("k.json", b"{}")])
        repos.artifacts.record_hits({("triton", "", "tk"): (3, now)})
        repos.dynamo("pgo").put("code_state_f.pkl", b"p" * 200)
        repos.compile_waits.add("fxgraph", "fk", seconds=2.0, outcome="landed", waited_on="host:1:x")
        for key, outcome in (("m1", "no_entry"), ("m2", "no_entry"), ("m3", "guards_failed")):
            repos.misses.add("fxgraph", key, outcome, [Factor("gm", "g" * 16, "x")])
        repos.misses.add("timings", "mm:t1", "new_choices", [Factor("op", "o" * 16, "mm")])
        repos.misses.add("cpp", "ck", "no_entry", [Factor("source", "s" * 16, "ck")])
    exposed = cli("--db", db.where, "stats", "--format", "prometheus")
    assert exposed.exit_code == 0, exposed.output
    assert all(line.startswith(("# HELP cachedb_", "# TYPE cachedb_", "cachedb_")) for line in exposed.stdout.splitlines())
    families = {f.name: f for f in parser.text_string_to_metric_families(exposed.stdout)}
    assert set(families) == {"cachedb_entries", "cachedb_bytes", "cachedb_stored_bytes", "cachedb_hits",
                             "cachedb_seconds_saved", "cachedb_compiles_avoided", "cachedb_misses"}
    assert all(f.type == "gauge" and f.documentation for f in families.values())

    def samples(name: str) -> dict[tuple[str, ...], float]:
        return {tuple(s.labels.values()): s.value for s in families[name].samples}

    rows = json.loads(cli("--db", db.where, "stats", "--format", "json").stdout)
    by_kind = {r["kind"]: r for r in rows}
    label = by_kind["fxgraph"]["fingerprint"]
    assert '"A"\\B\nC' in label  # the device name as stored, read back through the escapes
    hits = samples("cachedb_hits")
    assert {k: hits[k] for k in [("fxgraph", label), ("aotautograd", ""), ("triton_kernel", ""), ("pgo_profile", "")]} \
        == {("fxgraph", label): 4, ("aotautograd", ""): 2, ("triton_kernel", ""): 3, ("pgo_profile", ""): 0}
    assert samples("cachedb_seconds_saved")[("fxgraph", label)] == 6.0
    assert samples("cachedb_seconds_saved")[("aotautograd", "")] == 1.0
    for name, column in (("cachedb_entries", "entries"), ("cachedb_bytes", "bytes"),
                         ("cachedb_stored_bytes", "stored_bytes")):
        assert samples(name) == {(r["kind"], "" if r["fingerprint"] == "-" else r["fingerprint"]): r[column]
                                 for r in rows if r["kind"] != "total" and not r["kind"].startswith("compiles_")}
    assert samples("cachedb_entries")[("triton_kernel", "")] == 1
    assert samples("cachedb_compiles_avoided") == {("fxgraph",): 1}
    assert samples("cachedb_misses") == {("fxgraph", "no_entry"): 2, ("fxgraph", "guards_failed"): 1,
                                         ("fxgraph", "bypass"): 0, ("timings", "no_entry"): 0,
                                         ("timings", "new_choices"): 1, ("cpp", "no_entry"): 1}
    # the total sums every stored kind's rows (the Triton key's 3 hits too)
    assert (by_kind["total"]["hits"], by_kind["total"]["seconds_saved"]) == (9, 7.0)
    stored = [r for r in rows if r["kind"] != "total" and not r["kind"].startswith("compiles_")]
    assert [by_kind["total"][c] for c in ("entries", "bytes", "stored_bytes")] == [
        sum(r[c] for r in stored) for c in ("entries", "bytes", "stored_bytes")]


def test_stats_prometheus_of_an_empty_database(db: CacheDB) -> None:
    """No rows: the families are declared, the miss counts are 0, and it still parses."""
    parser = pytest.importorskip("prometheus_client.parser")
    exposed = cli("--db", db.where, "stats", "--format", "prometheus")
    assert exposed.exit_code == 0, exposed.output
    families = {f.name: [s.value for s in f.samples] for f in parser.text_string_to_metric_families(exposed.stdout)}
    assert families["cachedb_entries"] == [] and families["cachedb_misses"] == [0, 0, 0]
