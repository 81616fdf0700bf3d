"""Property-based fuzzing of Mega-Cache blobs (``torch.compiler.save_cache_artifacts()`` format)
fed to :func:`cachedb.layout.mega_cache.import_artifacts`.

Blobs are written with torch's own ``BytesWriter`` (crc32 ‖ u64 version ‖ chunks of
``type, n, n × (key, content)``) from generated artifacts (pickled entries, best configs, other
types), then sometimes mutated with or without a recomputed checksum. Only
:class:`cachedb.CacheDBError` may escape; every artifact a report counts as stored is stored
byte-identical; nothing already in the database is lost.
"""

from __future__ import annotations

import pickle
import zlib

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from cachedb import CacheDBError

from . import _strategies as S
from . import figures
from ._store import Store
from ._synth import CompiledFxGraph

torch = pytest.importorskip("torch")
mega_cache = pytest.importorskip("cachedb.layout.mega_cache")
from torch.utils._appending_byte_serializer import BytesWriter  # noqa: E402

EXAMPLES = 120
B32 = "abcdefghijklmnopqrstuvwxyz234567"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    scratch = tmp_path_factory.mktemp("fuzz_mega")
    store = Store.create(scratch / "populated.db", scratch, seed=11)
    yield store
    lost = store.lost()
    figures.add("fuzz_mega_cache", entries_lost=lost)
    store.db.close()
    assert lost == 0


def write_blob(chunks: list[tuple[str, list[tuple[str, bytes]]]], version: int = 1) -> bytes:
    writer = BytesWriter()
    writer.write_uint64(version)
    for type_, artifacts in chunks:
        writer.write_str(type_)
        writer.write_uint64(len(artifacts))
        for key, content in artifacts:
            writer.write_str(key)
            writer.write_bytes(content)
    return writer.to_bytes()


def recrc(data: bytes) -> bytes:
    return zlib.crc32(data[4:]).to_bytes(4, "big") + data[4:] if len(data) >= 4 else data


@st.composite
def artifacts(draw: st.DrawFn, hostile: bool) -> tuple[str, list[tuple[str, bytes]]]:
    type_ = draw(st.sampled_from(["inductor", "aot_autograd", "autotune", "pgo", "precompile", "other"]))
    if type_ == "other":
        type_ = draw(S.texts(False, 12))
    n = draw(st.integers(0, 3))
    out = []
    for _ in range(n):
        if type_ == "inductor":
            key = draw(st.one_of(st.text(B32, min_size=8, max_size=51).map(lambda s: "f" + s), S.texts(False, 12)))
            content = draw(S.pickle_bytes(hostile))
        elif type_ == "aot_autograd":
            key = "a" + draw(st.text(B32, min_size=1, max_size=51))
            content = draw(S.pickle_bytes(hostile))
        elif type_ == "autotune":
            key = draw(st.one_of(st.builds(lambda a, b: f"{a}/{b}.best_config", st.text("abcdef", min_size=2, max_size=2),
                                           st.text("abcdef012", min_size=1, max_size=10)), S.texts(False, 16)))
            content = draw(S.best_config_bytes(hostile))
        else:
            key, content = draw(S.texts(False, 12)), draw(st.binary(max_size=32))
        out.append((key, content))
    return type_, out


@st.composite
def blobs(draw: st.DrawFn, hostile: bool) -> bytes:
    chunks = draw(st.lists(artifacts(hostile), max_size=4))
    data = write_blob(chunks, version=draw(st.sampled_from([1, 1, 1, 1, 2, 0])))
    how = draw(st.sampled_from(["valid", "valid", "mutated+crc", "mutated", "binary"]))
    if how == "binary":
        return draw(st.binary(max_size=64))
    if how.startswith("mutated"):
        data = draw(S.mutated(data))
        if how == "mutated+crc":
            data = recrc(data)
    return data


def blob_bug(data: bytes) -> str | None:
    try:
        chunks = mega_cache.read_artifacts(data)
    except Exception:
        return None
    for type_, arts in chunks:
        for art in arts:
            content = bytes(getattr(art, "content", b""))
            if type_ in ("inductor", "aot_autograd") and S.pickle_bug(content):
                return S.pickle_bug(content)
            if type_ == "autotune" and S.best_config_bug(content):
                return S.best_config_bug(content)
    return None


_big = CompiledFxGraph()
_big.__dict__.update(guards_expr=None, _time_taken_ns=2**64)


@pytest.mark.parametrize("hostile", [pytest.param(False, id="clean"), pytest.param(True, id="hostile")])
def test_fuzz_import_artifacts(store: Store, hostile: bool) -> None:
    counts = {"n": 0, "refused": 0, "stored": 0}

    @S.fuzz_settings(EXAMPLES, hostile=hostile)
    @given(data=blobs(hostile))
    @example(data=write_blob([("inductor", [("fbig", pickle.dumps(_big))])])).via("P1") if hostile else (lambda f: f)
    def run(data: bytes) -> None:
        if not hostile:
            assume(blob_bug(data) is None)
        counts["n"] += 1
        try:
            report = mega_cache.import_artifacts(store.db, data, where="fuzz.bin")
        except CacheDBError:
            counts["refused"] += 1
            return
        counts["refused"] += bool(report.problems)
        stored = sum(report.added.values())
        counts["stored"] += stored
        if stored:
            chunks = mega_cache.read_artifacts(data)
            with store.db.read() as repos:
                for type_, arts in chunks:
                    for art in arts:
                        kind = mega_cache.KIND_OF_TYPE.get(type_)
                        problem = f"{type_}:{art.key}" in {p.path for p in report.problems}
                        if kind in ("fxgraph", "aotautograd") and not problem:
                            found = dict(repos.guarded.candidates(kind, art.key))
                            assert bytes(art.content) in found.values()

    run()
    figures.add("fuzz_mega_cache", fuzz_cases=counts["n"], refused_as_bad_input=counts["refused"],
                artifacts_stored=counts["stored"])
