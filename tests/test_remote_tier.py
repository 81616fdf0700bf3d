"""The remote tier: each machine's SQLite file in front of one shared PostgreSQL.

"Machine A" and "machine B" are two cache dirs and two local SQLite files sharing one remote
schema on the PostgreSQL server of this machine (a fresh schema per test, dropped after).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from cachedb import CacheDB

from cachedb.store import migrate as _migrate
from cachedb.fingerprint import current as current_fingerprint
from cachedb.live import _artifacts
from cachedb.live._remote import RemoteTier
from cachedb.live._store import LiveStore

from ._realcache import seeded
from .conftest import PG_URL


@pytest.fixture(autouse=True)
def _remote_rows_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests exercise the tier's transport: every remote row is taken
    (``CACHEDB_REMOTE_TRUST=1``); what trust refuses is tests/test_fleet_trust.py's."""
    monkeypatch.setenv("CACHEDB_REMOTE_TRUST", "1")


ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "examples" / "build_cache.py"
#: A PostgreSQL URL nothing listens on (port 1 refuses at once).
DEAD_URL = "postgresql+psycopg://postgres@127.0.0.1:1/test"


def _counts(location: str) -> dict[str, int]:
    db = CacheDB(location, upgrade=False)
    try:
        with db.engine.connect() as conn:
            return {
                t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                for t in ("guarded_entries", "autotune_timings", "best_configs", "kernel_artifacts",
                          "kernel_blobs", "local_cache_values", "system_fingerprints", "autotune_choices")
            }
    finally:
        db.close()


def _rows_of(location: str, sql: str) -> list[tuple]:
    db = CacheDB(location, upgrade=False)
    try:
        with db.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        db.close()


# -- the real thing: torch.compile on two machines -------------------------------------------


def _run_machine(db: Path, cache_dir: Path, remote: str, *extra: str,
                 keys: dict[str, str] | None = None) -> tuple[dict, str]:
    """``cachedb --db DB run --remote URL -- python examples/build_cache.py CACHE_DIR --json``
    (``keys``: the ``CACHEDB_*`` trust variables it runs with; no others are passed on). The
    cache dir starts with torch's ISA probes (``seeded``): what is checked is what the tiers
    serve, not an empty directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEDB_")}
    env.update(keys or {})
    env["TORCHINDUCTOR_CACHE_DIR"] = seeded(cache_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "cachedb", "--db", str(db), "run", "--remote", remote, *extra, "--",
         sys.executable, str(BUILDER), str(cache_dir), "--json"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_machine_b_starts_warm_from_what_machine_a_compiled(tmp_path: Path, pg_url: str) -> None:
    """A fleet as documented: the schema made by its owner, roles from ``cachedb fleet
    grant``; A logs in with the writer role and signs what it sends (CACHEDB_SIGNING_KEY), B
    logs in with the read-only role and holds only A's public key."""
    from sqlalchemy.engine import make_url

    tag = uuid.uuid4().hex[:8]
    roles = [f"cdb_a_{tag}", f"cdb_b_{tag}", f"cdb_w_{tag}", f"cdb_r_{tag}"]
    owner = [sys.executable, "-m", "cachedb", "--db", pg_url]
    subprocess.run([*owner, "init"], check=True, capture_output=True)
    subprocess.run([*owner, "fleet", "grant", "--writer", roles[0], "--reader", roles[1], "--writer-role", roles[2],
                    "--reader-role", roles[3]], check=True, capture_output=True)
    try:
        _machines_a_and_b(tmp_path, pg_url, *(make_url(pg_url).set(username=r).render_as_string(False)
                                              for r in roles[:2]))
    finally:
        engine = create_engine(pg_url)
        with engine.begin() as conn:
            for role in roles:
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))
        engine.dispose()


