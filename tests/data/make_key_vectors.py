"""Write tests/data/key_vectors/torch-<VERSION>.json: frozen test vectors for cachedb.keys,
computed by the installed torch (any release from 2.9 on), one file per torch release.

Run with the torch the vectors are for installed (Python 3.11: the ``installed`` torch_key
depends on the interpreter's extension suffixes), e.g. in a ``.ci/compat`` environment:

    python tests/data/make_key_vectors.py                  # writes key_vectors/torch-<VERSION>.json
    python tests/data/make_key_vectors.py --out FILE       # writes FILE instead
    python tests/data/make_key_vectors.py --compare FILE   # FILE equals the frozen file of its torch?

The ``gpu`` section (``backend_hash``, a real GPU ``get_system()``; a list, one entry per GPU
measured) needs Triton and a GPU. On such a machine ``make_key_vectors.py --gpu-only gpu.json``
writes one entry; ``make_key_vectors.py --gpu-from gpu.json`` then adds it here. Entries
already in the output file are kept.

Every expected value below comes from torch's own code, called on a fixed list of inputs:
plain functions directly (``codecache.sha256_hash``, ``code_hash``, ``get_path``,
``get_hash``, ``build_code_hash``, ``hash_configs``, ``_comment_stripped_hash``,
``get_config_request_key``, ``_isolation_key``, ...), stateful ones through torch's own
seams: ``TORCHINDUCTOR_CACHE_DIR`` / ``fresh_cache()``, ``config.patch``,
``torch.compiler.config.patch``, ``torch_key.set`` (prefetchable_cache's prepopulate API),
and the remote-cache ``backend_override_cls`` hook with an in-memory backend. Nothing of
torch is mocked. Two exceptions, said where they occur: the synthetic ``torch_key`` trees
(torch_key() only hashes the installed torch, so those cases run torch's build_code_hash
inside the 6-line wrapper torch_key's body uses), and the ``gpu`` section (Triton and a GPU
are needed; it is carried over from the existing file when this machine has neither).

cachedb.keys is never imported here: the vectors must not depend on the code they test.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.machinery
import inspect
import json
import os
import random
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

VECTORS_DIR = Path(__file__).with_name("key_vectors")


def vectors_file(torch_version: str) -> Path:
    """The frozen file of a torch release: ``torch.__version__`` without its local part."""
    return VECTORS_DIR / f"torch-{torch_version.split('+')[0]}.json"


def release(torch_version: str) -> tuple[int, int]:
    major, minor = torch_version.split(".")[:2]
    return int(major), int(minor)

# Placeholder written instead of the temporary directories the stateful cases run in.
BASE = "/CACHE"


def enc(value: str | bytes) -> dict[str, str]:
    """JSON form of a str-or-bytes input (the tests decode it with the same tags)."""
    if isinstance(value, bytes):
        return {"bytes_b64": base64.b64encode(value).decode()}
    return {"str": value}


def blob(data: bytes) -> str:
    """Large byte strings: base64 of zlib."""
    return base64.b64encode(zlib.compress(data, 9)).decode()


def strings(rng: random.Random, n: int) -> list[str]:
    alphabet = "abcXYZ019 _-./:#\n\t'\"\\[](){}é漢😀\x00\x7f"
    out = ["", "a", "x" * 1000, "def kernel():\n    pass\n", "é漢😀", "\x00"]
    while len(out) < n:
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))
    return out


def byte_strings(rng: random.Random, n: int) -> list[bytes]:
    out = [b"", b"\x00", b"\xff" * 33, b"||", bytes(range(256))]
    while len(out) < n:
        out.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 80))))
    return out


def materialize(root: Path, tree: dict[str, Any]) -> None:
    """tree: {relative path: str contents | None (a directory)}."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in sorted(tree.items()):
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("utf-8"))


EXT = importlib.machinery.EXTENSION_SUFFIXES[0]

