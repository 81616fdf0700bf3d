"""A fleet on one shared tier: full servers, restarts, idle connections, processes that share
a local file, and PgBouncer in transaction pooling mode, all on the real PostgreSQL server of
this machine and a real PgBouncer (Debian's package) in front of it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from cachedb import CacheDB
from cachedb.fleet import tier_sync as sync
from cachedb.fleet.connections import transient
from cachedb.live._remote import RemoteTier
from cachedb.live._store import LiveStore

from .conftest import PG_URL


@pytest.fixture(autouse=True)
def _remote_rows_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests exercise the tier's transport: every remote row is taken
    (``CACHEDB_REMOTE_TRUST=1``); what trust refuses is tests/test_fleet_trust.py's."""
    monkeypatch.setenv("CACHEDB_REMOTE_TRUST", "1")


BEST_CONFIG = json.dumps({"XBLOCK": 64, "num_warps": 4, "num_stages": 1, "configs_hash": "c" * 64}).encode()


def _entry(i: int) -> tuple[str, bytes]:
    return f"f{i:02d}{uuid.uuid4().hex}", pickle.dumps({"graph": i, "code": os.urandom(4096).hex()})


def _fill(remote: str, tmp_path: Path, n: int) -> list[tuple[str, bytes]]:
    """``n`` FX graph entries written through a machine whose writes reach ``remote``."""
    entries = [_entry(i) for i in range(n)]
    writer = LiveStore(str(tmp_path / f"writer-{uuid.uuid4().hex[:6]}.db"), remote=RemoteTier(remote, timeout_s=30),
                       write_behind=False)
    for key, content in entries:
        writer.guarded_put("fxgraph", key, content)
    assert writer.remote is not None and writer.remote.flush(60)
    writer.close()
    return entries


def _served(store: LiveStore, key: str) -> bytes | None:
    return next(iter(store.guarded_candidates("fxgraph", key)), (None, None))[1]


def _remote_rows(url: str, table: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


def _with_query(url: str, **params: str) -> str:
    u = make_url(url)
    return u.update_query_dict(params).render_as_string(hide_password=False)


# -- PgBouncer (the fixtures `pgbouncer` and `database` are in tests/conftest.py) --------------


def test_every_kind_goes_through_pgbouncer_in_transaction_mode(
    tmp_path: Path, pgbouncer: Any, database: str
) -> None:
    """The schema is created through the pooler (one transaction, a transaction-scoped advisory
    lock), the refused ``statement_timeout`` option is left out, and no statement is prepared
    on the server: 30 lookups of one shape on one client connection, each transaction on
    whichever server connection PgBouncer hands out, all served."""
    url = pgbouncer.url(database)
    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(url), write_behind=False)
    keys = [f"k{i:02d}/kernel.best_config" for i in range(30)]
    for key in keys:
        a.best_config_put(key, BEST_CONFIG)
    entries = [_entry(i) for i in range(3)]
    for key, content in entries:
        a.guarded_put("fxgraph", key, content)
    assert a.remote is not None and a.remote.flush(60)
    assert a.remote.counts["failures"] == 0
    assert a.remote._statement_timeout is False  # PgBouncer refused the startup option
    a.close()

    b = LiveStore(str(tmp_path / "b.db"), remote=RemoteTier(url), write_behind=False)
    try:
        assert [b.best_config_get(k) for k in keys] == [BEST_CONFIG] * len(keys)
        assert [_served(b, key) for key, _ in entries] == [content for _, content in entries]
        assert b.remote is not None and b.remote.counts["failures"] == 0
        assert b.remote.counts["pull"] == len(keys) + len(entries)
    finally:
        b.close()
    direct = make_url(PG_URL).set(database=database).render_as_string(hide_password=False)
    assert _remote_rows(direct, "best_configs") == len(keys)
    assert _remote_rows(direct, "guarded_entries") == len(entries)


def test_cli_upgrade_through_pgbouncer_creates_the_schema(pgbouncer: Any, database: str) -> None:
    """``cachedb --db <PgBouncer URL> upgrade`` runs the migrations in one transaction behind a
    transaction-scoped advisory lock, which transaction pooling keeps on one server
    connection."""
    from click.testing import CliRunner

    from cachedb.cli import main
    from cachedb.store import migrate

    result = CliRunner().invoke(main, ["--db", pgbouncer.url(database), "upgrade"])
    assert result.exit_code == 0, result.output
    db = CacheDB(make_url(PG_URL).set(database=database), upgrade=False)
    try:
        assert db.revision() == migrate.HEAD_REVISION
    finally:
        db.close()