def _machines_a_and_b(tmp_path: Path, pg_url: str, writer_url: str, reader_url: str) -> None:
    from cachedb.store.signing import SigningKey

    key = SigningKey.generate()
    (tmp_path / "a.pem").write_text(key.private_pem())
    writer = {"CACHEDB_SIGNING_KEY": str(tmp_path / "a.pem")}
    consumer = {"CACHEDB_TRUSTED_KEYS": key.public_line()}
    a, _ = _run_machine(tmp_path / "a.db", tmp_path / "a", writer_url, keys=writer)
    assert a["counters"]["fxgraph_cache_miss"] == 5 and a["counters"]["autograd_cache_miss"] == 4
    remote = _counts(pg_url)
    local_a = _counts(str(tmp_path / "a.db"))
    # A's exit flushed everything it wrote to the remote
    for table in ("guarded_entries", "autotune_timings", "best_configs", "kernel_artifacts", "autotune_choices"):
        assert remote[table] == local_a[table] > 0, table
    # the choices' descriptions went with their timings, signed as they are
    described = _rows_of(pg_url, "SELECT name, backend, ed25519_signature FROM autotune_choices")
    assert all(name and backend and signature for name, backend, signature in described), described

    b, _ = _run_machine(tmp_path / "b.db", tmp_path / "b", reader_url, keys=consumer)
    c = b["counters"]
    assert c["fxgraph_cache_hit"] == 5 and c.get("fxgraph_cache_miss", 0) == 0
    assert c["autograd_cache_hit"] == 4 and c.get("autograd_cache_miss", 0) == 0
    assert "select_algorithm_autotune" not in c, "timings must come from the remote"
    assert not any(k.startswith("benchmarking.") for k in c)
    assert b["workloads"]["best_config"]["read_before_save"] == {"kwargs": {"XBLOCK": 512}, "num_warps": 2}
    local_b = _counts(str(tmp_path / "b.db"))
    for table in ("guarded_entries", "autotune_timings", "best_configs", "autotune_choices"):
        assert local_b[table] == remote[table], table
    # B took them under A's key, and every timing it serves names its choice
    origins = _rows_of(str(tmp_path / "b.db"), "SELECT DISTINCT origin FROM row_origins "
                                               "WHERE table_name = 'autotune_choices'")
    assert origins == [(f"key:{key.key_id}",)]
    assert _rows_of(str(tmp_path / "b.db"), "SELECT COUNT(*) FROM autotune_history WHERE choice_name IS NULL") == [(0,)]
    assert local_b["kernel_artifacts"] > 0

    # B's local file now holds it all: with the remote gone, a third dir is as warm
    b2, stderr = _run_machine(tmp_path / "b.db", tmp_path / "b2", DEAD_URL, "--remote-timeout", "1", keys=consumer)
    c2 = b2["counters"]
    assert c2["fxgraph_cache_hit"] == 5 and c2["autograd_cache_hit"] == 4
    assert "select_algorithm_autotune" not in c2
    assert stderr.count("remote cache") <= 1  # at most one warning (one process), never an error


# -- each kind through the tiers (real entries of a real Inductor cache) ----------------------


def _real_files(cache_dir: Path) -> dict[str, list[tuple[str, str, bytes]]]:
    """``{"fxgraph"|"aotautograd": [(key, variant, bytes)], "cpp": [(key, name, bytes)],
    "best_config": [(key, name, bytes)]}`` from a real Inductor cache directory."""
    out: dict[str, list[tuple[str, str, bytes]]] = {"fxgraph": [], "aotautograd": [], "cpp": [], "best_config": []}
    for path in sorted((cache_dir / "fxgraph").glob("*/*/*")):
        out["fxgraph"].append((path.parent.name, path.name, path.read_bytes()))
    for path in sorted((cache_dir / "aotautograd").glob("*/*")):
        out["aotautograd"].append((path.parent.name, path.name, path.read_bytes()))
    for path in sorted(cache_dir.glob("*/*.so")):
        out["cpp"].append((path.name.split(".")[0][1:], path.name, path.read_bytes()))
    for path in sorted(cache_dir.rglob("*.best_config")):
        out["best_config"].append((f"{path.parent.name}/{path.name}", path.name, path.read_bytes()))
    return out