#: Source trees for build_code_hash / cutlass_key / torch_key. Values are file contents
#: (text) or None for an (empty) directory.
TREES: list[dict[str, Any]] = [
    {},
    {"a.py": "A = 1\n"},
    {"a.py": "x", "b.pyc": "compiled", "c.txt": "not a module", "d.so": "ext", f"e{EXT}": "ext2"},
    {
        "pkg/__init__.py": "# pkg\n",
        "pkg/mod.py": "m = 1\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "d\n",
        "pkg/__pycache__/mod.cpython-311.pyc": "cached",
        "pkg/notpkg/x.py": "outside any package\n",
        "pkg.py": "same name as the package\n",
        "zz.py": "z",
        "_private.py": "p",
        "A.py": "upper",
    },
    {"python/cutlass_library/__init__.py": "", "python/cutlass_library/gen.py": "g"},
    {"cutlass_library/__init__.py": "lib", "cutlass_library/generator.py": "gen\n", "pycute/__init__.py": "cute"},
    {"m.py": "source", "m.pyc": "bytecode", f"m{EXT}": "extension wins"},
    {"pkg/__init__.pyc": "sourceless package", "pkg/x.py": "x"},
    {"a.b.py": "dotted: skipped", ".hidden.py": "skipped", "ok.py": "ok", "empty_dir": None},
    {"_inductor/codegen/aoti_runtime/interface.cpp": "// iface\n", "_inductor/script.ld": "SECTIONS {}\n",
     "_inductor/codegen/aoti_runtime/streams.h": "// streams (hashed from 2.14 on)\n",
     "_inductor/__init__.py": "", "_inductor/codecache.py": "cc", "__init__.py": "torch", "version.py": "v"},
]
#: Trees torch refuses (its build_code_hash fails an assertion): a directory named like a
#: module, and a package whose __init__.py is a directory. (With a same-named pkg.py beside
#: the latter torch does not fail but hashes all of sys.path: no vector can be made of that.)
BAD_TREES: list[dict[str, Any]] = [
    {"bad.py": None},
    {"pkg/__init__.py": None},
]


def system_strategy_key(hash_input: dict[str, Any]) -> str:
    """The system hash of torch's own code: 2.13+ ``SYSTEM_CACHE_KEY_STRATEGY.key_from_json``;
    2.9 to 2.12 spell the same formula inline in ``CacheBase.get_system``."""
    try:
        from torch._inductor.cache_key import SYSTEM_CACHE_KEY_STRATEGY
    except ImportError:
        return hashlib.sha256(json.dumps(hash_input, sort_keys=True).encode("utf-8")).hexdigest()
    return SYSTEM_CACHE_KEY_STRATEGY.key_from_json(hash_input)


def cutlass_modules() -> tuple[Any, Any, Any, str]:
    """(cache module, serialization module, utils module, config name of cutlass_dir): 2.11+
    codegen/cutlass/{cache,serialization,utils}.py; 2.9/2.10 codegen/cuda/{cutlass_cache,
    serialization,cutlass_utils}.py with ``config.cuda.cutlass_dir``."""
    try:
        from torch._inductor.codegen.cutlass import cache, serialization, utils

        return cache, serialization, utils, "cutlass.cutlass_dir"
    except ImportError:
        from torch._inductor.codegen.cuda import cutlass_cache, cutlass_utils, serialization

        return cutlass_cache, serialization, cutlass_utils, "cuda.cutlass_dir"


def torch_key_extra_files(codecache: Any) -> list[str]:
    """The ``extra_files`` tuple of this torch's ``torch_key`` (its source text, read as is)."""
    import re

    source = inspect.getsource(codecache)
    body = source[source.index("def torch_key()"):]
    body = body[:body.index("\ndef ", 1)]
    match = re.search(r"extra_files = \(([^)]*)\)", body)
    assert match is not None, "torch_key has no extra_files tuple"
    return re.findall(r"\"([^\"]+)\"", match.group(1))


def artifact_key(cache: Any, recorded: Any) -> str:
    """The Mega-Cache key of the best config ``cache.save`` just recorded: 2.13+ keep it on
    ``cache.artifact_recorder``; 2.9 to 2.12 record it in ``CacheArtifactManager``."""
    recorder = getattr(cache, "artifact_recorder", None)
    if recorder is not None:
        return recorder.key
    return recorded["autotune"][-1].key


