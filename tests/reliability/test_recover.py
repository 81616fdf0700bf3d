"""``cachedb recover`` on real databases with real damaged pages.

A real database (a synthetic Inductor cache in torch 2.13's layout, imported) is copied and random
pages of the copy are overwritten with random bytes. Which rows live on which pages is read
from the intact original's b-trees (leaf page, overflow chain, and the interior pages above
it); every row none of whose pages was damaged must come out of ``recover`` identical, and its
payload must verify.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from cachedb import CacheDB
from cachedb.cli import main as cli
from cachedb.layout.importer import Importer
from cachedb.tools.recover import recover, sqlite_shell

from . import _synth

SEED = 1313
TRIALS = 12

METHODS = [
    "scan",
    pytest.param("recover", marks=pytest.mark.skipif(
        sqlite_shell() is None, reason="no sqlite3 shell with a working .recover (sqlite_dbpage) on PATH")),
]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = 0
    for k in range(8):
        b = buf[i + k]
        value = (value << 7) | (b & 0x7F)
        if b < 0x80:
            return value, i + k + 1
    return (value << 8) | buf[i + 8], i + 9


def row_pages(data: bytes, page_size: int, usable: int, root: int,
              leaves: dict[int, int] | None = None) -> dict[int, frozenset[int]]:
    """rowid -> the pages a reader needs for that row of the table b-tree at ``root``:
    the interior pages from the root down, the leaf, and the overflow chain (SQLite file
    format, section 1.6: b-tree pages and cell payload overflow)."""
    rows: dict[int, frozenset[int]] = {}

    def page(n: int) -> bytes:
        return data[(n - 1) * page_size:n * page_size]

    def walk(n: int, path: frozenset[int]) -> None:
        p = page(n)
        off = 100 if n == 1 else 0
        kind = p[off]
        cells = int.from_bytes(p[off + 3:off + 5], "big")
        header = 12 if kind in (2, 5) else 8
        pointers = [int.from_bytes(p[off + header + 2 * i:off + header + 2 * i + 2], "big") for i in range(cells)]
        here = path | {n}
        if kind == 5:  # interior table page: left children, then the right-most pointer
            for c in pointers:
                walk(int.from_bytes(p[c:c + 4], "big"), here)
            walk(int.from_bytes(p[off + 8:off + 12], "big"), here)
            return
        assert kind == 13, (n, kind)
        max_local = usable - 35
        for c in pointers:
            size, j = _varint(p, c)
            rowid, j = _varint(p, j)
            pages = set(here)
            if size > max_local:
                min_local = (usable - 12) * 32 // 255 - 23
                k = min_local + (size - min_local) % (usable - 4)
                local = k if k <= max_local else min_local
                nxt = int.from_bytes(p[j + local:j + local + 4], "big")
                while nxt:
                    pages.add(nxt)
                    nxt = int.from_bytes(page(nxt)[:4], "big")
            rows[rowid] = frozenset(pages)
            if leaves is not None:
                leaves[rowid] = n

    walk(root, frozenset())
    return rows


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict, set[int]]:
    """The database, its rows per table (by rowid), the pages of each row, and the pages that
    hold the schema (sqlite_master: never damaged here, a damaged schema is refused at open)."""
    root = tmp_path_factory.mktemp("recover")
    synth = _synth.build(root / "inductor", seed=SEED, fx_keys=40, aot_keys=15, best_configs=40, docs=2)
    path = root / "original.db"
    with CacheDB(path) as db:
        assert Importer(db).run(synth.root).problems == []
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    tables = {name: rootpage for name, rootpage in con.execute(
        "SELECT name, rootpage FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "AND name != 'alembic_version'")}
    rows = {t: {r[0]: tuple(r[1:]) for r in con.execute(f'SELECT rowid, * FROM "{t}"')} for t in tables}
    con.close()
    data = path.read_bytes()
    usable = page_size - data[20]
    pages = {t: row_pages(data, page_size, usable, rootpage) for t, rootpage in tables.items()}
    for t in tables:
        assert set(pages[t]) == set(rows[t]), t  # the parser found every row
    schema = {p for ps in row_pages(data, page_size, usable, 1).values() for p in ps} | {1}
    assert sum(len(r) for r in rows.values()) > 300
    return path, rows, pages, schema


def _rows(path: Path) -> dict[str, dict[int, tuple]]:
    con = sqlite3.connect(path)
    tables = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'alembic_version'")]
    out = {t: {r[0]: tuple(r[1:]) for r in con.execute(f'SELECT rowid, * FROM "{t}"')} for t in tables}
    con.close()
    return out


def _page_size(data: bytes) -> int:
    """The page size in an SQLite file header (bytes 16-17, big-endian; 1 means 65536)."""
    n = int.from_bytes(data[16:18], "big")
    return 65536 if n == 1 else n


@pytest.mark.parametrize("method", METHODS)
def test_recover_saves_every_row_on_intact_pages(method: str, original, tmp_path: Path) -> None:
    path, rows, pages, schema = original
    ps = _page_size(path.read_bytes()[:100])
    n_pages = path.stat().st_size // ps
    rng = random.Random(SEED)
    totals = {"rows": 0, "intact": 0, "saved": 0, "intact_saved": 0, "damaged_pages": 0}
    for trial in range(TRIALS):
        damaged = tmp_path / f"damaged{trial}.db"
        shutil.copy(path, damaged)
        hit = set(rng.sample(sorted(set(range(2, n_pages + 1)) - schema), rng.randint(1, 4)))
        with open(damaged, "r+b") as f:
            for p in hit:
                if rng.random() < 0.5:  # the whole page garbage
                    f.seek((p - 1) * ps)
                    f.write(rng.randbytes(ps))
                else:  # a few bytes somewhere in it
                    f.seek((p - 1) * ps + rng.randrange(ps - 32))
                    f.write(rng.randbytes(rng.randint(1, 32)))
        target = tmp_path / f"saved{trial}.db"
        report = recover(damaged, target, method=method)
        got = _rows(target)
        # parents first: a row whose parent row (through any foreign key, transitively: a
        # timing's run, the run's key, the key's fingerprint) sits on a damaged page is left
        # out (orphaned) or saved without it
        orphaned = _orphaned(path, rows, {(t, r) for t, by in rows.items() for r in by if pages[t][r] & hit})
        for table, by_rowid in rows.items():
            for rowid, values in by_rowid.items():
                totals["rows"] += 1
                intact = not (pages[table][rowid] & hit)
                saved = got.get(table, {}).get(rowid)
                totals["saved"] += saved is not None
                if not intact:
                    # a row on a damaged page is either left out or, where a damaged byte missed it,
                    # saved whole; its payload (if it has one) verified
                    continue
                if (table, rowid) in orphaned:
                    continue
                totals["intact"] += 1
                assert saved == values, (trial, method, table, rowid, sorted(hit))
                totals["intact_saved"] += 1
        totals["damaged_pages"] += len(hit)
        assert report.problems == [], (trial, report.problems)  # the new database verifies
        by_table = {t.table: t for t in report.tables}
        for table, by_rowid in rows.items():
            assert by_table[table].saved == len(got.get(table, {})), table
        with CacheDB(target) as db:  # every payload saved reads back through cachedb
            with db.read() as repos:
                assert all(e.payload for e in repos.guarded.iter_all())
    assert totals["intact_saved"] == totals["intact"] > 0
    print(json.dumps({"method": method, **totals}))


_COLS: dict[tuple[Path, str], list[str]] = {}


def _orphaned(path: Path, rows: dict[str, dict[int, tuple]], lost: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """The rows (``(table, rowid)``) whose parent through a foreign key is in ``lost`` or is
    itself such a row."""
    con = sqlite3.connect(path)
    fks = {t: [(r[3], r[2]) for r in con.execute(f'PRAGMA foreign_key_list("{t}")')] for t in rows}
    con.close()
    out: set[tuple[str, int]] = set()
    gone = set(lost)
    changed = True
    while changed:
        changed = False
        for table, by_rowid in rows.items():
            for column, parent in fks[table]:
                i = _columns(path, table).index(column)
                for rowid, values in by_rowid.items():
                    if (table, rowid) not in out and values[i] is not None and (parent, values[i]) in gone:
                        out.add((table, rowid))
                        gone.add((table, rowid))
                        changed = True
    return out


def _columns(path: Path, table: str) -> list[str]:
    if (path, table) not in _COLS:
        con = sqlite3.connect(path)
        _COLS[(path, table)] = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        con.close()
    return _COLS[(path, table)]


def test_recover_command_reports_saved_and_lost_per_table(original, tmp_path: Path) -> None:
    path, rows, pages, _schema = original
    damaged = tmp_path / "damaged.db"
    shutil.copy(path, damaged)
    # destroy the leaf page holding best config row 1 (and so the rows beside it)
    leaf = max(pages["best_configs"][min(rows["best_configs"])])
    on_leaf = {r for r, ps in pages["best_configs"].items() if leaf in ps}
    ps = _page_size(path.read_bytes()[:100])
    with open(damaged, "r+b") as f:
        f.seek((leaf - 1) * ps)
        f.write(b"\xff" * ps)
    target = tmp_path / "saved.db"
    result = CliRunner().invoke(cli, ["recover", str(damaged), str(target), "--method", "scan", "--format", "json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = {r["table"]: r for r in json.loads(result.stdout)}
    assert table["best_configs"]["saved"] == len(rows["best_configs"]) - len(on_leaf)
    assert table["best_configs"]["lost"] == len(on_leaf)  # the index still lists them
    assert table["guarded_entries"]["saved"] == len(rows["guarded_entries"]) and table["guarded_entries"]["lost"] == 0
    assert "rows saved" in result.stderr
    # the new database is a cachedb database: stats reads it, verify passes
    assert CliRunner().invoke(cli, ["verify", "--db", str(target)]).exit_code == 0
    again = CliRunner().invoke(cli, ["recover", str(damaged), str(target)])
    assert again.exit_code == 1 and "exists" in again.output


def test_scan_goes_past_a_damaged_leaf_when_the_indexes_are_damaged_too(original, tmp_path: Path) -> None:
    """No index to say which rowids follow: the scan seeks ahead past the damaged leaf."""
    path, rows, pages, _schema = original
    con = sqlite3.connect(path)
    (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'guarded_entries'").fetchone()
    index_roots = [r[0] for r in con.execute(
        "SELECT rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = 'guarded_entries'")]
    con.close()
    data = path.read_bytes()
    leaves: dict[int, int] = {}
    ps = _page_size(data)
    row_pages(data, ps, ps - data[20], root, leaves)
    order = sorted(leaves)
    leaf = leaves[order[len(order) // 3]]
    index_pages = {p for r in index_roots for p in _index_pages(data, r)}
    damaged = tmp_path / "damaged.db"
    shutil.copy(path, damaged)
    with open(damaged, "r+b") as f:
        for p in index_pages | {leaf}:
            f.seek((p - 1) * ps)
            f.write(b"\xff" * ps)
    report = recover(damaged, tmp_path / "saved.db", method="scan")
    got = _rows(tmp_path / "saved.db")["guarded_entries"]
    intact = {r for r, ps in pages["guarded_entries"].items() if not ps & (index_pages | {leaf})}
    after = {r for r in intact if r > max(r2 for r2, lf in leaves.items() if lf == leaf)}
    assert after and after <= set(got)  # rows beyond the damaged leaf, found with no index
    assert intact <= set(got) and all(got[r] == rows["guarded_entries"][r] for r in intact)
    assert {t.table: t for t in report.tables}["guarded_entries"].known is None


def _index_pages(data: bytes, root: int) -> set[int]:
    """The pages of the index b-tree at ``root`` (interior 0x02 and leaf 0x0a pages)."""
    seen: set[int] = set()
    ps = _page_size(data)

    def walk(n: int) -> None:
        seen.add(n)
        p = data[(n - 1) * ps:n * ps]
        if p[0] == 2:
            cells = int.from_bytes(p[3:5], "big")
            for i in range(cells):
                c = int.from_bytes(p[12 + 2 * i:14 + 2 * i], "big")
                walk(int.from_bytes(p[c:c + 4], "big"))
            walk(int.from_bytes(p[8:12], "big"))

    walk(root)
    return seen
