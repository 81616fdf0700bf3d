"""What the child processes of the reliability tests run.

Imported by the forkserver (see ``conftest.mp``) so that every child starts with cachedb,
SQLAlchemy and Alembic already imported. Each function is the ``target`` of one child process;
it reports through files (append-only logs written after each commit, JSON results) because
a child may be killed with SIGKILL at any moment.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import traceback
from pathlib import Path

import cachedb  # noqa: F401  (preloaded in the forkserver)
import cachedb.layout.importer  # noqa: F401
import cachedb.tools.verify  # noqa: F401  (preloaded too)
from cachedb import CacheDB
from cachedb.store import migrate as _migrate
from cachedb.fingerprint import Fingerprint
from cachedb.layout.importer import Importer
from cachedb.keys import sha256_hash

# --------------------------------------------------------------------------- helpers


def append_line(fd: int, obj: object) -> None:
    """One JSON line, one write(2) on an O_APPEND descriptor: whole lines or nothing."""
    os.write(fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode())


def read_lines(path: str | os.PathLike[str]) -> list:
    """The complete JSON lines of a log (a torn last line, if any, is not a committed record)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_bytes().split(b"\n"):
        if line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def wait_for(path: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {path} never appeared")
        time.sleep(0.0005)


def _result(path: str, obj: object) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _error(exc: BaseException) -> dict:
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc)[:500],
            "traceback": traceback.format_exc()[-3000:]}


def noop() -> None:
    pass


# --------------------------------------------------------------------------- crash: import


#: Files per batch and per import transaction in the crash children (``cachedb import``: 256
#: and 1,024): the synthetic directory's ~400 files then commit in four transactions of two
#: batches each, whose boundaries the kills must find whole.
IMPORT_BATCH_FILES = 64
IMPORT_COMMIT_FILES = 128


def run_import(db_path: str, cache_dir: str) -> None:
    """Import ``cache_dir`` into ``db_path`` (killed at a random moment by the test), in
    batches of :data:`IMPORT_BATCH_FILES` files, a transaction per
    :data:`IMPORT_COMMIT_FILES` (this child's own settings)."""
    import cachedb.layout.walk
    import cachedb.layout.importer

    cachedb.layout.walk.BATCH_FILES = IMPORT_BATCH_FILES
    cachedb.layout.importer._COMMIT_FILES = IMPORT_COMMIT_FILES
    with CacheDB(db_path) as db:
        Importer(db).run(cache_dir)


# --------------------------------------------------------------------------- crash: puts

STREAM_SYSTEM_HASH = "5" * 64
STREAM_BEST_CONFIG_KEYS = 5