def main(out_path: Path | None = None, gpu_from: Path | None = None) -> None:
    import torch
    from torch._inductor import codecache, config
    from torch._inductor import utils as inductor_utils
    from torch.compiler._cache import CacheArtifactManager

    cutlass_cache, cutlass_serialization, cutlass_utils, cutlass_dir_key = cutlass_modules()
    torch_release = release(str(torch.__version__))
    out_path = out_path or vectors_file(str(torch.__version__))
    extra_files = torch_key_extra_files(codecache)
    from torch._inductor.remote_cache import (
        RedisRemoteCache,
        RemoteAutotuneCache,
        RemoteBundledAutotuneCache,
        RemoteCacheBackend,
    )
    from torch._inductor.runtime import autotune_cache as ac
    from torch._inductor.runtime import triton_heuristics
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    rng = random.Random(20260121)
    out: dict[str, Any] = {
        "meta": {
            "generated_by": "tests/data/make_key_vectors.py",
            "torch_version": str(torch.__version__),
            "python": sys.version.split()[0],
            "extension_suffixes": list(importlib.machinery.EXTENSION_SUFFIXES),
            "base_placeholder": BASE,
        }
    }

    # ---- sha256_hash, code_hash, get_hash ------------------------------------------------
    texts = strings(rng, 30)
    blobs = byte_strings(rng, 20)
    # 2.9 to 2.12 hash bytes only (a str raises TypeError there): those cases are left out.
    out["sha256_hash"] = [
        {"data": enc(d), "expected": codecache.sha256_hash(d)}
        for d in [*blobs, *texts[:10]] if isinstance(d, bytes) or torch_release >= (2, 13)
    ]
    code_cases: list[tuple[str | bytes, str | bytes | None]] = []
    for i, t in enumerate(texts):
        code_cases.append((t, None))
        code_cases.append((t, texts[(i * 7 + 3) % len(texts)]))
    for i, b in enumerate(blobs):
        code_cases.append((b, blobs[(i + 1) % len(blobs)]))
        code_cases.append((b, b""))
    code_cases += [("x", b"y"), (b"x", "y"), ("", ""), ("a", "||b")]
    out["code_hash"] = [
        {"code": enc(c), **({} if e is None else {"extra": enc(e)}),
         "expected": codecache.code_hash(c) if e is None else codecache.code_hash(c, e)}
        for c, e in code_cases
    ]
    # 2.9/2.10 have no XPU binary kind (no XPU_KERNEL_FORMAT): "zebin" is refused there.
    xpu_format = getattr(inductor_utils, "XPU_KERNEL_FORMAT", None)
    hash_cases: list[dict[str, Any]] = []
    for hash_type in ["code", "ptx", "amdgcn", "spv", "cubin", "hsaco", xpu_format or "zebin", "elf"]:
        for content, extra in [(texts[4], ""), (texts[5], texts[6]), (blobs[3], ""), (blobs[6], "ignored?")]:
            if isinstance(content, bytes) and hash_type in {"code", "ptx", "amdgcn", "spv"} and extra:
                continue
            try:
                expected: str | None = codecache.get_hash(content, extra, hash_type)
            except AssertionError:  # torch: "Unknown hash type"
                expected = None
            hash_cases.append({"content": enc(content), "extra": enc(extra), "hash_type": hash_type,
                               "expected": expected})
    out["get_hash"] = {"xpu_kernel_format": xpu_format, "cases": hash_cases}

    # ---- get_path (cache_dir() from TORCHINDUCTOR_CACHE_DIR) ------------------------------
    path_cases = []
    with tempfile.TemporaryDirectory() as tmp:
        fake_cache = os.path.join(tmp, "inductor cache")
        old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = fake_cache
        try:
            for basename, ext, spec in [
                (codecache.code_hash("x"), "py", ""),
                ("fabcdef", "best_config", ""),
                ("", "py", ""),
                ("a", "so", ""),
                ("cxy", "main.cpp", "sub"),
                ("cxy", "json", "/abs/dir"),
                ("c漢字", "py", ""),
                ("k", "", "a/b"),
            ]:
                got = codecache.get_path(basename, ext, spec)
                path_cases.append({
                    "basename": basename, "extension": ext, "specified_dir": spec,
                    "expected": [p.replace(cache_dir(), BASE) if p.startswith(cache_dir()) else p for p in got],
                })
        finally:
            if old is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    out["get_path"] = path_cases

    # ---- system hash ------------------------------------------------------------------------
    gpu_like = [
        ("NVIDIA H100 80GB HBM3", "a" * 64, "13.0", None),
        ("NVIDIA H200", None, "12.8", None),
        ("gfx942:sramecc+:xnack-", "tk", None, "6.4.43482"),
        ("Ünïcødé GPU", "k", "12.4", "ignored"),
    ]
    system_cases = []
    for name, tk, cuda, hip in gpu_like:
        device_info = {"name": name}
        version_info: dict[str, Any] = {"triton": tk}
        if cuda is not None:
            version_info["cuda"] = cuda
        else:
            version_info["hip"] = hip
        # The dict CacheBase.get_system's GPU branch builds (2.15 puts "version" first); the
        # hash is torch's strategy.
        if torch_release >= (2, 15):
            hash_input: dict[str, Any] = {"version": version_info, "device": device_info}
        else:
            hash_input = {"device": device_info, "version": version_info}
        system_cases.append({
            "args": [name, tk, cuda, hip],
            "expected": {**hash_input, "hash": system_strategy_key(hash_input)},
        })
    codecache.CacheBase.get_system.cache_clear()
    this_machine = codecache.CacheBase.get_system()
    # Without a GPU: get_system() itself, with triton_key() prepopulated (its prefetchable
    # cache's set(), 2.13+) to other Triton keys.
    cpu_cases = []
    if hasattr(getattr(codecache, "triton_key", None), "set") and "device" not in this_machine:
        real_triton_key = codecache.triton_key()
        for tk in ["3.9.0" + "0" * 64, "k", "é漢"]:
            codecache.triton_key.clear()
            codecache.triton_key.set(tk)
            codecache.CacheBase.get_system.cache_clear()
            cpu_cases.append({"triton_key": tk, "expected": codecache.CacheBase.get_system()})
        codecache.triton_key.clear()
        codecache.triton_key.set(real_triton_key)
        codecache.CacheBase.get_system.cache_clear()
    out["system"] = {"this_machine": this_machine, "cases": system_cases, "cpu_cases": cpu_cases}

    # ---- PersistentCache keys (through PersistentCache.lookup, read back from the file) -----
    class Choice:  # PersistentCache only calls hash_key() on a choice
        def __init__(self, key: str) -> None:
            self.key = key

        def hash_key(self) -> str:
            return self.key

    inputs_cases = []
    inputs_list = [
        "[('cpu', 'torch.float32', 64, 64, 64, 1, 0), ('cpu', 'torch.float32', 64, 64, 64, 1, 0)]",
        "[('cuda', 'torch.bfloat16', 256, 4096, 0, 1, 0)]",
        "[]",
        "[('cuda', 'torch.float16', 8, 1, 0)]_7",
    ]
    hints: list[int | None] = [None, 0, 1, -3, 4096, 10**12]
    with inductor_utils.fresh_cache():
        pc = codecache.PersistentCache()
        for i, inputs in enumerate(inputs_list):
            for j, hint in enumerate(hints):
                op = f"op{i}_{j}"
                choice = Choice(f"choice-{i}-{j}")
                pc.lookup([choice], op, inputs, lambda cs: {c: 0.5 for c in cs}, hint_override=hint)
                path = os.path.join(cache_dir(), "cache", codecache.CacheBase.get_system()["hash"])
                with open(path) as f:
                    doc = json.load(f)
                (key,) = doc["cache"][op].keys()
                inputs_cases.append({"inputs": inputs, "hint_override": hint, "expected": key})
    out["persistent_cache_inputs_key"] = inputs_cases

    # ---- build_code_hash, cutlass_key, torch_key ---------------------------------------------
    tree_cases = []
    cutlass_cases = []
    synthetic_torch = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, tree in enumerate(TREES + BAD_TREES):
            root = Path(tmp) / f"tree{n}"
            materialize(root, tree)
            for prefix in ["", "torch."]:
                h = hashlib.sha256()
                try:
                    codecache.build_code_hash([str(root)], prefix, h)
                    expected: str | None = h.hexdigest()
                except AssertionError:
                    expected = None  # torch: `assert spec is not None` / `assert module is not None`
                tree_cases.append({"tree": tree, "prefix": prefix, "expected_hex": expected})
            if tree in BAD_TREES:
                continue
            with config.patch({cutlass_dir_key: str(root)}):
                codecache.cutlass_key.clear()
                cutlass_cases.append({"tree": tree, "expected_hex": codecache.cutlass_key().hex()})
            codecache.cutlass_key.clear()
            # torch_key() only hashes the installed torch; for a synthetic tree run the body of
            # its get_code_hash (torch/_inductor/codecache.py: torch_key) around torch's own
            # build_code_hash:
            for version in [str(torch.__version__).split("+")[0], str(torch.__version__)]:
                hasher = hashlib.sha256()
                hasher.update(version.encode("utf-8"))
                codecache.build_code_hash([str(root)], "", hasher)
                for rel in extra_files:
                    extra = os.path.join(root, "_inductor", rel)
                    if os.path.exists(extra):
                        with open(extra, "rb") as f:
                            hasher.update(f.read())
                synthetic_torch.append({"tree": tree, "torch_version": version,
                                        "expected_hex": hasher.hexdigest()})
        # two roots: a module name found in both is taken from the first
        r1, r2 = Path(tmp) / "r1", Path(tmp) / "r2"
        materialize(r1, {"same.py": "first", "only1.py": "1"})
        materialize(r2, {"same.py": "second", "only2.py": "2", "pkg/__init__.py": "p"})
        h = hashlib.sha256()
        codecache.build_code_hash([str(r1), str(r2)], "", h)
        multi_root = {"roots": [{"same.py": "first", "only1.py": "1"},
                                {"same.py": "second", "only2.py": "2", "pkg/__init__.py": "p"}],
                      "expected_hex": h.hexdigest()}
    codecache.cutlass_key.clear()
    with config.patch({cutlass_dir_key: "/nonexistent/cutlass"}):
        cutlass_cases.append({"tree": None, "expected_hex": codecache.cutlass_key().hex()})
    codecache.cutlass_key.clear()
    out["build_code_hash"] = {"cases": tree_cases, "multi_root": multi_root}
    out["cutlass_key"] = cutlass_cases
    installed_key = codecache.torch_key()
    out["torch_key"] = {
        "installed": {"torch_version": str(torch.__version__), "expected_hex": installed_key.hex()},
        "extra_files": extra_files,
        "synthetic": synthetic_torch,
    }

    # ---- CUTLASS request keys ------------------------------------------------------------------
    ser_py = Path(inspect.getfile(cutlass_serialization)).read_bytes()
    utils_py = Path(inspect.getfile(cutlass_utils)).read_bytes()
    request_cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for tree in [None, TREES[5]]:
            cdir = "/nonexistent/cutlass" if tree is None else os.path.join(tmp, "cutlass")
            if tree is not None:
                materialize(Path(cdir), tree)
            with config.patch({cutlass_dir_key: cdir}):
                codecache.cutlass_key.clear()
                ck = codecache.cutlass_key()
                for arch, version, level in [("90", "12.8", "0"), ("100", "13.0", "2222"),
                                             ("80", "12.4", "0201"), ("90", "", "")]:
                    request_cases.append({
                        "arch": arch, "version": version, "instantiation_level": level,
                        "cutlass_key_hex": ck.hex(),
                        "expected": cutlass_cache.get_config_request_key(arch, version, level),
                    })
            codecache.cutlass_key.clear()
    out["cutlass_config_request_key"] = {
        "serialization_py_zb64": blob(ser_py),
        "utils_py_zb64": blob(utils_py),
        "cases": request_cases,
        "filenames": [{"request_key": k, "expected": cutlass_cache._generate_config_filename(k)}
                      for k in ["b15d29dd", "", "0000abcd"]],
    }

    # ---- autotune best configs -----------------------------------------------------------------
    configs_sets = [
        [],
        [({"XBLOCK": 512}, 2, 1)],
        [({"XBLOCK": 1024, "R0_BLOCK": 8}, 4, 1), ({"XBLOCK": 64, "R0_BLOCK": 64}, 8, 1)],
        [({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "EVEN_K": True}, 4, 3),
         ({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "EVEN_K": False,
           "ALLOW_TF32": None, "ACC_TYPE": "tl.float32", "SCALE": 0.5}, 8, 4)],
        [({"é": "漢", "x": [1, 2]}, 1, 0)],
    ]

    def as_configs(spec: list[tuple[dict[str, Any], int, int]]) -> list[SimpleNamespace]:
        return [SimpleNamespace(kwargs=k, num_warps=w, num_stages=s) for k, w, s in spec]

    def to_json(spec: list[tuple[dict[str, Any], int, int]]) -> list[Any]:
        return [[kw, w, s] for kw, w, s in spec]

    out["configs_hash"] = [
        {"configs": to_json(spec), "expected": triton_heuristics.hash_configs(as_configs(spec))}
        for spec in configs_sets
    ]

    class DictBackend(RemoteCacheBackend[bytes]):
        store: dict[str, bytes] = {}
        gets: list[str] = []

        def _get(self, key: str) -> bytes | None:
            DictBackend.gets.append(key)
            return DictBackend.store.get(key)

        def _put(self, key: str, data: bytes) -> None:
            DictBackend.store[key] = data

    @contextlib.contextmanager
    def override(cls: type) -> Iterator[None]:
        old = cls.__dict__.get("backend_override_cls")
        cls.backend_override_cls = DictBackend
        try:
            yield
        finally:
            if old is None:
                del cls.backend_override_cls
            else:
                cls.backend_override_cls = old

    @contextlib.contextmanager
    def torch_key_set(value: bytes) -> Iterator[None]:
        codecache.torch_key.clear()
        codecache.torch_key.set(value)
        try:
            yield
        finally:
            codecache.torch_key.clear()
            codecache.torch_key.set(installed_key)

    best_cases = []
    kernel_names = [codecache.code_hash("kernel one") + ".py", codecache.code_hash("kernel two") + ".py",
                    "triton_poi_fused_add_0.py"]
    torch_keys = [installed_key, bytes(32), hashlib.sha256(b"other torch").digest()]
    tags = ["", "my-tag", "漢"]
    backend_hashes = ["A" * 64, hashlib.sha256(b"backend").hexdigest().upper()]
    n = 0
    with inductor_utils.fresh_cache(), override(RemoteAutotuneCache):
        base = cache_dir()
        for kname in kernel_names:
            for tk in torch_keys:
                tag = tags[n % len(tags)]
                bh = backend_hashes[n % len(backend_hashes)]
                spec = configs_sets[1 + n % (len(configs_sets) - 2)]
                n += 1
                kernel_py = os.path.join(base, kname[1:3], kname)
                configs = as_configs(spec)
                ch = triton_heuristics.hash_configs(configs)
                meta = {"autotune_local_cache": True, "autotune_remote_cache": True,
                        "backend_hash": bh, "is_fbcode": False}
                with torch_key_set(tk), torch.compiler.config.patch(cache_key_tag=tag):
                    cache = ac.AutotuneCache.create(meta, kernel_py, ch)
                    assert cache is not None and cache.local_cache and cache.remote_cache
                    DictBackend.store.clear()
                    with CacheArtifactManager.with_fresh_cache():
                        cache.save(configs[0], 1_234_000_000, found_by_coordesc=False)
                        relative_key = artifact_key(cache, CacheArtifactManager._new_cache_artifacts)
                    (redis_key,) = DictBackend.store.keys()
                local_path = cache.local_cache[1]
                with open(local_path, "rb") as f:
                    saved = f.read()
                best_cases.append({
                    "kernel_py": kernel_py.replace(base, BASE, 1),
                    "torch_key_hex": tk.hex(),
                    "cache_key_tag": tag,
                    "backend_hash": bh,
                    "configs": to_json(spec),
                    "expected": {
                        "prepare_key": cache.remote_cache[1],
                        "local_path": local_path.replace(base, BASE, 1),
                        "relative_key": relative_key,
                        "configs_hash": ch,
                        "remote_cache_id": cache.remote_cache_full_key,
                        "redis_key": redis_key,
                        "saved_json": saved.decode("ascii"),
                    },
                })
    out["best_config"] = best_cases

    out["comment_stripped_hash"] = [
        {"code": c, "expected": ac._comment_stripped_hash(c)}
        for c in [*texts[:12], "x = 1  # run id 1234\n# path /tmp/x\ny = '#not a comment?'\n", "#\n#\n", "a#b\r\nc#d"]
    ]

    bundled_cases = []
    with inductor_utils.fresh_cache(), override(RemoteBundledAutotuneCache):
        from torch._guards import CompileContext, compile_context

        for code, bh in [("def f():\n    return 1  # comment\n", backend_hashes[0]),
                         (texts[7], backend_hashes[1]), ("", backend_hashes[0])]:
            DictBackend.gets.clear()
            meta = {"autotune_local_cache": True, "bundled_autotune_remote_cache": True,
                    "backend_hash": bh, "is_fbcode": False}
            with compile_context(CompileContext(None)):
                ac.AutotuneCacheBundler.begin_compile(meta, code=code)
                ac.AutotuneCacheBundler.end_compile()
            (redis_key,) = DictBackend.gets
            bundled_cases.append({"code": code, "backend_hash": bh, "expected_redis_key": redis_key})
        # Loading a bundle writes each entry back through codecache.get_path.
        entries = {"f" + "0123456789abcdef" * 4 + ".best_config": {"XBLOCK": 8, "num_warps": 1},
                   "zz.best_config": {"num_warps": 2}}
        bundle_key = bundled_cases[0]["expected_redis_key"]
        DictBackend.store[bundle_key] = json.dumps(entries).encode("ascii")
        meta = {"autotune_local_cache": True, "bundled_autotune_remote_cache": True,
                "backend_hash": backend_hashes[0], "is_fbcode": False}
        base = cache_dir()
        with compile_context(CompileContext(None)):
            ac.AutotuneCacheBundler.begin_compile(meta, code=bundled_cases[0]["code"])
            ac.AutotuneCacheBundler.end_compile()
        written = sorted(
            os.path.relpath(os.path.join(d, f), base)
            for d, _, files in os.walk(base) for f in files if f.endswith(".best_config")
        )
    out["bundled_autotune"] = {
        "cases": bundled_cases,
        "load": {"entries": sorted(entries), "written_relative": written},
    }

    class Probe(RedisRemoteCache):
        backend_override_cls = DictBackend

    def redis_key_or_none(cid: str, k: str) -> str | None:
        # RedisRemoteCache builds f"pt2:{cache_id}::{{key}}:c1" and then str.format()s it, so
        # braces in cache_id are format syntax: "{{" -> "{", and "{b}" raises KeyError.
        try:
            return Probe(cid)._get_key(k)
        except (KeyError, IndexError, ValueError):
            return None

    out["redis_key"] = [
        {"cache_id": cid, "key": k, "expected": redis_key_or_none(cid, k)}
        for cid, k in [("bundled-autotune-v1", "abc"), ("x" * 64, "y" * 64), ("", ""),
                       ("a{{b}}", "c}d{"), ("{key}", "K"), ("a{b}", "c"), ("{", "k"), ("{0}", "k")]
    ]

    # ---- isolation key -----------------------------------------------------------------------
    schemas = [
        {"runtime_context": True, "compile_context": True},
        {"runtime_context": False, "compile_context": False},
        {"runtime_context": False, "compile_context": True},
        {"runtime_context": {"torch_determinism_configs": True, "cuda_matmul_precision_configs": True,
                             "inductor_configs": False}, "compile_context": False},
        {"runtime_context": False, "compile_context": {"torch_version_hash": True, "runtime": True,
                                                        "triton_version_hash": False,
                                                        "runtime_version": False,
                                                        "accelerator_properties": False}},
    ]
    # runtime/caching exists from 2.11 on (2.9/2.10 have no isolation key: section is None)
    try:
        from torch._inductor.runtime.caching import context as caching_context
    except ImportError:
        caching_context = None
    if caching_context is not None:
        isolation_cases = []
        for schema in schemas:
            ctx = caching_context._isolation_context(schema)
            roundtrip = json.loads(json.dumps(ctx))
            assert json.dumps(roundtrip, sort_keys=True) == json.dumps(ctx, sort_keys=True)
            isolation_cases.append({"context": roundtrip, "expected": caching_context._isolation_key(schema)})
        out["isolation_key"] = {
            "cases": isolation_cases,
            "torch_version_hash": {"torch_key_hex": installed_key.hex(),
                                   "expected": caching_context._CompileContext.torch_version_hash()},
        }
    else:
        out["isolation_key"] = None

    out["cutedsl_kernel_name"] = cutedsl_cases(torch, config, texts)

    # ---- GPU-only: backend_hash and a real get_system() -------------------------------------
    out["gpu"] = gpu_section(torch, codecache, gpu_from, out_path)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1, ensure_ascii=True, sort_keys=False) + "\n")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