def _signal_once_refused(store: LiveStore, refused: Any) -> threading.Thread:
    """A thread that sets ``refused`` once ``store``'s remote tier has retried (met a refused
    or full server) and waits it out: what the tests wait on before they let the server back."""
    remote = store.remote
    assert remote is not None

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not remote.counts.get("retries") and time.monotonic() < deadline:
            time.sleep(0.005)
        refused.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _lookups_through_a_restart(url: str, local: str, keys: list[str], opened: Any, stopped: Any, refused: Any,
                               out: Any) -> None:
    store = LiveStore(local, remote=RemoteTier(url, timeout_s=8.0, idle_s=0.0), write_behind=False)
    served = _served(store, keys[0]) is not None  # the remote is open: its schema checked
    opened.wait(60)
    stopped.wait(60)  # the server is down now: the next lookup meets ``connection refused``
    _signal_once_refused(store, refused)
    for key in keys[1:]:
        served += _served(store, key) is not None
        time.sleep(0.05)
    out.put((served, dict(store.remote.counts)))  # type: ignore[union-attr]
    store.close()


def test_a_server_restarted_mid_herd_is_waited_out(tmp_path: Path, pgbouncer: Any, database: str) -> None:
    """Six machines have each looked up one entry when the server they connect to (PgBouncer)
    stops, and starts again once every machine has met it down (``connection refused``); they
    go on looking up 39 more, one every 50 ms: every lookup waits the outage out within its
    timeout, all served, no fallback to the local cache."""
    url = pgbouncer.url(database)
    entries = _fill(url, tmp_path, 40)
    keys = [key for key, _ in entries]
    mp = multiprocessing.get_context("fork")
    opened, stopped, out = mp.Barrier(7), mp.Event(), mp.Queue()
    refused = [mp.Event() for _ in range(6)]
    procs = [mp.Process(target=_lookups_through_a_restart,
                        args=(url, str(tmp_path / f"m{i}.db"), keys, opened, stopped, refused[i], out))
             for i in range(6)]
    for p in procs:
        p.start()
    try:
        opened.wait(60)  # every machine has its connection settings and schema check behind it
        pgbouncer.stop()
    finally:
        stopped.set()
    assert all(event.wait(60) for event in refused)  # each machine is waiting the outage out
    pgbouncer.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert [served for served, _ in results] == [len(keys)] * len(procs)
    assert all(counts.get("failures", 0) == 0 for _, counts in results), results
    assert sum(counts.get("retries", 0) for _, counts in results) > 0  # the restart was met, and waited out


# -- a full server ----------------------------------------------------------------------------


