"""A synthetic but realistic Inductor cache directory, built in milliseconds.

Layout and naming follow what torch 2.13 writes (see cachedb.layout.importer's module docstring):

- ``fxgraph/<key[1:3]>/<key>/<variant>``: pickles of an object whose state carries
  ``guards_expr`` and ``_time_taken_ns`` (like ``CompiledFxGraph``), the variant being
  ``cachedb.keys.sha256_hash`` of the pickle's bytes, several variants per key;
- ``aotautograd/<key>/<variant>``: pickles with ``guards_expr`` and
  ``forward_time_taken_ns``/``backward_time_taken_ns`` (like ``AOTAutogradResult``);
- ``<k[1:3]>/<name>.best_config``: Triton best configs as ``AutotuneCache._save`` writes them;
- ``cache/<64-hex system hash>``: ``{"system": ..., "cache": ...}`` in Inductor's
  ``json.dumps(indent=4)`` form, with autotune timings (some with a hint override) and other
  ``LocalCache`` values;
- noise Inductor also leaves there (kernel sources, ``.so``, locks, write_atomic
  temporaries), which the importer must ignore.

The pickled classes live in this module; cachedb never imports them (it never unpickles).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

from cachedb.layout.importer import scan
from cachedb.keys import sha256_hash


class CompiledFxGraph:  # stand-in: pickled with the default __reduce_ex__, like torch's dataclass
    pass


class AOTAutogradResult:
    pass


_GUARDS = [
    None,
    "2 <= L['t0'] and L['t0'] <= 4096 and 2 <= L['t1']",
    "4097 <= L['t0'] and 2 <= L['t1']",
    "L['x'].size()[0] == 8 and L['y'].stride()[1] == 1",
]

_CHOICES = [
    "extern_mm",
    "cpp_gemm_template_0",
    "triton_mm_1_BLOCK_M=64_BLOCK_N=64_BLOCK_K=32_num_stages=3_num_warps=4",
    "triton_mm_2_BLOCK_M=128_BLOCK_N=128_BLOCK_K=64_num_stages=4_num_warps=8",
]


def _key(prefix: str, rng: random.Random) -> str:
    return prefix + sha256_hash(rng.randbytes(32))


def _payload_state(rng: random.Random, size: int) -> dict:
    # Inductor entries carry generated source (compressible) and constants (less so).
    lines = [f"    buf{i} = extern_kernels.mm(arg{i % 7}_1, arg{(i + 3) % 7}_1)\n" for i in range(size // 120)]
    return {
        "source_code": "".join(lines),
        "constants": rng.randbytes(size // 3),
        "cache_key": hashlib.sha256(rng.randbytes(8)).hexdigest(),
    }


def fx_pickle(rng: random.Random, size: int) -> bytes:
    obj = CompiledFxGraph()
    obj.__dict__.update(
        guards_expr=rng.choice(_GUARDS), _time_taken_ns=rng.randrange(10**6, 10**10), **_payload_state(rng, size)
    )
    return pickle.dumps(obj, protocol=rng.choice([2, 4, 5]))


def aot_pickle(rng: random.Random, size: int) -> bytes:
    obj = AOTAutogradResult()
    obj.__dict__.update(
        guards_expr=rng.choice(_GUARDS),
        forward_time_taken_ns=rng.randrange(10**6, 10**9),
        backward_time_taken_ns=rng.randrange(10**6, 10**9),
        **_payload_state(rng, size),
    )
    return pickle.dumps(obj, protocol=rng.choice([4, 5]))


def best_config_text(rng: random.Random) -> str:
    data = {
        "XBLOCK": rng.choice([64, 128, 256, 1024]),
        "R0_BLOCK": rng.choice([8, 16, 32]),
        "num_warps": rng.choice([2, 4, 8]),
        "num_stages": rng.choice([1, 2, 3]),
        "configs_hash": hashlib.sha256(rng.randbytes(8)).hexdigest(),
        "found_by_coordesc": rng.random() < 0.3,
        "time_taken_ms": rng.randrange(1, 5000),
        "triton_cache_hash": hashlib.sha256(rng.randbytes(8)).hexdigest()[:52],
    }
    return json.dumps(data)


def local_cache_doc(rng: random.Random, system_hash: str, n_inputs: int) -> tuple[str, int]:
    """``cache/<hash>`` text and its number of leaves."""
    system = {
        "device": {"name": "NVIDIA H100 80GB HBM3"},
        "version": {"triton": "3.5.0" + system_hash[:8], "cuda": "12.8"},
        "hash": system_hash,
    }
    cache: dict = {}
    for op in ("mm", "addmm", "bmm"):
        per_op = cache.setdefault(op, {})
        for i in range(n_inputs):
            m, n, k = (rng.choice([64, 128, 512, 1024, 4096]) for _ in range(3))
            inputs = f"[('cuda', 'torch.float16', {m}, {k}, {k}, 1, 0), ('cuda', 'torch.float16', {k}, {n}, {n}, 1, 0)]"
            if i % 5 == 4:
                inputs += f"_{rng.choice([256, 4096])}"  # hint override
            per_prec = per_op.setdefault(inputs, {})
            for prec in rng.sample(["highest", "high", "medium"], rng.randint(1, 2)):
                per_prec[prec] = {c: rng.uniform(0.001, 3.0) for c in rng.sample(_CHOICES, rng.randint(2, 4))}
    cache["pad_mm"] = {hashlib.sha256(rng.randbytes(8)).hexdigest(): rng.random() < 0.5 for _ in range(5)}
    cache["estimates"] = {"version": 2, "kernels": {"k1": 1.5, "k2": [1, 2, 3]}}
    return json.dumps({"system": system, "cache": cache}, indent=4), _leaves(cache)


def _leaves(value: object) -> int:
    if isinstance(value, dict) and value:
        return sum(_leaves(v) for v in value.values())
    return 1


@dataclass
class SynthCache:
    root: Path
    guarded: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # (kind, key, variant)
    best_configs: dict[str, str] = field(default_factory=dict)
    docs: dict[str, int] = field(default_factory=dict)  # system hash -> leaves
    order: list[str] = field(default_factory=list)  # importer's item order (relative paths)

    def item_id(self, rel: str) -> tuple:
        parts = rel.split("/")
        if parts[0] in ("fxgraph", "aotautograd"):
            return ("guarded", parts[0], parts[-2], parts[-1])
        if parts[0] == "cache":
            return ("doc", parts[1])
        return ("best_config", rel)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def build(root: Path, *, seed: int = 0, fx_keys: int = 90, aot_keys: int = 40, best_configs: int = 60,
          docs: int = 2, max_payload: int = 24_000) -> SynthCache:
    """Write a synthetic cache under ``root`` and return what it holds."""
    rng = random.Random(seed)
    out = SynthCache(Path(root))
    for kind, n_keys, prefix, make in (
        ("fxgraph", fx_keys, "f", fx_pickle),
        ("aotautograd", aot_keys, "a", aot_pickle),
    ):
        for _ in range(n_keys):
            key = _key(prefix, rng)
            for _ in range(rng.choice([1, 1, 2, 3, 4])):
                data = make(rng, rng.randrange(600, max_payload))
                variant = sha256_hash(data)
                rel = f"fxgraph/{key[1:3]}/{key}/{variant}" if kind == "fxgraph" else f"aotautograd/{key}/{variant}"
                _write(out.root / rel, data)
                out.guarded[(kind, key, variant)] = data
            if kind == "fxgraph" and rng.random() < 0.3:  # a write_atomic temporary: skipped
                _write(out.root / f"fxgraph/{key[1:3]}/{key}/.tmp{rng.randrange(10**6)}", b"partial")
    for _ in range(best_configs):
        name = "c" + sha256_hash(rng.randbytes(16))
        rel = f"{name[1:3]}/{name}.best_config"
        text = best_config_text(rng)
        _write(out.root / rel, text.encode())
        out.best_configs[rel] = text
        if rng.random() < 0.5:  # the kernel source next to it: not cachedb's
            _write(out.root / f"{name[1:3]}/{name}.py", b"# triton kernel\n" * 40)
    for _ in range(docs):
        system_hash = hashlib.sha256(rng.randbytes(16)).hexdigest()
        text, leaves = local_cache_doc(rng, system_hash, n_inputs=12)
        _write(out.root / "cache" / system_hash, text.encode())
        out.docs[system_hash] = leaves
    _write(out.root / "locks" / "abc.lock", b"")
    _write(out.root / "aa" / "kernel.so", os.urandom(64))
    items, problems, _ = scan(out.root)
    assert problems == [], problems
    out.order = [i.rel for i in items]
    return out