def cutedsl_cases(torch: Any, config: Any, texts: list[str]) -> list[dict[str, Any]] | None:
    """CuTe-DSL kernel names (CuteDSLScheduling.define_kernel on a real GraphLowering); None
    where this torch has no CuTe-DSL backend (2.9/2.10)."""
    try:
        from torch._inductor.codegen.cutedsl.cutedsl_scheduling import CuteDSLScheduling
    except ImportError:
        return None
    from torch._inductor.graph import GraphLowering
    from torch._inductor.utils import get_fused_kernel_name
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    def schedule_of(names: list[str]) -> list[SimpleNamespace]:
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        nodes = [graph.call_function(torch.ops.aten.add.Tensor, (x, x), name=name) for name in names]
        # get_fused_kernel_name reads node.node.origins of each scheduled node
        return [SimpleNamespace(node=SimpleNamespace(origins=OrderedSet(nodes)))] if nodes else []

    cute_cases = []
    for src, descriptive, names in [
        ("def KERNEL_NAME(a, b):\n    return a + b\n", False, []),
        ("def KERNEL_NAME(a):\n    pass\n", "original_aten", []),
        (texts[8], "inductor_node", ["add", "mul_1"]),
        ("kernel 漢 KERNEL_NAME", "inductor_node", ["relu"]),
        ("", False, []),
    ]:
        graph = GraphLowering(torch.fx.symbolic_trace(lambda t: t + 1))
        with V.set_graph_handler(graph), config.patch({"triton.descriptive_names": descriptive}):
            graph.init_wrapper_code()
            schedule = schedule_of(names)
            fused = get_fused_kernel_name(schedule, descriptive) if descriptive else ""
            name = CuteDSLScheduling(None).define_kernel(src, schedule)
        cute_cases.append({"fused_name": fused, "src": src, "expected": name})
    return cute_cases