def _timings_doc(cache_dir: Path) -> dict:
    docs = sorted((cache_dir / "cache").glob("*"))
    assert docs, "the real cache has autotune timings"
    return json.loads(docs[0].read_text())["cache"]


def _fill_machine_a(a: LiveStore, files: dict, timings: dict) -> None:
    for kind in ("fxgraph", "aotautograd"):
        for key, _, data in files[kind]:
            a.guarded_put(kind, key, data)
    arts = _artifacts.for_store(a)
    for key, name, data in files["cpp"]:
        arts.put_files("cpp", key, [(name, data)], host_key="host-a")
    for key, _, data in files["best_config"]:
        a.best_config_put(key, data)
    cache = a.local_cache(current_fingerprint().system_hash)
    for op, per_inputs in timings.items():
        cache.setdefault(op, {}).update(per_inputs)
    a.write_changes(cache, cache.served)


def _frames(location: str) -> dict[tuple[str, str, str], tuple[bytes, int]]:
    """``(stored frame, size)`` of every guarded entry of the database at ``location``."""
    db = CacheDB(location, upgrade=False)
    try:
        with db.engine.connect() as conn:
            return {(k, key, v): (bytes(blob), int(size)) for k, key, v, blob, size in conn.execute(
                text("SELECT kind, key, variant, payload, size_bytes FROM guarded_entries"))}
    finally:
        db.close()


def test_every_kind_goes_through_the_remote(real_cache: tuple[Path, dict], tmp_path: Path, pg_url: str) -> None:
    cache_dir, _ = real_cache
    files = _real_files(cache_dir)
    timings = _timings_doc(cache_dir)
    assert files["fxgraph"] and files["aotautograd"] and files["cpp"] and files["best_config"]

    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url))
    _fill_machine_a(a, files, timings)
    a.close()  # flushes the queue
    assert a.remote.counts["failures"] == 0
    assert _counts(pg_url)["guarded_entries"] == len(files["fxgraph"]) + len(files["aotautograd"])

    tier = RemoteTier(pg_url)
    b = LiveStore(str(tmp_path / "b.db"), remote=tier)
    try:
        # FX graph / AOTAutograd: every variant, byte for byte; one remote query per key
        for kind in ("fxgraph", "aotautograd"):
            for key, variant, data in files[kind]:
                before = tier.counts["lookup_statements"]
                got = dict(b.guarded_candidates(kind, key))
                assert got[variant] == data
                assert tier.counts["lookup_statements"] - before <= 1
        # kernels: the .so bytes, written where asked
        arts = _artifacts.for_store(b)
        for key, name, data in files["cpp"]:
            got = arts.materialize_key("cpp", key, str(tmp_path / "b_so" / key), host_key="host-a")
            assert got == {name: data}
            assert (tmp_path / "b_so" / key / name).read_bytes() == data
        assert arts.fetch_key("cpp", files["cpp"][0][0], host_key="other-host") is None  # host key kept
        # best configs
        for key, _, data in files["best_config"]:
            assert b.best_config_get(key) == data
        # autotune timings: what PersistentCache.lookup reads
        system_hash = current_fingerprint().system_hash
        cache = b.local_cache(system_hash)
        for op, per_inputs in timings.items():
            for inputs_key, per_precision in per_inputs.items():
                assert cache[op][inputs_key] == per_precision
        # B's local file holds all of it now: a local hit asks the remote nothing
        statements = tier.counts["lookup_statements"]
        for key, _, data in files["best_config"]:
            assert b.best_config_get(key) == data
        for key, variant, data in files["fxgraph"]:
            assert dict(b.guarded_candidates("fxgraph", key))[variant] == data
        assert tier.counts["lookup_statements"] == statements
        # a miss in both tiers is asked once per process
        assert b.best_config_get("zz/none.best_config") is None
        assert b.best_config_get("zz/none.best_config") is None
        assert tier.counts["lookup_statements"] == statements + 1
    finally:
        b.close()
    local_b = _counts(str(tmp_path / "b.db"))
    remote = _counts(pg_url)
    for table in ("guarded_entries", "autotune_timings", "best_configs", "kernel_artifacts", "kernel_blobs"):
        assert local_b[table] == remote[table], table
    # each tier holds FX graph / AOTAutograd payloads in its own form: the SQLite files the
    # real entries (all under 1 MiB) as they are, PostgreSQL compressed (its TOAST would
    # compress a stored frame itself, slower to write and read: cachedb/store/payload.py)
    from cachedb.store.payload import STORED_LEVEL, ZSTD_LEVEL, pack

    contents = {(kind, key, variant): data for kind in ("fxgraph", "aotautograd") for key, variant, data in files[kind]}
    for where, level in ((str(tmp_path / "a.db"), STORED_LEVEL), (str(tmp_path / "b.db"), STORED_LEVEL),
                         (pg_url, ZSTD_LEVEL)):
        frames = _frames(where)
        assert frames.keys() == contents.keys(), where
        for ident, (frame, size) in frames.items():
            assert frame == pack(contents[ident], level=level).blob, (where, ident)