@pytest.fixture
def limited_role(pg_url: str) -> Iterator[tuple[str, str]]:
    """``(role, URL)``: a login role allowed 2 connections (``CONNECTION LIMIT 2``) that reads
    and writes the test's schema: a server full for this role, with the others unaffected."""
    role = f"cachedb_limited_{uuid.uuid4().hex[:8]}"
    schema = make_url(pg_url).query["options"].split("=", 1)[1]  # -csearch_path=<schema>
    CacheDB(pg_url).close()  # the schema, created at the code's revision
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 2'))
        conn.execute(text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
        conn.execute(text(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'))
        conn.execute(text(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"'))
    try:
        yield role, make_url(pg_url).set(username=role).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"))
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def _lookup_once(url: str, local: str, key: str, barrier: Any, refused: Any, out: Any) -> None:
    store = LiveStore(local, remote=RemoteTier(url, timeout_s=10.0, idle_s=0.0), write_behind=False)
    store.db
    barrier.wait(60)  # every machine asks while the server is still full
    _signal_once_refused(store, refused)
    started = time.monotonic()
    content = _served(store, key)
    out.put((content is not None, time.monotonic() - started, dict(store.remote.counts)))  # type: ignore[union-attr]
    store.close()


def test_a_full_server_is_a_wait_not_an_outage(tmp_path: Path, pg_url: str, limited_role: tuple[str, str]) -> None:
    """Both connections the role may have are taken; eight machines (each its own local file)
    ask for an entry at once, and the connections are given back once each has been refused
    (``too many connections for role``): each waits with backoff and is served once a
    connection frees, 8 of 8, none falls back to its local cache, each within its timeout."""
    role, url = limited_role
    (key, content), = _fill(pg_url, tmp_path, 1)
    holders = create_engine(url)
    held = [holders.connect() for _ in range(2)]
    for conn in held:
        conn.execute(text("SELECT 1"))
    with pytest.raises(Exception) as refused:  # the server is full for this role
        create_engine(url).connect()
    assert transient(refused.value) and "too many connections" in str(refused.value)
    mp = multiprocessing.get_context("fork")
    barrier, out = mp.Barrier(9), mp.Queue()
    refused = [mp.Event() for _ in range(8)]
    procs = [mp.Process(target=_lookup_once, args=(url, str(tmp_path / f"m{i}.db"), key, barrier, refused[i], out))
             for i in range(8)]
    for p in procs:
        p.start()
    barrier.wait(60)
    assert all(event.wait(60) for event in refused)  # every machine met the full server
    for conn in held:
        conn.close()
    holders.dispose()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert [ok for ok, _, _ in results] == [True] * 8
    assert all(counts.get("failures", 0) == 0 for _, _, counts in results), results
    assert all(counts.get("retries", 0) > 0 for _, _, counts in results)  # each met the full server
    assert all(waited < 10 for _, waited, _ in results)


def test_transient_tells_passing_refusals_from_real_errors(pg_url: str) -> None:
    """Real errors: a refused connection passes; an SQL error or an unknown database does not."""
    with pytest.raises(Exception) as refused:
        create_engine("postgresql+psycopg://postgres@127.0.0.1:1/test").connect()
    assert transient(refused.value)
    engine = create_engine(pg_url)
    try:
        with engine.connect() as conn, pytest.raises(Exception) as syntax:
            conn.execute(text("SELEC 1"))
    finally:
        engine.dispose()
    assert not transient(syntax.value)
    with pytest.raises(Exception) as unknown:
        create_engine(make_url(PG_URL).set(database="cachedb_no_such_database")).connect()
    assert not transient(unknown.value)



def test_a_real_deadlock_is_run_again(pg_url: str) -> None:
    """Two transactions locking two rows in opposite orders: the one PostgreSQL rolls back
    (deadlock_detected) is transient, so the remote tier runs its write again."""
    engine = create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE lock_order (id int PRIMARY KEY, n int)"))
            conn.execute(text("INSERT INTO lock_order VALUES (1, 0), (2, 0)"))
        both_hold = threading.Barrier(2)
        errors: list[BaseException] = []

        def cross(first: int, second: int) -> None:
            try:
                with engine.begin() as conn:
                    conn.execute(text("UPDATE lock_order SET n = n + 1 WHERE id = :i"), {"i": first})
                    both_hold.wait(10)
                    conn.execute(text("UPDATE lock_order SET n = n + 1 WHERE id = :i"), {"i": second})
            except Exception as exc:  # the victim
                errors.append(exc)

        threads = [threading.Thread(target=cross, args=order) for order in ((1, 2), (2, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        engine.dispose()
    assert len(errors) == 1, errors
    assert "deadlock detected" in str(errors[0]) and transient(errors[0])

# -- connections follow lookups, not processes -----------------------------------------------


def _connections(application_name: str) -> int:
    admin = create_engine(PG_URL)
    try:
        with admin.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                                    {"a": application_name}).scalar_one())
    finally:
        admin.dispose()


def test_a_remote_connection_closes_when_idle(tmp_path: Path, pg_url: str) -> None:
    entries = _fill(pg_url, tmp_path, 2)
    name = f"cachedb_idle_{uuid.uuid4().hex[:8]}"
    store = LiveStore(str(tmp_path / "b.db"), remote=RemoteTier(_with_query(pg_url, application_name=name),
                                                                idle_s=2.0), write_behind=False)
    try:
        assert _served(store, entries[0][0]) == entries[0][1]
        assert _connections(name) == 1  # held through the burst
        deadline = time.monotonic() + 15
        while _connections(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connections(name) == 0  # closed once idle
        assert _served(store, entries[1][0]) == entries[1][1]  # a new one for the next burst
        store.best_config_put("ab/kernel.best_config", BEST_CONFIG)
        assert store.remote is not None and store.remote.flush(30)
        # the lookups ran on the driver reader's connection (cachedb.fleet.tier_read): its idle
        # closer closed it between the bursts
        assert store.remote._reader_closer is not None and store.remote._reader_closer.closed_idle >= 1
    finally:
        store.close()
    assert _connections(name) == 0


# -- processes sharing one local file ---------------------------------------------------------


def _rank(url: str, local: str, keys: list[str], barrier: Any, out: Any) -> None:
    store = LiveStore(local, remote=RemoteTier(url, timeout_s=10.0), write_behind=False)
    store.db
    barrier.wait(60)
    served = [_served(store, key) is not None for key in keys]
    barrier.wait(60)
    store.best_config_put("ab/kernel.best_config", BEST_CONFIG)  # every rank writes the same entry
    assert store.remote is not None
    store.remote.flush(30)
    out.put((served, dict(store.remote.counts)))
    store.close()


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_eight_ranks_sharing_a_local_file_ask_and_send_once(
    tmp_path: Path, pg_url: str, via: str, request: pytest.FixtureRequest
) -> None:
    """Eight processes sharing one fresh local file look up the same three FX graph entries at
    once: all eight are served every entry, and the remote is asked once per entry; then each
    writes the same best config, and it is sent once."""
    if via == "pgbouncer":
        url = request.getfixturevalue("pgbouncer").url(request.getfixturevalue("database"))
    else:
        url = pg_url
    entries = _fill(url, tmp_path, 3)
    local = str(tmp_path / "machine.db")
    CacheDB(local).close()
    mp = multiprocessing.get_context("fork")
    barrier, out = mp.Barrier(8), mp.Queue()
    procs = [mp.Process(target=_rank, args=(url, local, [k for k, _ in entries], barrier, out)) for _ in range(8)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert [served for served, _ in results] == [[True] * 3] * 8
    total = {k: sum(counts.get(k, 0) for _, counts in results) for k in ("pull", "push", "failures")}
    assert total == {"pull": 3, "push": 1, "failures": 0}, total
    assert Path(local + ".remote").stat().st_mode & 0o777 == 0o600


def test_a_rank_killed_while_asking_leaves_no_one_waiting(tmp_path: Path, pg_url: str) -> None:
    """The slot lock is the asker's open file: killed mid-lookup, the kernel releases it, and
    the next rank asks for itself at once."""
    from cachedb.live import _coalesce

    (key, content), = _fill(pg_url, tmp_path, 1)
    local = str(tmp_path / "machine.db")
    CacheDB(local).close()
    coalescer = _coalesce.for_database(Path(local))
    assert coalescer is not None
    entry = sync.guarded("fxgraph", key)
    mp = multiprocessing.get_context("fork")
    holding, out = mp.Event(), mp.Queue()

    def hold_then_hang() -> None:
        with coalescer.hold((entry.kind, *entry.values), time.monotonic() + 5) as slot:
            assert slot is not None
            holding.set()
            time.sleep(60)

    asker = mp.Process(target=hold_then_hang)
    asker.start()
    assert holding.wait(30)
    waiter = threading.Thread(target=lambda: out.put(_timed_lookup(pg_url, local, key)))
    waiter.start()
    assert _blocked_on(coalescer.path, 30)  # the waiter is queued behind the asker's lock
    asker.kill()
    asker.join(10)
    waiter.join(30)
    served, waited = out.get(timeout=5)
    assert served == content
    assert waited < 5  # not the whole 10 s timeout


def _blocked_on(path: Path, timeout_s: float) -> bool:
    """Whether, within ``timeout_s`` seconds, some process waits for a lock of the file
    ``path`` (a blocked request, ``->``, in ``/proc/locks``)."""
    inode = os.stat(path).st_ino
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open("/proc/locks") as locks:
            if any("->" in line and f":{inode} " in line for line in locks):
                return True
        time.sleep(0.005)
    return False


def _timed_lookup(url: str, local: str, key: str) -> tuple[bytes | None, float]:
    store = LiveStore(local, remote=RemoteTier(url, timeout_s=10.0), write_behind=False)
    started = time.monotonic()
    try:
        return _served(store, key), time.monotonic() - started
    finally:
        store.close()


@pytest.mark.parametrize("coalesced", [True, False])
def test_what_another_process_pulled_is_served(
    tmp_path: Path, pg_url: str, coalesced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stores on one local file: the second misses locally, then the first pulls the entry
    in. The second's remote ask is answered by the first's (coalesced), or, with the first's
    ask taken as too old to answer for it, asks itself and adds no rows (the natural keys are
    there): either way the entry is served, whatever process wrote it into the local file."""
    from cachedb.live import _coalesce

    if not coalesced:
        monkeypatch.setattr(_coalesce, "ASKED_FRESH_S", -3600.0)
    (key, content), = _fill(pg_url, tmp_path, 1)
    local = str(tmp_path / "machine.db")
    first = LiveStore(local, remote=RemoteTier(pg_url), write_behind=False)
    second = LiveStore(local, remote=RemoteTier(pg_url), write_behind=False)
    try:
        rows, more = second._variant_rows("fxgraph", key, None)  # second's local miss ...
        assert rows == []
        assert _served(first, key) == content  # ... then first pulls it in
        assert list(second._candidates("fxgraph", key, rows, more))[0][1] == content
        assert second.remote is not None
        assert second.remote.counts["coalesced" if coalesced else "pull"] == 1
        assert second.remote.counts["pulled_rows"] == 0
    finally:
        first.close()
        second.close()