def measure_gpu(torch: Any, codecache: Any) -> dict[str, Any] | None:
    """``triton_hash_with_backend()`` and ``CacheBase.get_system()`` on this machine, with the
    source of both functions (so a section made with another torch can be compared with 2.13's)."""
    from torch._inductor.runtime.triton_compat import HAS_TRITON

    if not (HAS_TRITON and torch.cuda.is_available()):
        return None
    import torch.utils._triton as tu
    from torch._inductor.codecache import CacheBase

    triton_key = lambda: CacheBase.get_system()["version"]["triton"]  # noqa: E731

    backend = tu.triton_backend()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    codecache.CacheBase.get_system.cache_clear()
    return {
        "torch_version": str(torch.__version__),
        "device": props.name,
        "triton_key": triton_key(),
        "backend_hash_input": backend.hash(),
        "backend_hash": tu.triton_hash_with_backend(),
        "system": codecache.CacheBase.get_system(),
        "cuda_version": torch.version.cuda,
        "hip_version": torch.version.hip,
        "sources": {
            "torch/utils/_triton.py: triton_hash_with_backend":
                inspect.getsource(getattr(tu.triton_hash_with_backend, "__wrapped__", tu.triton_hash_with_backend)),
            "torch/_inductor/codecache.py: CacheBase.get_system":
                inspect.getsource(codecache.CacheBase.get_system.__wrapped__),
        },
    }