def test_kernel_blobs_are_sent_once(real_cache: tuple[Path, dict], tmp_path: Path, pg_url: str) -> None:
    """The same .so under two host keys: two artifact rows, one blob, on both tiers."""
    cache_dir, _ = real_cache
    key, name, data = _real_files(cache_dir)["cpp"][0]
    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url))
    arts = _artifacts.for_store(a)
    arts.put_files("cpp", key, [(name, data)], host_key="host-a")
    assert a.remote.flush()
    sent = a.remote.counts["pushed_rows"]
    arts.put_files("cpp", key, [(name, data)], host_key="host-b")
    a.close()
    assert a.remote.counts["pushed_rows"] == sent + 1  # the artifact row; the blob was there
    remote = _counts(pg_url)
    assert remote["kernel_artifacts"] == 2 and remote["kernel_blobs"] == 1


def _worker_writes_then_is_terminated(local: str, remote: str, key: str, data: bytes) -> None:
    store = LiveStore(local, remote=RemoteTier(remote))
    store.best_config_put(key, data)
    # as Inductor's compile sidecar ends its workers: SIGTERM, no exit handler runs
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_compile_worker_write_reaches_the_remote_before_the_worker_is_terminated(
    tmp_path: Path, pg_url: str
) -> None:
    """In a multiprocessing child the write is sent before the call returns (the H100 probe
    lost 22 of 293 Triton keys from terminated workers while writes were queued there)."""
    data = json.dumps({"XBLOCK": 64, "num_warps": 4, "num_stages": 1, "configs_hash": "c" * 64}).encode()
    worker = multiprocessing.get_context("fork").Process(
        target=_worker_writes_then_is_terminated,
        args=(str(tmp_path / "w.db"), pg_url, "ab/kernel.best_config", data),
    )
    worker.start()
    worker.join(120)
    assert worker.exitcode == -signal.SIGTERM
    assert _counts(str(tmp_path / "w.db"))["best_configs"] == 1
    assert _counts(pg_url)["best_configs"] == 1
    b = LiveStore(str(tmp_path / "b.db"), remote=RemoteTier(pg_url))
    try:
        assert b.best_config_get("ab/kernel.best_config") == data
    finally:
        b.close()


def _worker_writes_many(local: str, remote: str, worker: int, n: int) -> None:
    store = LiveStore(local, remote=RemoteTier(remote, timeout_s=30))
    for i in range(n):
        data = json.dumps({"XBLOCK": 64, "num_warps": 4, "num_stages": 1, "configs_hash": f"{worker:02d}{i:062d}"})
        store.best_config_put(f"w{worker}/k{i}.best_config", data.encode())
    store.close()
    os._exit(0 if store.remote.counts["failures"] == 0 else 3)