def stream_payload(i: int) -> bytes:
    """The payload of put number ``i`` (deterministic: the verifier recomputes it)."""
    rng = random.Random(i)
    size = rng.randrange(200, 10_000)
    text = (f"def kernel_{i}(in_ptr0, out_ptr0, xnumel):\n" * (size // 90)).encode()
    return text + rng.randbytes(size - len(text)) if size > len(text) else text[:size]


def stream_key(i: int) -> str:
    return "f" + sha256_hash(f"stream-key-{i // 3}".encode())  # 3 variants per key


def stream_best_config_key(i: int) -> str:
    return f"bc/stream{i % STREAM_BEST_CONFIG_KEYS}.best_config"


def stream_best_config(i: int) -> str:
    return json.dumps({"XBLOCK": 2 ** (i % 10), "num_warps": 4, "num_stages": 2, "put": i})


def put_stream(db_path: str, log_path: str, first: int) -> None:
    """Put entries ``first, first+1, ...`` one transaction each, forever; after each commit,
    append its number to ``log_path``. Each transaction holds one guarded put, and for some
    numbers a best-config update (``i % 3 == 0``) and a timing row (``i % 4 == 0``)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    db = CacheDB(db_path)
    fp = Fingerprint(system={"hash": STREAM_SYSTEM_HASH})
    i = first
    while True:
        with db.transaction() as repos:
            repos.guarded.put("fxgraph", stream_key(i), stream_payload(i), guards_expr=f"L['x'] == {i}",
                              time_taken_ns=i)
            if i % 3 == 0:
                repos.best_configs.put(stream_best_config_key(i), stream_best_config(i))
            if i % 4 == 0:
                fp_id = repos.fingerprints.ensure(fp)
                repos.timings.record(fp_id, "mm", f"[('cpu', {i % 7})]", "high", {f"choice{i}": i / 1000})
        append_line(fd, i)  # only after the commit returned
        i += 1


# --------------------------------------------------------------------------- concurrency

CONC_SYSTEM_HASH = "c" * 64
CONC_KEYS = 12
CONC_SHARED_PAYLOADS = 4
CONC_BEST_CONFIG_KEYS = 6
CONC_OPS = ("mm", "addmm")
CONC_INPUTS = 3
CONC_CHOICES = 4


def conc_key(k: int) -> str:
    return "f" + sha256_hash(f"conc-key-{k}".encode())


def conc_shared_payload(k: int, j: int) -> bytes:
    """Payloads every process may put under key ``k``: same variant, racing inserts."""
    return random.Random(f"shared-{k}-{j}").randbytes(300 + 97 * j) + b"shared"


def conc_inputs(j: int) -> str:
    return f"[('cpu', 'torch.float32', {64 << j}, {64 << j}, {64 << j}, 1, 0)]"


def concurrency_worker(location: str, index: int, seed: int, duration_s: float, go_path: str,
                       ready_path: str, log_path: str, result_path: str) -> None:
    """Mixed reads and writes on shared keys for ``duration_s``; logs every committed write
    (one JSON line each, after the commit) and every read; counts any exception."""
    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    errors: list[dict] = []
    ops: dict[str, int] = {}
    try:
        db = CacheDB(location)
    except Exception as exc:
        _result(result_path, {"errors": [_error(exc)], "ops": ops})
        return
    fp = Fingerprint(system={"hash": CONC_SYSTEM_HASH})
    Path(ready_path).touch()
    wait_for(go_path)
    deadline = time.monotonic() + duration_s
    n = 0
    while time.monotonic() < deadline:
        n += 1
        op = rng.choice(["put", "put", "candidates", "record", "lookup", "bc_put", "bc_get", "hit"])
        ops[op] = ops.get(op, 0) + 1
        try:
            if op == "put":
                k = rng.randrange(CONC_KEYS)
                if rng.random() < 0.5:
                    payload = conc_shared_payload(k, rng.randrange(CONC_SHARED_PAYLOADS))
                else:
                    payload = random.Random(f"{seed}-{n}").randbytes(rng.randrange(100, 5000))
                with db.transaction() as repos:
                    variant, inserted = repos.guarded.put("fxgraph", conc_key(k), payload, guards_expr=None)
                append_line(fd, {"op": "put", "key": conc_key(k), "variant": variant, "inserted": inserted,
                                 "sha": sha256_hash(payload), "size": len(payload)})
            elif op == "candidates":
                k = rng.randrange(CONC_KEYS)
                with db.read() as repos:
                    found = repos.guarded.candidates("fxgraph", conc_key(k))
                bad = [v for v, data in found if sha256_hash(data) != v]
                if bad:
                    errors.append({"type": "WrongBytes", "message": f"{conc_key(k)}: {bad}", "traceback": ""})
                append_line(fd, {"op": "candidates", "key": conc_key(k), "variants": [v for v, _ in found]})
            elif op == "record":
                o = rng.choice(CONC_OPS)
                inputs = conc_inputs(rng.randrange(CONC_INPUTS))
                timings = {f"choice{c}": round(rng.uniform(0.01, 5.0), 6)
                           for c in rng.sample(range(CONC_CHOICES), rng.randint(1, CONC_CHOICES))}
                with db.transaction() as repos:
                    fp_id = repos.fingerprints.ensure(fp)
                    added = repos.timings.record(fp_id, o, inputs, "high", timings)
                append_line(fd, {"op": "record", "opname": o, "inputs": inputs, "timings": timings, "added": added})
            elif op == "lookup":
                o = rng.choice(CONC_OPS)
                inputs = conc_inputs(rng.randrange(CONC_INPUTS))
                with db.read() as repos:
                    ids = repos.fingerprints.ids_for_system_hash(CONC_SYSTEM_HASH)
                    got = repos.timings.lookup(ids, o, inputs, "high") if ids else {}
                append_line(fd, {"op": "lookup", "opname": o, "inputs": inputs, "got": got})
            elif op == "bc_put":
                key = f"bc/conc{rng.randrange(CONC_BEST_CONFIG_KEYS)}.best_config"
                content = json.dumps({"XBLOCK": 64, "num_warps": 4, "writer": index, "n": n})
                with db.transaction() as repos:
                    repos.best_configs.put(key, content)
                    stamp = time.monotonic_ns()  # inside the write transaction: commit order
                append_line(fd, {"op": "bc_put", "key": key, "content": content, "stamp": stamp})
            elif op == "bc_get":
                key = f"bc/conc{rng.randrange(CONC_BEST_CONFIG_KEYS)}.best_config"
                with db.read() as repos:
                    got = repos.best_configs.get(key)
                append_line(fd, {"op": "bc_get", "key": key, "got": got})
            elif op == "hit":
                k = rng.randrange(CONC_KEYS)
                with db.read() as repos:
                    variants = [v for v, _ in repos.guarded.raw_candidates("fxgraph", conc_key(k))]
                if variants:
                    v = rng.choice(variants)
                    with db.transaction() as repos:
                        repos.guarded.record_hit("fxgraph", conc_key(k), v)
                    append_line(fd, {"op": "hit", "key": conc_key(k), "variant": v})
        except Exception as exc:  # reaching the caller is the failure being tested
            errors.append(_error(exc))
    db.close()
    _result(result_path, {"errors": errors, "ops": ops})


# --------------------------------------------------------------------------- migrations


class _UpgradeLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.upgrades = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("cachedb: upgrading"):
            self.upgrades += 1


def migration_worker(location: str, mode: str, go_path: str, ready_path: str, result_path: str) -> None:
    """Open an old database as soon as ``go_path`` appears.

    ``mode == "open"``: ``CacheDB(location)`` (which upgrades); whether this process ran the
    upgrade is read from cachedb.store.migrate's log record. ``mode == "upgrade"``:
    ``CacheDB(location, upgrade=False).upgrade()``, i.e. ``_migrate.upgrade(engine, where=...)``,
    whose return value says it.
    """
    handler = _UpgradeLog()
    log = logging.getLogger("cachedb.store.migrate")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    Path(ready_path).touch()
    out: dict = {"pid": os.getpid()}
    try:
        wait_for(go_path)
        t0 = time.monotonic()
        if mode == "open":
            db = CacheDB(location)
            out["upgraded"] = None
        else:
            db = CacheDB(location, upgrade=False)
            out["upgraded"] = db.upgrade()
        out["seconds"] = time.monotonic() - t0
        out["revision"] = db.revision()
        out["upgrade_logs"] = handler.upgrades
        with db.read() as repos:
            out["guarded"] = repos.guarded.count()
        db.close()
    except Exception as exc:
        out["error"] = _error(exc)
    _result(result_path, out)


__all__ = [name for name in globals() if not name.startswith("_")] + ["_migrate"]