def gpu_section(torch: Any, codecache: Any, gpu_from: Path | None, out_path: Path) -> list[dict[str, Any]] | None:
    """The ``gpu`` section: a list of measurements, each on one GPU with this torch release.
    Those already in the output file (or the frozen file of this torch) are kept; one measured
    here (a machine with Triton and a GPU) or read from ``gpu_from`` (a file ``--gpu-only``
    wrote on such a machine) is added, replacing one of the same device and torch."""
    kept: list[dict[str, Any]] = []
    for existing in (out_path, vectors_file(str(torch.__version__))):
        if existing.exists():
            section = json.loads(existing.read_text()).get("gpu")
            kept = section if isinstance(section, list) else [section] if section else []
            break
    new = measure_gpu(torch, codecache)
    if new is None and gpu_from is not None:
        new = json.loads(gpu_from.read_text())
    if new is not None:
        kept = [g for g in kept if (g["device"], g["torch_version"]) != (new["device"], new["torch_version"])]
        kept.append(new)
    return kept or None


#: Sections whose inputs hold file names with the interpreter's extension suffix (EXT).
PYTHON_DEPENDENT = ("build_code_hash", "cutlass_key", "torch_key")
#: Sections whose inputs are live process state (Inductor's configs, the environment):
#: checked by the property tests, not compared here.
STATE_DEPENDENT = ("isolation_key",)