def test_compile_workers_writing_at_once_to_an_sqlite_remote_lose_nothing(tmp_path: Path) -> None:
    """Six forked workers (each its own local file) send at once to one SQLite file as the
    remote: the remote write takes the write lock at BEGIN (a deferred transaction that reads
    first gets "database is locked" at once when another writer got in between, and would lose
    its entry)."""
    remote = str(tmp_path / "remote.db")
    CacheDB(remote).close()
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_worker_writes_many, args=(str(tmp_path / f"w{w}.db"), remote, w, 25))
               for w in range(6)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(120)
    assert [p.exitcode for p in workers] == [0] * 6
    assert _counts(remote)["best_configs"] == 6 * 25


# -- faults -----------------------------------------------------------------------------------


def test_unreachable_remote_is_one_warning_and_local_only(
    tmp_path: Path, real_cache: tuple[Path, dict], caplog: pytest.LogCaptureFixture
) -> None:
    key, _, data = _real_files(real_cache[0])["best_config"][0]
    store = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(DEAD_URL, timeout_s=1.0))
    with caplog.at_level(logging.WARNING, logger="cachedb.live"):
        started = time.monotonic()
        assert store.best_config_get(key) is None  # a miss, not an error
        store.best_config_put(key, data)
        assert store.best_config_get(key) == data  # the local file serves
        assert store.best_config_get("zz/other.best_config") is None
        store.close()
        elapsed = time.monotonic() - started
    warnings = [r for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "127.0.0.1:1" in warnings[0].getMessage()
    assert elapsed < 10
    assert _counts(str(tmp_path / "a.db"))["best_configs"] == 1


def test_slow_remote_costs_at_most_its_timeout(
    tmp_path: Path, real_cache: tuple[Path, dict], pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A remote whose lookup hangs (a lock another session holds) is given up after the
    timeout (PostgreSQL's statement_timeout): a miss, one warning, the local file serves."""
    key, _, data = _real_files(real_cache[0])["best_config"][0]
    CacheDB(pg_url).close()
    admin = create_engine(pg_url)
    locker = admin.connect()
    locker.begin()
    locker.execute(text("LOCK TABLE best_configs IN ACCESS EXCLUSIVE MODE"))
    try:
        store = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url, timeout_s=1.0))
        with caplog.at_level(logging.WARNING, logger="cachedb.live"):
            started = time.monotonic()
            assert store.best_config_get(key) is None
            waited = time.monotonic() - started
            store.best_config_put(key, data)
            assert store.best_config_get(key) == data
    finally:
        locker.rollback()
        locker.close()
        admin.dispose()
    store.close()
    messages = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(messages) == 1 and "lookup failed" in messages[0] and "statement timeout" in messages[0]
    assert 0.9 <= waited < 5


def test_remote_at_an_older_schema_is_left_alone(
    tmp_path: Path, real_cache: tuple[Path, dict], pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    key, _, data = _real_files(real_cache[0])["best_config"][0]
    old = CacheDB(pg_url)
    with old.transaction() as repos:
        repos.best_configs.put(key, data.decode())
    _migrate.downgrade(old.engine, "0002")
    old.close()
    store = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url))
    with caplog.at_level(logging.WARNING, logger="cachedb.live"):
        assert store.best_config_get(key) is None
        store.best_config_put(key, data)
        store.close()
    messages = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(messages) == 1 and "older" in messages[0] and "cachedb --db URL upgrade" in messages[0]
    check = CacheDB(pg_url, upgrade=False)
    try:
        assert check.revision() == "0002"  # not upgraded behind its other users' backs
        with check.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM best_configs")).scalar_one() == 1
    finally:
        check.close()
    assert _counts(str(tmp_path / "a.db"))["best_configs"] == 1


