"""Synthetic but realistic cache contents: guarded-entry pickles, best configs, timings.

Nothing here needs torch at import time. The pickled entries are instances of
:class:`FakeCompiledFxGraph`, a dataclass pickled by the default ``__reduce_ex__`` exactly as
``CompiledFxGraph`` / ``AOTAutogradResult`` are (``NEWOBJ`` + state dict + ``BUILD``), so
cachedb's opcode scanner reads their ``guards_expr`` and ``_time_taken_ns`` as it would from
real entries, and ``pickle.loads`` (what Inductor does on a lookup) works in any process that
can import this module.

Byte sources, so that compression behaves as on real data: generated-code-like text is a
slice of torch's own ``torch/_inductor`` Python sources; binary blobs (kernels) are a slice of
``libtorch_cpu.so`` when it can be found, else a deterministic pseudo-random stream with
repetition.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachedb.keys import code_hash, sha256_hash

#: The CPU system hash (``hex("{}")``): what ``cache/<system hash>`` is named on CPU machines.
CPU_SYSTEM_HASH = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"

GUARDS = (None, "2 <= L['t0']", "2 <= L['t0'] and L['t0'] <= 4096", "4097 <= L['t0'] and 2 <= L['t1']")


@dataclass
class FakeCompiledFxGraph:
    """Stand-in for ``torch._inductor.output_code.CompiledFxGraph`` with the fields cachedb
    reads (``guards_expr``, ``_time_taken_ns``) and bulk like a real entry: generated source,
    per-node metadata tuples and kernel binaries."""

    guards_expr: str | None
    _time_taken_ns: int
    cache_key: str
    source_code: str
    metadata: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)
    kernel_binaries: list[bytes] = field(default_factory=list)
    nonce: int = 0


def _torch_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@functools.cache
def text_corpus() -> str:
    """About 9 MB of real Python source (torch/_inductor), or generated code-like text."""
    root = _torch_dir()
    parts: list[str] = []
    if root is not None:
        for path in sorted((root / "_inductor").rglob("*.py")):
            try:
                parts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
    text = "".join(parts)
    if len(text) < 1 << 20:
        rng = random.Random(0)
        words = ["tmp", "buf", "x0", "x1", "load", "store", "for", "auto", "float", "vec", "in_ptr0"]
        text = "\n".join(
            " ".join(rng.choice(words) + str(rng.randrange(64)) for _ in range(10)) for _ in range(200_000)
        )
    return text


@functools.cache
def _binary_source() -> Path | None:
    root = _torch_dir()
    if root is None:
        return None
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        path = root / "lib" / name
        if path.is_file() and path.stat().st_size > 64 << 20:
            return path
    return None


def binary_blob(size: int, offset: int = 0) -> bytes:
    """``size`` bytes of machine code (a slice of libtorch_cpu.so starting ``8 MB + offset``)."""
    src = _binary_source()
    if src is not None:
        total = src.stat().st_size
        start = (8 << 20) + offset % max(1, total - size - (8 << 20))
        with src.open("rb") as f:
            f.seek(start)
            data = f.read(size)
        if len(data) == size:
            return data
    rng = random.Random(offset)
    chunk = rng.randbytes(4096)
    out = bytearray()
    while len(out) < size:
        out += chunk[: rng.randrange(64, 4096)] + rng.randbytes(256)
    return bytes(out[:size])


def fx_entry(
    size: int, nonce: int, *, guards_expr: str | None = None, binary: bytes | None = None
) -> bytes:
    """A pickled :class:`FakeCompiledFxGraph` of about ``size`` bytes (unique per ``nonce``).

    Mix, as in real entries: ~40 % generated-code text (capped at 2 MB), one metadata tuple
    per ~500 bytes (capped at 5,000; real CPU entries of ~80 KB hold ~1,600 pickle opcodes,
    these ~2,000 per 100 KB), the rest kernel
    binaries (``binary``, if given, is used for them so large payloads can share one read).
    """
    corpus = text_corpus()
    n_text = min(int(size * 0.4), 2 << 20)
    start = (nonce * 7919) % max(1, len(corpus) - n_text)
    source = corpus[start : start + n_text]
    n_meta = min(max(size // 500, 4), 5_000)
    metadata = [(f"buf{i}", i * 31 + nonce, (i % 7 + 1, 64, 1)) for i in range(n_meta)]
    probe = FakeCompiledFxGraph(guards_expr, 0, "", source, metadata, [], nonce)
    import pickle

    base = len(pickle.dumps(probe))
    n_bin = max(0, size - base - 64)
    blob = binary[:n_bin] if binary is not None and len(binary) >= n_bin else binary_blob(n_bin, nonce * 4096)
    entry = FakeCompiledFxGraph(
        guards_expr=guards_expr,
        _time_taken_ns=1_000_000 + nonce,
        cache_key=code_hash(source),
        source_code=source,
        metadata=metadata,
        kernel_binaries=[blob] if blob else [],
        nonce=nonce,
    )
    return pickle.dumps(entry)


def fx_key(i: int, prefix: str = "f") -> str:
    """An FX (``f``) or AOTAutograd (``a``) cache key shaped like Inductor's
    (``prefix + sha256_hash(details)``)."""
    return prefix + sha256_hash(f"details-{prefix}-{i}".encode())


def best_config(i: int) -> dict[str, Any]:
    """A best config as ``AutotuneCache._save`` writes it (kwargs first, then the fixed keys)."""
    rng = random.Random(i)
    return {
        "XBLOCK": rng.choice([64, 128, 256, 512, 1024]),
        "R0_BLOCK": rng.choice([8, 16, 32, 64]),
        "num_warps": rng.choice([2, 4, 8]),
        "num_stages": rng.choice([1, 2, 3]),
        "configs_hash": hashlib.sha256(f"configs-{i % 97}".encode()).hexdigest(),
        "found_by_coordesc": bool(i % 3 == 0),
        "time_taken_ms": 100 + i % 2000,
        "triton_cache_hash": None,
    }


def best_config_rel_key(i: int) -> str:
    """``"<k[1:3]>/<name>.best_config"``: next to a kernel module ``<k[1:3]>/<k>.py``."""
    kernel = code_hash(f"kernel source {i}")
    name = hashlib.sha256(f"prepare-{i}".encode()).hexdigest()
    return f"{kernel[1:3]}/{name}.best_config"


# --------------------------------------------------------------------------- autotune timings

OPS = ("mm", "addmm", "bmm", "convolution")
CHOICES_PER_INPUT = 10
PRECISION = "highest"


def inputs_key(i: int) -> str:
    """``repr([(device, dtype, *sizes, *strides, offset), ...])`` as ``AlgorithmSelectorCache``
    builds it, distinct per ``i``."""
    m, n, k = 16 * (1 + i % 257), 64 * (1 + (i // 257) % 61), 32 * (1 + i // (257 * 61))
    return repr(
        [
            ("cpu", "torch.float32", m, k, k, 1, 0),
            ("cpu", "torch.float32", k, n, n, 1, 0),
            ("cpu", "torch.float32", n, 1, 0),
        ]
    )


def choice_hashes(i: int) -> list[str]:
    """``ChoiceCaller.hash_key()``-like names of the ``CHOICES_PER_INPUT`` choices of ``i``."""
    out = [f"_linear_pointwise-algorithm=''-attr='none'-scalars=[]-{sha256_hash(f'aten{i}'.encode())}"]
    out += [
        f"CppMicroGemmFP32Vec-{sha256_hash(f'cpp{i}-{c}'.encode())}" for c in range(CHOICES_PER_INPUT - 1)
    ]
    return out


def timing_key(i: int) -> tuple[str, str]:
    """``(op, inputs)`` of the ``i``-th stored (op, inputs) pair."""
    return OPS[i % len(OPS)], inputs_key(i // len(OPS))


def timings_for(i: int) -> dict[str, float]:
    rng = random.Random(i)
    return {c: round(rng.uniform(0.01, 10.0), 6) for c in choice_hashes(i)}


def timings_document(n_timings: int) -> dict[str, Any]:
    """The ``"cache"`` object of ``cache/<system hash>`` holding ``n_timings`` timings:
    ``cache[op][inputs][precision][choice] = ms``, spread over :data:`OPS`."""
    cache: dict[str, Any] = {}
    for i in range(n_timings // CHOICES_PER_INPUT):
        op, inputs = timing_key(i)
        cache.setdefault(op, {})[inputs] = {PRECISION: timings_for(i)}
    return cache


# --------------------------------------------------------------------------- a cache directory


def write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def synthetic_cache_dir(
    root: Path, n_files: int, *, entry_bytes: int = 2000, timings: int = 5000
) -> dict[str, int]:
    """Write an Inductor-shaped cache dir of about ``n_files`` files under ``root``.

    70 % FX entries ``fxgraph/<k[1:3]>/<key>/<sha256_hash(bytes)>``, 20 % AOTAutograd entries
    ``aotautograd/<key>/<variant>`` (a quarter of the keys with a second guarded variant),
    the rest ``<k[1:3]>/<name>.best_config`` files, plus one ``cache/<system hash>`` JSON
    document with ``timings`` timings written as ``CacheBase.update_local_cache`` writes it
    (``indent=4``). Entries are real pickles of ~``entry_bytes`` bytes. Returns the count of
    files per kind.
    """
    counts = {"fxgraph": 0, "aotautograd": 0, "best_config": 0, "cache": 0}
    n_fx = int(n_files * 0.7)
    n_aot = int(n_files * 0.2)
    n_bc = max(0, n_files - n_fx - n_aot - 1)
    binary = binary_blob(entry_bytes, 0)
    for i in range(n_fx):
        key = fx_key(i, "f")
        data = fx_entry(entry_bytes, i, guards_expr=GUARDS[i % len(GUARDS)], binary=binary)
        write_file(root / "fxgraph" / key[1:3] / key / sha256_hash(data), data)
        counts["fxgraph"] += 1
    i = 0
    made = 0
    while made < n_aot:
        key = fx_key(i, "a")
        variants = 2 if i % 4 == 0 else 1
        for v in range(min(variants, n_aot - made)):
            data = fx_entry(entry_bytes, 1_000_000 + i * 2 + v, guards_expr=GUARDS[(i + v) % 4], binary=binary)
            write_file(root / "aotautograd" / key / sha256_hash(data), data)
            made += 1
        i += 1
    counts["aotautograd"] = made
    for j in range(n_bc):
        write_file(root / best_config_rel_key(j), json.dumps(best_config(j)).encode("ascii"))
        counts["best_config"] += 1
    doc = {"system": {"hash": CPU_SYSTEM_HASH}, "cache": timings_document(timings)}
    write_file(root / "cache" / CPU_SYSTEM_HASH, json.dumps(doc, indent=4).encode("utf-8"))
    counts["cache"] = 1
    return counts


def dir_bytes(root: Path, *, only_cachedb_kinds: bool = False) -> tuple[int, int, int]:
    """``(files, apparent bytes, allocated bytes)`` under ``root`` (allocated = st_blocks *
    512, what the file system really spends). With ``only_cachedb_kinds`` only the files cachedb
    stores count (fxgraph/, aotautograd/, cache/<hash>, *.best_config, configs_*.json)."""
    files = apparent = allocated = 0
    for dirpath, _dirs, names in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        top = rel_dir.split(os.sep)[0]
        for name in names:
            if only_cachedb_kinds and not (
                top in ("fxgraph", "aotautograd", "cache")
                or name.endswith(".best_config")
                or (rel_dir == "." and name.startswith("configs_") and name.endswith(".json"))
            ):
                continue
            if name.startswith("."):
                continue
            st = os.stat(os.path.join(dirpath, name))
            files += 1
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return files, apparent, allocated