def compare(made: Path) -> int:
    """Compare a file made here with the frozen file of its torch release: every section but
    ``meta``, ``gpu`` and :data:`STATE_DEPENDENT`, ``system`` without ``this_machine`` (and,
    when made on another Python, those of :data:`PYTHON_DEPENDENT`)."""
    new = json.loads(made.read_text())
    frozen_path = vectors_file(new["meta"]["torch_version"])
    if not frozen_path.exists():
        print(f"no frozen vectors for torch {new['meta']['torch_version']} ({frozen_path} is missing)")
        return 1
    frozen = json.loads(frozen_path.read_text())
    same_python = frozen["meta"]["extension_suffixes"] == new["meta"]["extension_suffixes"]
    sections = [k for k in frozen if k not in ("meta", "gpu", *STATE_DEPENDENT)
                and (same_python or k not in PYTHON_DEPENDENT)]
    def comparable(section: str, data: dict[str, Any]) -> Any:
        value = data.get(section)
        if section == "system" and isinstance(value, dict):
            # this machine's own get_system(): from 2.15 on it holds Triton's key, which
            # differs per Python and Triton build (the property tests check it live)
            value = {k: v for k, v in value.items() if k != "this_machine"}
        return value

    differing = [k for k in sections if comparable(k, frozen) != comparable(k, new)]
    differing += [k for k in new if k not in frozen]
    if differing:
        print(f"{frozen_path.name}: sections differ from this torch's: {', '.join(differing)}")
        return 1
    skipped = "" if same_python else f" ({', '.join(PYTHON_DEPENDENT)} skipped: made on Python {frozen['meta']['python']})"
    print(f"{len(sections)} sections equal {frozen_path.name}{skipped}")
    return 0


if __name__ == "__main__":
    # usage: make_key_vectors.py [--out FILE] [--gpu-from FILE]   write the vectors
    #        make_key_vectors.py --compare FILE                   FILE against the frozen file
    #        make_key_vectors.py --gpu-only FILE     (GPU + Triton machine) write the gpu section only
    args = sys.argv[1:]
    if args[:1] == ["--gpu-only"] and len(args) == 2:
        import torch
        from torch._inductor import codecache

        section = measure_gpu(torch, codecache)
        if section is None:
            sys.exit("--gpu-only needs Triton and a GPU")
        Path(args[1]).write_text(json.dumps(section, indent=1) + "\n")
        print(json.dumps({k: v for k, v in section.items() if k != "sources"}, indent=1))
    elif args[:1] == ["--compare"] and len(args) == 2:
        sys.exit(compare(Path(args[1])))
    else:
        options = dict(zip(args[::2], args[1::2]))
        if len(args) % 2 or set(options) - {"--out", "--gpu-from"}:
            sys.exit(__doc__)
        main(Path(options["--out"]) if "--out" in options else None,
             Path(options["--gpu-from"]) if "--gpu-from" in options else None)