def test_remote_that_refuses_writes_still_serves_reads(
    tmp_path: Path, real_cache: tuple[Path, dict], pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    files = _real_files(real_cache[0])
    key, _, data = files["best_config"][0]
    setup = CacheDB(pg_url)
    with setup.transaction() as repos:
        repos.best_configs.put(key, data.decode())
    schema = pg_url.split("search_path%3D")[1]
    role = f"cachedb_ro_{uuid.uuid4().hex[:8]}"
    with setup.engine.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
        conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'))
    setup.close()
    ro_url = pg_url.replace("postgres@", f"{role}@")
    try:
        store = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(ro_url))
        with caplog.at_level(logging.WARNING, logger="cachedb.live"):
            assert store.best_config_get(key) == data  # pulled
            fx_key, _, fx = files["fxgraph"][0]
            store.guarded_put("fxgraph", fx_key, fx)
            assert store.flush(60) and store.remote.flush()
            store.guarded_put("fxgraph", files["fxgraph"][-1][0], files["fxgraph"][-1][2])
            store.close()
        messages = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
        assert len(messages) == 1 and "write failed" in messages[0]
        assert _counts(str(tmp_path / "a.db"))["guarded_entries"] == 2  # kept locally
        assert _counts(pg_url)["guarded_entries"] == 0
    finally:
        admin = create_engine(PG_URL)
        with admin.begin() as conn:
            conn.execute(text(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM "{role}"'))
            conn.execute(text(f'REVOKE ALL ON SCHEMA "{schema}" FROM "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def test_remote_writer_killed_mid_write_loses_nothing(
    tmp_path: Path, real_cache: tuple[Path, dict], pg_url: str
) -> None:
    """The remote writer's backend is terminated (``pg_terminate_backend``) while its
    transaction waits on a lock: the batch is rolled back there, sent again on a new
    connection, and every entry arrives; the local file never misses anything."""
    files = _real_files(real_cache[0])
    tier = RemoteTier(pg_url, timeout_s=30.0)
    store = LiveStore(str(tmp_path / "a.db"), remote=tier)
    fx_key, _, fx = files["fxgraph"][0]
    store.guarded_put("fxgraph", fx_key, fx)  # opens the remote, creates its schema
    assert store.flush(60) and tier.flush()  # written locally (write-behind), then sent
    admin = create_engine(pg_url)
    locker = admin.connect()
    locker.begin()
    locker.execute(text("LOCK TABLE guarded_entries IN ACCESS EXCLUSIVE MODE"))
    for kind in ("fxgraph", "aotautograd"):
        for key, _, data in files[kind][1:] if kind == "fxgraph" else files[kind]:
            store.guarded_put(kind, key, data)
    killed: list[int] = []
    deadline = time.monotonic() + 20
    while not killed and time.monotonic() < deadline:
        with admin.connect() as conn:
            pids = conn.execute(text(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )).scalars().all()
            for pid in pids:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                killed.append(pid)
        time.sleep(0.05)
    locker.rollback()
    locker.close()
    admin.dispose()
    assert killed, "the remote writer never waited on the lock"
    assert store.flush(60) and tier.flush(30)
    store.close()
    expected = len(files["fxgraph"]) + len(files["aotautograd"])
    assert _counts(str(tmp_path / "a.db"))["guarded_entries"] == expected
    assert _counts(pg_url)["guarded_entries"] == expected


def test_two_machines_pushing_the_same_entries_at_once(
    tmp_path: Path, real_cache: tuple[Path, dict], pg_url: str
) -> None:
    """Both hosts write the same FX entries and best configs: the remote keeps one row each."""
    files = _real_files(real_cache[0])
    CacheDB(pg_url).close()  # schema in place before the race
    stores = [LiveStore(str(tmp_path / f"{m}.db"), remote=RemoteTier(pg_url)) for m in "ab"]

    def fill(store: LiveStore) -> None:
        for kind in ("fxgraph", "aotautograd"):
            for key, _, data in files[kind]:
                store.guarded_put(kind, key, data)
        for key, _, data in files["best_config"]:
            store.best_config_put(key, data)

    threads = [threading.Thread(target=fill, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
        assert s.remote.counts["failures"] == 0
    remote = _counts(pg_url)
    assert remote["guarded_entries"] == len(files["fxgraph"]) + len(files["aotautograd"])
    assert remote["best_configs"] == len(files["best_config"])
    assert remote["system_fingerprints"] == 1


def test_a_corrupt_local_variant_is_served_from_the_remote(tmp_path: Path) -> None:
    """A local variant whose payload fails its check is quarantined and skipped; the variant is
    then fetched from the remote tier (an SQLite file here) and served intact, once."""
    import pickle
    from types import SimpleNamespace

    from cachedb.keys import sha256_hash

    key = "fcorruptlocal" + "0" * 39
    good = pickle.dumps(SimpleNamespace(guards_expr=None, n=1))
    variant = sha256_hash(good)
    remote_path, local_path = tmp_path / "remote.db", tmp_path / "local.db"
    for path in (remote_path, local_path):
        store = LiveStore(str(path))
        store.guarded_put("fxgraph", key, good)
        store.close()
    local = CacheDB(local_path)
    with local.engine.begin() as conn:
        conn.execute(text("UPDATE guarded_entries SET payload = :p"), {"p": b"not a zstd frame"})
    local.close()

    tier = RemoteTier(f"sqlite:///{remote_path}")
    store = LiveStore(str(local_path), remote=tier)
    try:
        assert list(store.guarded_candidates("fxgraph", key)) == [(variant, good)]
    finally:
        store.close()
    local = CacheDB(local_path)
    with local.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM quarantined_entries")).scalar_one() == 1
    local.close()
    assert _counts(str(local_path))["guarded_entries"] == 1  # the remote's copy, now local


def test_the_driver_is_imported_before_the_first_lookup() -> None:
    """A fresh process's remote tier imports psycopg on a thread as it is made, so the first
    lookup does not pay for it; nothing is connected until then."""
    code = (
        "import sys, time\n"
        "from cachedb.live._remote import RemoteTier\n"
        "assert 'psycopg' not in sys.modules\n"
        f"tier = RemoteTier({PG_URL!r})\n"
        "deadline = time.monotonic() + 30\n"
        "while 'psycopg.postgres' not in sys.modules and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print('psycopg.postgres' in sys.modules, tier._db is None, tier.counts['connections'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "0"]


# -- lookups on the driver (cachedb.fleet.tier_read) -------------------------------------------


def _filled_remote(real_cache: tuple[Path, dict], tmp_path: Path, pg_url: str) -> dict:
    """Machine A's entries of every kind on the remote (one FX graph key with factors)."""
    from cachedb.keys.factors import Factor

    files = _real_files(real_cache[0])
    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url))
    key = files["fxgraph"][0][0]
    a.note_miss("fxgraph", key, [Factor("graph_code", "ab" * 8, "def forward(x): ..."),
                                 Factor("inductor_config.max_autotune", "cd" * 8, "False")])
    _fill_machine_a(a, files, _timings_doc(real_cache[0]))
    a.close()
    assert a.remote.counts["failures"] == 0
    return files


def test_the_driver_reader_reads_what_the_engine_reads(
    real_cache: tuple[Path, dict], tmp_path: Path, pg_url: str
) -> None:
    """Every kind the driver reader serves: the same bundle as tier_sync.fetch on the engine
    (rows, factor ids, fingerprints, kernel blobs), and the same SQL text although its dialect
    never connected."""
    from cachedb.fleet import tier_read
    from cachedb.fleet import tier_sync as sync
    from cachedb.repositories.factors import KeyFactorRepository
    from cachedb.store.tables import DYNAMO_TABLES

    files = _filled_remote(real_cache, tmp_path, pg_url)
    entries = [sync.guarded(kind, key) for kind in ("fxgraph", "aotautograd") for key, _, _ in files[kind]]
    entries += [sync.kernel("cpp", "host-a", key) for key, _, _ in files["cpp"]]
    entries += [sync.best_config(key) for key, _, _ in files["best_config"]]
    stored = len(entries)
    entries += [sync.local_values(current_fingerprint().system_hash, "autotune_local_cache"),
                sync.guarded("fxgraph", "fnot-stored"), sync.best_config("zz/none.best_config"),
                *(sync.dynamo(kind, "none") for kind in DYNAMO_TABLES)]
    assert {e.kind for e in entries} == tier_read.KINDS
    reader = tier_read.DriverReader(pg_url, timeout_s=5.0)
    db = CacheDB(pg_url, upgrade=False)
    try:
        with db.engine.connect() as conn:
            factored = 0
            for entry in entries:
                for with_blobs in (True, False) if entry.kind == "kernel" else (True,):
                    ours = reader.fetch(entry, with_blobs=with_blobs)
                    assert ours == sync.fetch(conn, entry, with_blobs=with_blobs), entry
                    if ours.factor_ids:
                        factored += 1
                        by_id = KeyFactorRepository(conn).by_id(ours.factor_ids)
                        assert len(by_id) == 2 and reader.factors(ours.factor_ids + [10**9]) == by_id
                    stmt = sync._statement(entry, with_blobs).compile(dialect=db.engine.dialect)
                    assert reader.query(entry, with_blobs=with_blobs).sql == stmt.string
            assert factored == 1
            assert all(reader.fetch(e) for e in entries[:stored])  # machine A's entries are there
    finally:
        db.close()
    assert reader.connections == 1  # one connection for every lookup, its revision read once
    reader.close()
    with pytest.raises(tier_read.ReaderClosed):
        reader.fetch(entries[0])


def _lookup_in_child(tier: RemoteTier, local: str, key: str, out: multiprocessing.Queue) -> None:
    store = LiveStore(local, remote=tier, write_behind=False)
    out.put((next(iter(store.guarded_candidates("fxgraph", key)), None) is not None, tier._db is None,
             tier.counts["connections"]))


def test_lookups_run_on_the_driver_until_the_engine_opens(
    real_cache: tuple[Path, dict], tmp_path: Path, pg_url: str
) -> None:
    """A process's lookups take one connection of the driver reader and build no engine; a
    forked child (a compile worker) opens its own; the first write opens the engine, which
    closes the reader's connection first, and the lookups after it go through the engine."""
    files = _filled_remote(real_cache, tmp_path, pg_url)
    (key0, variant0, data0), (key1, _, _) = files["fxgraph"][0], files["fxgraph"][1]
    tier = RemoteTier(pg_url, idle_s=60.0)
    b = LiveStore(str(tmp_path / "b.db"), remote=tier, write_behind=False)
    try:
        assert dict(b.guarded_candidates("fxgraph", key0))[variant0] == data0
        assert tier.flush(30)  # the key's factors, looked up by the writer thread on the driver too
        check = CacheDB(str(tmp_path / "b.db"), upgrade=False)
        with check.read() as repos:
            assert len(repos.key_factors.of("fxgraph", key0)) == 2
        check.close()
        assert tier._db is None and tier.counts["connections"] == 1 and tier.counts["lookup_statements"] == 1
        reader = tier._reader
        assert reader is not None and reader.connected
        out: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
        child = multiprocessing.get_context("fork").Process(
            target=_lookup_in_child, args=(tier, str(tmp_path / "c.db"), key1, out))
        child.start()
        assert out.get(timeout=60) == (True, True, 2)  # its own connection: the parent's one, plus one
        child.join(60)
        # the parent's connection survived the child
        best_key, _, best = files["best_config"][0]
        assert b.best_config_get(best_key) == best
        assert tier.counts["connections"] == 1 and reader.connected
        b.best_config_put("zz/written.best_config", b'{"XBLOCK": 8}')
        assert tier.flush(30)
        assert tier._db is not None and reader.closed and not reader.connected
        assert dict(b.guarded_candidates("fxgraph", key1))  # through the engine now
        assert tier.counts["failures"] == 0
    finally:
        b.close()
