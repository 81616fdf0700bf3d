"""cachedb.keys against torch 2.9 to 2.15: property tests (torch) and frozen vectors (no torch).

Two parts:

* Frozen vectors: ``tests/data/key_vectors/torch-<VERSION>.json``, one file per torch release
  (written by ``tests/data/make_key_vectors.py`` from that torch's own functions), checked
  against every function of cachedb.keys with that release's formulas. These never import torch.
* Property tests (``@pytest.mark.torch``): each function compared with the installed torch's
  own function (any release from 2.9 to 2.15) over hypothesis-generated inputs. Live torch state is set through torch's own seams
  (``config.patch``, ``torch.compiler.config.patch``, ``fresh_cache()``,
  ``torch_key.set``, the remote caches' ``backend_override_cls`` hook with an in-memory
  backend); nothing of torch is mocked. They skip where torch is not installed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cachedb import keys
from cachedb._errors import BadInputError

VECTORS_DIR = Path(__file__).parent / "data" / "key_vectors"
VECTOR_FILES = sorted(VECTORS_DIR.glob("torch-*.json"), key=lambda p: tuple(int(x) for x in p.stem[6:].split(".")))
#: Every torch release the keys are checked against (.ci/compat), one vectors file each.
RELEASES = ["2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
EXT = importlib.machinery.EXTENSION_SUFFIXES[0]

# ============================================================================================
# Helpers shared by both parts
# ============================================================================================


def dec(value: dict[str, str]) -> str | bytes:
    if "bytes_b64" in value:
        return base64.b64decode(value["bytes_b64"])
    return value["str"]


def unblob(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text))


def materialize(root: Path, tree: dict[str, Any]) -> None:
    """tree: {relative path: str contents | None (a directory)} (the vectors' format)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in sorted(tree.items()):
        path = root / rel
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("utf-8"))


def build_hex(roots: list[str], prefix: str) -> str | None:
    """cachedb's build_code_hash as a hex digest; None where it refuses the tree."""
    h = hashlib.sha256()
    try:
        keys.build_code_hash(roots, prefix, h)
    except BadInputError:
        return None
    return h.hexdigest()


def installed_torch() -> tuple[str, str] | None:
    """(torch package dir, torch.__version__) of an installed torch, found without importing it."""
    # PathFinder looks at the files on sys.path only (never at sys.modules, never imports).
    spec = importlib.machinery.PathFinder.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    torch_dir = os.path.dirname(spec.origin)
    version_py = os.path.join(torch_dir, "version.py")
    if not os.path.isfile(version_py):
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", Path(version_py).read_text(), re.M)
    return (torch_dir, match.group(1)) if match else None


# Text without lone surrogates (torch and cachedb both UTF-8 encode strings).
text_st = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)
str_or_bytes_st = st.one_of(text_st, st.binary(max_size=80))
path_text_st = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"), min_size=1, max_size=30
)


# ============================================================================================
# Part 1: no torch
# ============================================================================================


def test_imports_and_works_without_torch() -> None:
    """cachedb.keys must import and compute with torch unimportable."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "from cachedb import keys\n"
        "assert keys.sha256_hash(b'') == '4oymiquy7qobjgx36tejs35zeqt24qpemsnzgtfeswmrw6csxbk'\n"
        "assert keys.system_hash({}) == keys.CPU_SYSTEM_HASH\n"
        "assert sys.modules['torch'] is None\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_public_functions_name_their_torch_source() -> None:
    functions = [getattr(keys, name) for name in keys.__all__ if inspect.isfunction(getattr(keys, name))]
    assert len(functions) >= 25
    for fn in functions:
        doc = inspect.getdoc(fn) or ""
        assert re.search(r"Mirrors(?: \(inverts\))? torch/[\w/]+\.py:\s+[A-Za-z_][\w.]*", doc), fn.__name__
        assert "Returns:" in doc and "Raises:" in doc and "Args:" in doc, fn.__name__


@pytest.fixture(scope="module", params=VECTOR_FILES, ids=lambda p: p.stem)
def vectors(request: pytest.FixtureRequest) -> dict[str, Any]:
    data = json.loads(request.param.read_text())
    assert request.param.name == f"torch-{data['meta']['torch_version'].split('+')[0]}.json"
    return data


def tv(vectors: dict[str, Any]) -> str:
    """The torch version a vectors file was made with (the formulas to check it with)."""
    return vectors["meta"]["torch_version"]


def same_extension_suffixes(vectors: dict[str, Any]) -> None:
    """Skip where the vectors were made on a Python whose extension suffixes differ from this
    one's: their trees name files with that Python's suffix (EXT), which decides what is a module."""
    if vectors["meta"]["extension_suffixes"] != list(importlib.machinery.EXTENSION_SUFFIXES):
        pytest.skip(f"vectors made on Python {vectors['meta']['python']}, whose extension suffixes differ from this Python's")


def test_vectors_exist_for_every_release() -> None:
    made = {".".join(p.stem[6:].split(".")[:2]) for p in VECTOR_FILES}
    assert made == set(RELEASES)


def test_vectors_sha256_hash(vectors: dict[str, Any]) -> None:
    assert len(vectors["sha256_hash"]) >= 20
    for case in vectors["sha256_hash"]:
        assert keys.sha256_hash(dec(case["data"])) == case["expected"]
        assert keys.sha256_digest_name(hashlib.sha256(keys._common._to_bytes(dec(case["data"]))).digest()) == case["expected"]


def test_vectors_code_hash(vectors: dict[str, Any]) -> None:
    assert len(vectors["code_hash"]) >= 50
    for case in vectors["code_hash"]:
        code = dec(case["code"])
        got = keys.code_hash(code, dec(case["extra"])) if "extra" in case else keys.code_hash(code)
        assert got == case["expected"], case


def test_vectors_get_hash(vectors: dict[str, Any]) -> None:
    section = vectors["get_hash"]
    fmt = section["xpu_kernel_format"] or "zebin"
    assert any(c["expected"] is None for c in section["cases"])
    for case in section["cases"]:
        args = (dec(case["content"]), dec(case["extra"]), case["hash_type"])
        if case["expected"] is None:  # torch: "Unknown hash type"
            with pytest.raises(ValueError):
                keys.get_hash(*args, xpu_kernel_format=fmt, torch_version=tv(vectors))
            continue
        assert keys.get_hash(*args, xpu_kernel_format=fmt, torch_version=tv(vectors)) == case["expected"], case


def test_vectors_get_path(vectors: dict[str, Any]) -> None:
    base = vectors["meta"]["base_placeholder"]
    for case in vectors["get_path"]:
        got = keys.get_path(case["basename"], case["extension"], case["specified_dir"], cache_dir=base)
        assert list(got) == case["expected"], case


def test_vectors_system(vectors: dict[str, Any]) -> None:
    section, version = vectors["system"], tv(vectors)
    here = section["this_machine"]  # a CPU machine, Triton installed from 2.11 on
    got = keys.system_info(None, (here.get("version") or {}).get("triton"), torch_version=version)
    assert json.dumps(got) == json.dumps(here)  # same keys, same order
    assert keys.system_hash(here, torch_version=version) == here["hash"]
    for case in section.get("cpu_cases", []):
        got = keys.system_info(None, case["triton_key"], torch_version=version)
        assert json.dumps(got) == json.dumps(case["expected"])
        assert keys.system_hash(case["expected"], torch_version=version) == case["expected"]["hash"]
    for case in section["cases"]:
        got = keys.system_info(*case["args"], torch_version=version)
        assert json.dumps(got) == json.dumps(case["expected"])  # insertion order, as Inductor writes it
        assert keys.system_hash(case["expected"], torch_version=version) == case["expected"]["hash"]


def test_fingerprint_recomputes_its_system_hash_by_its_torch(vectors: dict[str, Any]) -> None:
    from cachedb.fingerprint import Fingerprint

    systems = [vectors["system"]["this_machine"], *(c["expected"] for c in vectors["system"]["cases"])]
    systems += [c["expected"] for c in vectors["system"].get("cpu_cases", [])]
    for system in systems:
        fp = Fingerprint(system=dict(system), torch_version=tv(vectors))
        assert fp.recomputed_system_hash() == fp.system_hash


def test_torch_versions_and_the_tested_range() -> None:
    from cachedb.keys._versions import parse_torch_version, untested_torch_warning

    assert parse_torch_version("2.15.0+cu132") == (2, 15)
    assert parse_torch_version("2.13.0+cpu") == (2, 13)
    assert parse_torch_version("2.16.0.dev20261201") == (2, 16)
    with pytest.raises(BadInputError):
        parse_torch_version("nightly")
    for inside in ("2.9.0", "2.12.1", "2.15.0+cu132"):
        assert untested_torch_warning(inside) is None
    for outside in ("2.8.0", "2.16.0.dev20261201", "3.0.0"):
        warning = untested_torch_warning(outside)
        assert warning is not None and outside in warning and "2.9 to 2.15" in warning


def test_system_formulas_per_release() -> None:
    """2.15 records Triton's key without a GPU, so the CPU hash is no longer ``hex(b"{}")``."""
    cpu_2_14 = keys.system_info(None, "tk", torch_version="2.14.1")
    cpu_2_15 = keys.system_info(None, "tk", torch_version="2.15.0")
    assert cpu_2_14 == {"hash": keys.CPU_SYSTEM_HASH}
    assert cpu_2_15 == {"version": {"triton": "tk"}, "hash": hashlib.sha256(b'{"version": {"triton": "tk"}}').hexdigest()}
    with pytest.raises(BadInputError):
        keys.system_hash(cpu_2_15, torch_version="2.14.1")  # no torch before 2.15 writes that
    gpu = {"device": {"name": "G"}, "version": {"triton": "tk", "cuda": "13.0"}}
    assert keys.system_hash(gpu, torch_version="2.14.1") == keys.system_hash(gpu, torch_version="2.15.0")
    with_interfaces = keys.system_info(None, None, device_interfaces={"mtia": {"arch": 2}}, torch_version="2.15.0")
    assert list(with_interfaces) == ["version", "device_interfaces", "hash"]
    assert keys.system_hash(with_interfaces, torch_version="2.15.0") == with_interfaces["hash"]


def test_vectors_persistent_cache_inputs_key(vectors: dict[str, Any]) -> None:
    for case in vectors["persistent_cache_inputs_key"]:
        inputs, hint = case["inputs"], case["hint_override"]
        if hint is not None and not inputs.endswith("]"):
            # torch writes f"{inputs}_{hint}" here, a key that cannot be split back: refused.
            with pytest.raises(BadInputError):
                keys.persistent_cache_inputs_key(inputs, hint)
            continue
        assert keys.persistent_cache_inputs_key(inputs, hint) == case["expected"]
        assert keys.persistent_cache_inputs_key(*keys.split_inputs_key(case["expected"])) == case["expected"]
        if inputs.endswith("]"):
            assert keys.split_inputs_key(case["expected"]) == (inputs, hint)


def test_vectors_build_code_hash(vectors: dict[str, Any], tmp_path: Path) -> None:
    same_extension_suffixes(vectors)
    section = vectors["build_code_hash"]
    assert any(c["expected_hex"] is None for c in section["cases"])
    for n, case in enumerate(section["cases"]):
        root = tmp_path / f"t{n}"
        materialize(root, case["tree"])
        assert build_hex([str(root)], case["prefix"]) == case["expected_hex"], case["tree"]
    roots = []
    for n, tree in enumerate(section["multi_root"]["roots"]):
        materialize(tmp_path / f"r{n}", tree)
        roots.append(str(tmp_path / f"r{n}"))
    assert build_hex(roots, "") == section["multi_root"]["expected_hex"]


def test_vectors_cutlass_key(vectors: dict[str, Any], tmp_path: Path) -> None:
    same_extension_suffixes(vectors)
    for n, case in enumerate(vectors["cutlass_key"]):
        if case["tree"] is None:
            root = tmp_path / "does-not-exist"
        else:
            root = tmp_path / f"c{n}"
            materialize(root, case["tree"])
        assert keys.cutlass_key(root).hex() == case["expected_hex"]


def test_vectors_torch_key_synthetic(vectors: dict[str, Any], tmp_path: Path) -> None:
    same_extension_suffixes(vectors)
    assert any("_inductor/codegen/aoti_runtime/streams.h" in c["tree"] for c in vectors["torch_key"]["synthetic"])
    for n, case in enumerate(vectors["torch_key"]["synthetic"]):
        root = tmp_path / f"torch{n}"
        materialize(root, case["tree"])
        assert keys.torch_key(root, case["torch_version"]).hex() == case["expected_hex"], case["tree"]


def test_vectors_torch_key_installed(vectors: dict[str, Any]) -> None:
    """The recorded torch_key() of the installed torch's release, recomputed from its files
    (torch not imported; skipped unless that exact torch is installed)."""
    found = installed_torch()
    expected = vectors["torch_key"]["installed"]
    if found is None or found[1] != expected["torch_version"]:
        pytest.skip(f"torch {expected['torch_version']} is not installed here")
    same_extension_suffixes(vectors)
    torch_dir, version = found
    assert keys.torch_key(torch_dir, version).hex() == expected["expected_hex"]


def test_vectors_cutlass_config_request_key(vectors: dict[str, Any]) -> None:
    section = vectors["cutlass_config_request_key"]
    ser_py, utils_py = unblob(section["serialization_py_zb64"]), unblob(section["utils_py_zb64"])
    for case in section["cases"]:
        got = keys.cutlass_config_request_key(
            case["arch"],
            case["version"],
            case["instantiation_level"],
            cutlass_key=bytes.fromhex(case["cutlass_key_hex"]),
            serialization_py=ser_py,
            utils_py=utils_py,
        )
        assert got == case["expected"], case
    # The real op list shipped in tests/data was made by torch 2.13 for arch 90, CUDA 12.8,
    # level 0 with no CUTLASS Python packages at the cutlass_dir root.
    if tv(vectors).startswith("2.13."):
        assert any(c["expected"] == "b15d29dd" for c in section["cases"])
    for case in section["filenames"]:
        assert keys.cutlass_config_filename(case["request_key"]) == case["expected"]


def test_cutlass_toolkit_version() -> None:
    assert keys.cutlass_toolkit_version("12.4.0") == "12.4"
    assert keys.cutlass_toolkit_version("12.8") == "12.8"
    assert keys.cutlass_toolkit_version("13") == "13"


def test_vectors_configs_hash(vectors: dict[str, Any]) -> None:
    for case in vectors["configs_hash"]:
        configs = [(kw, w, s) for kw, w, s in case["configs"]]
        assert keys.configs_hash(configs) == case["expected"]
        assert keys.configs_hash(case["configs"]) == case["expected"]  # lists, as JSON gives them
        as_objects = [SimpleNamespace(kwargs=kw, num_warps=w, num_stages=s) for kw, w, s in configs]
        assert keys.configs_hash(as_objects) == case["expected"]


def test_vectors_best_config(vectors: dict[str, Any]) -> None:
    assert len(vectors["best_config"]) >= 6
    for case in vectors["best_config"]:
        kernel_py, tag, exp = case["kernel_py"], case["cache_key_tag"], case["expected"]
        tk = bytes.fromhex(case["torch_key_hex"])
        prepare = keys.best_config_prepare_key(kernel_py, tag)
        assert prepare == exp["prepare_key"]
        assert keys.best_config_prepare_key(os.path.basename(kernel_py), tag) == prepare
        assert keys.best_config_local_path(kernel_py, tk, tag, torch_version=tv(vectors)) == exp["local_path"]
        assert keys.best_config_filename(kernel_py, tk, tag) == os.path.basename(exp["local_path"])
        assert keys.best_config_relative_key(kernel_py, tk, tag) == exp["relative_key"]
        # a bare basename assumes the standard <k[1:3]>/ layout, which these kernels use
        assert keys.best_config_relative_key(os.path.basename(kernel_py), tk, tag) == exp["relative_key"]
        ch = keys.configs_hash([tuple(c) for c in case["configs"]])
        assert ch == exp["configs_hash"]
        assert json.loads(exp["saved_json"])["configs_hash"] == ch
        remote_id = keys.autotune_remote_cache_id(tk, case["backend_hash"], ch)
        assert remote_id == exp["remote_cache_id"]
        assert keys.autotune_redis_key(remote_id, prepare) == exp["redis_key"]


def test_vectors_comment_stripped_hash(vectors: dict[str, Any]) -> None:
    for case in vectors["comment_stripped_hash"]:
        assert keys.comment_stripped_hash(case["code"]) == case["expected"]


def test_vectors_bundled_autotune(vectors: dict[str, Any]) -> None:
    section = vectors["bundled_autotune"]
    for case in section["cases"]:
        key = keys.bundled_autotune_key(case["backend_hash"], code=case["code"])
        assert keys.autotune_redis_key(keys.BUNDLED_AUTOTUNE_CACHE_ID, key) == case["expected_redis_key"]
        by_hash = keys.bundled_autotune_key(case["backend_hash"], code_hash=keys.comment_stripped_hash(case["code"]))
        assert by_hash == key
    written = sorted(
        os.path.relpath(keys.bundled_best_config_path(name, cache_dir="/CACHE"), "/CACHE")
        for name in section["load"]["entries"]
    )
    assert written == section["load"]["written_relative"]


def test_vectors_redis_key(vectors: dict[str, Any]) -> None:
    assert any(c["expected"] is None for c in vectors["redis_key"])
    for case in vectors["redis_key"]:
        if case["expected"] is None:
            with pytest.raises(BadInputError):
                keys.autotune_redis_key(case["cache_id"], case["key"])
        else:
            assert keys.autotune_redis_key(case["cache_id"], case["key"]) == case["expected"]


def test_vectors_isolation_key(vectors: dict[str, Any]) -> None:
    section = vectors["isolation_key"]
    if section is None:
        assert tv(vectors).startswith("2.9.")  # torch/_inductor/runtime/caching is new in 2.10
        return
    for case in section["cases"]:
        assert keys.isolation_key(case["context"]) == case["expected"]
    tvh = section["torch_version_hash"]
    assert keys.isolation_torch_version_hash(bytes.fromhex(tvh["torch_key_hex"])) == tvh["expected"]


def test_vectors_cutedsl_kernel_name(vectors: dict[str, Any]) -> None:
    cases = vectors["cutedsl_kernel_name"]
    if cases is None:
        pytest.skip(f"torch {tv(vectors)} has no CuTe-DSL backend")
    assert {c["fused_name"] for c in cases} >= {"", "fused"}
    for case in cases:
        assert keys.cutedsl_kernel_name(case["fused_name"], case["src"]) == case["expected"]


def test_vectors_gpu_section(vectors: dict[str, Any]) -> None:
    section = vectors.get("gpu")
    if not section:
        pytest.skip("no GPU section recorded (make_key_vectors.py ran without Triton and a GPU)")
    for gpu in section if isinstance(section, list) else [section]:
        assert keys.backend_hash(gpu["triton_key"], gpu["backend_hash_input"]) == gpu["backend_hash"]
        got = keys.system_info(
            gpu["device"], gpu["triton_key"], gpu["cuda_version"], gpu["hip_version"], torch_version=gpu["torch_version"]
        )
        assert got == gpu["system"]
        assert json.dumps(got) == json.dumps(gpu["system"])  # same key order
        assert keys.system_hash(gpu["system"], torch_version=gpu["torch_version"]) == gpu["system"]["hash"]


# ---- torch-free properties -------------------------------------------------------------------

inputs_repr_st = st.lists(
    st.tuples(
        st.sampled_from(["cpu", "cuda", "xpu"]),
        st.sampled_from(["torch.float32", "torch.bfloat16", "torch.int8"]),
        st.lists(st.integers(-(2**40), 2**40), max_size=8),
    ).map(lambda t: (t[0], t[1], *t[2])),
    max_size=4,
).map(repr)


@settings(max_examples=200, deadline=None)
@given(inputs=st.one_of(inputs_repr_st, text_st.map(lambda s: s + "]")), hint=st.none() | st.integers())
def test_split_inputs_key_inverts_exactly(inputs: str, hint: int | None) -> None:
    key = keys.persistent_cache_inputs_key(inputs, hint)
    assert keys.split_inputs_key(key) == (inputs, hint)


@settings(max_examples=200, deadline=None)
@given(key=text_st)
def test_inputs_key_of_split_is_identity(key: str) -> None:
    assert keys.persistent_cache_inputs_key(*keys.split_inputs_key(key)) == key


def test_inputs_key_refusals() -> None:
    with pytest.raises(TypeError):
        keys.persistent_cache_inputs_key("[]", True)  # type: ignore[arg-type]
    with pytest.raises(BadInputError):
        keys.persistent_cache_inputs_key("not a list", 3)
    assert keys.persistent_cache_inputs_key("not a list", None) == "not a list"
    assert keys.split_inputs_key("[]_007") == ("[]_007", None)  # not how str(int) writes 7
    assert keys.split_inputs_key("[]_-0") == ("[]_-0", None)
    assert keys.split_inputs_key("[('a\\nb',\n 1)]_-12") == ("[('a\\nb',\n 1)]", -12)
    assert keys.split_inputs_key("[1]_2]_3") == ("[1]_2]", 3)


def test_other_refusals(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        keys.get_hash("x", hash_type="elf")
    with pytest.raises(TypeError):
        keys.sha256_hash(123)  # type: ignore[arg-type]
    with pytest.raises(BadInputError):
        keys.system_hash({"device": {"name": "x"}}, torch_version="2.14.1")
    with pytest.raises(BadInputError):
        keys.isolation_key({"x": object()})
    with pytest.raises(ValueError):
        keys.bundled_autotune_key("B", code="x", code_hash="y")
    with pytest.raises(BadInputError):
        keys.best_config_relative_key("ab.py", b"\0" * 32)
    with pytest.raises(BadInputError):
        keys.torch_key(tmp_path / "missing", "2.13.0")
    with pytest.raises(TypeError):
        keys.build_code_hash(str(tmp_path), "", hashlib.sha256())  # type: ignore[arg-type]
    with pytest.raises(BadInputError):
        keys.configs_hash([({"X": 1}, 4)])


def test_cpu_system_hash_constant() -> None:
    assert keys.CPU_SYSTEM_HASH == hashlib.sha256(b"{}").hexdigest()
    assert keys.system_hash({"hash": "whatever"}) == keys.CPU_SYSTEM_HASH


# ============================================================================================
# Part 2: the installed torch's own functions (skipped where torch is absent)
# ============================================================================================


@pytest.fixture(scope="session")
def tm() -> SimpleNamespace:
    """torch and the Inductor modules the property tests call."""
    torch = pytest.importorskip("torch")
    release = keys._versions.parse_torch_version(str(torch.__version__))
    if not keys._versions.OLDEST_TESTED <= release <= keys._versions.NEWEST_TESTED:
        pytest.skip(f"these tests compare with torch 2.9 to 2.15, found {torch.__version__}")
    from torch._inductor import codecache, config
    from torch._inductor import utils as inductor_utils
    from torch.compiler._cache import CacheArtifactManager

    try:  # 2.11 on
        from torch._inductor.codegen.cutlass import cache as cutlass_cache
        from torch._inductor.codegen.cutlass import serialization as cutlass_serialization
        from torch._inductor.codegen.cutlass import utils as cutlass_utils

        cutlass_dir_key = "cutlass.cutlass_dir"
    except ImportError:  # 2.9/2.10
        from torch._inductor.codegen.cuda import cutlass_cache
        from torch._inductor.codegen.cuda import cutlass_utils
        from torch._inductor.codegen.cuda import serialization as cutlass_serialization

        cutlass_dir_key = "cuda.cutlass_dir"
    try:  # 2.10 on
        from torch._inductor.runtime.caching import context as caching_context
    except ImportError:
        caching_context = None
    from torch._inductor.remote_cache import (
        RedisRemoteCache,
        RemoteAutotuneCache,
        RemoteBundledAutotuneCache,
        RemoteCacheBackend,
    )
    from torch._inductor.runtime import autotune_cache, triton_heuristics
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    class DictBackend(RemoteCacheBackend[bytes]):
        """An in-memory remote-cache backend (what a Redis server would hold)."""

        store: dict[str, bytes] = {}
        gets: list[str] = []

        def _get(self, key: str) -> bytes | None:
            DictBackend.gets.append(key)
            return DictBackend.store.get(key)

        def _put(self, key: str, data: bytes) -> None:
            DictBackend.store[key] = data

    class ProbeRedisCache(RedisRemoteCache):
        backend_override_cls = DictBackend

    return SimpleNamespace(
        torch=torch,
        release=release,
        codecache=codecache,
        config=config,
        utils=inductor_utils,
        CacheArtifactManager=CacheArtifactManager,
        cutlass_dir_key=cutlass_dir_key,
        cutlass_cache=cutlass_cache,
        cutlass_serialization=cutlass_serialization,
        cutlass_utils=cutlass_utils,
        RemoteAutotuneCache=RemoteAutotuneCache,
        RemoteBundledAutotuneCache=RemoteBundledAutotuneCache,
        DictBackend=DictBackend,
        ProbeRedisCache=ProbeRedisCache,
        ac=autotune_cache,
        triton_heuristics=triton_heuristics,
        cache_dir=cache_dir,
        caching_context=caching_context,
    )


@contextlib.contextmanager
def backend_override(tm: SimpleNamespace, cls: type) -> Iterator[type]:
    """Point one of torch's remote-cache classes at the in-memory backend (torch's own hook)."""
    old = cls.__dict__.get("backend_override_cls")
    cls.backend_override_cls = tm.DictBackend
    tm.DictBackend.store.clear()
    tm.DictBackend.gets.clear()
    try:
        yield tm.DictBackend
    finally:
        if old is None:
            del cls.backend_override_cls
        else:
            cls.backend_override_cls = old


@contextlib.contextmanager
def torch_key_set(tm: SimpleNamespace, value: bytes) -> Iterator[None]:
    """Prepopulate codecache.torch_key() (prefetchable_cache.set), restoring the real one after."""
    real = tm.codecache.torch_key()
    tm.codecache.torch_key.clear()
    tm.codecache.torch_key.set(value)
    try:
        yield
    finally:
        tm.codecache.torch_key.clear()
        tm.codecache.torch_key.set(real)


@contextlib.contextmanager
def env_var(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def torch_settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.torch
@torch_settings(200)
@given(data=str_or_bytes_st)
def test_sha256_hash_matches_torch(tm: SimpleNamespace, data: str | bytes) -> None:
    if isinstance(data, str) and tm.release < (2, 13):
        with pytest.raises(TypeError):  # 2.9 to 2.12 hash bytes only
            tm.codecache.sha256_hash(data)
        data = data.encode("utf-8")
    assert keys.sha256_hash(data) == tm.codecache.sha256_hash(data)
    assert keys.sha256_digest_name(hashlib.sha256(data if isinstance(data, bytes) else data.encode()).digest()) == keys.sha256_hash(data)


@pytest.mark.torch
@torch_settings(200)
@given(code=str_or_bytes_st, extra=st.none() | str_or_bytes_st)
def test_code_hash_matches_torch(tm: SimpleNamespace, code: str | bytes, extra: str | bytes | None) -> None:
    if extra is None:
        assert keys.code_hash(code) == tm.codecache.code_hash(code)
    else:
        assert keys.code_hash(code, extra) == tm.codecache.code_hash(code, extra)


@pytest.mark.torch
@torch_settings(200)
@given(
    content=str_or_bytes_st,
    extra=text_st,
    hash_type=st.sampled_from(["code", "ptx", "amdgcn", "spv", "cubin", "hsaco", "zebin", "elf", ""]),
)
def test_get_hash_matches_torch(tm: SimpleNamespace, content: str | bytes, extra: str, hash_type: str) -> None:
    fmt = getattr(tm.utils, "XPU_KERNEL_FORMAT", "zebin")  # 2.9/2.10 have no XPU binary kind
    try:
        expected = tm.codecache.get_hash(content, extra, hash_type)
    except AssertionError:
        with pytest.raises(ValueError):
            keys.get_hash(content, extra, hash_type, xpu_kernel_format=fmt)
        return
    assert keys.get_hash(content, extra, hash_type, xpu_kernel_format=fmt) == expected


@pytest.mark.torch
@torch_settings(200)
@given(
    basename=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
    extension=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    specified_dir=st.sampled_from(["", "sub", "a/b", "/abs/dir", "/", "./x", "../up"]),
)
def test_get_path_matches_torch(tm: SimpleNamespace, basename: str, extension: str, specified_dir: str) -> None:
    with tempfile.TemporaryDirectory() as tmp, env_var("TORCHINDUCTOR_CACHE_DIR", tmp):
        expected = tm.codecache.get_path(basename, extension, specified_dir)
        assert keys.get_path(basename, extension, specified_dir, cache_dir=tm.cache_dir()) == expected


@pytest.mark.torch
def test_system_info_matches_get_system_here(tm: SimpleNamespace) -> None:
    tm.codecache.CacheBase.get_system.cache_clear()
    system = tm.codecache.CacheBase.get_system()
    version = system.get("version", {})
    if "device" in system:  # a GPU build on a GPU machine
        got = keys.system_info(system["device"]["name"], version["triton"], version.get("cuda"), version.get("hip"))
    else:
        got = keys.system_info(None, version.get("triton"))
        if tm.release < (2, 15):
            assert system == {"hash": keys.CPU_SYSTEM_HASH}
    assert json.dumps(got) == json.dumps(system)
    assert keys.system_hash(system) == system["hash"]


@contextlib.contextmanager
def triton_key_set(tm: SimpleNamespace, value: str) -> Iterator[None]:
    """Prepopulate codecache.triton_key() (2.13 on: a prefetchable cache), restoring it after."""
    real = tm.codecache.triton_key()
    tm.codecache.triton_key.clear()
    tm.codecache.triton_key.set(value)
    tm.codecache.CacheBase.get_system.cache_clear()
    try:
        yield
    finally:
        tm.codecache.triton_key.clear()
        tm.codecache.triton_key.set(real)
        tm.codecache.CacheBase.get_system.cache_clear()


@pytest.mark.torch
@torch_settings(60)
@given(triton=text_st)
def test_system_info_matches_get_system_with_any_triton_key(tm: SimpleNamespace, triton: str) -> None:
    """CacheBase.get_system() itself, with triton_key() prepopulated through its own set()."""
    if not hasattr(getattr(tm.codecache, "triton_key", None), "set"):
        pytest.skip(f"torch {tm.torch.__version__}: triton_key is not a prefetchable cache (2.13 on)")
    with triton_key_set(tm, triton):
        system = tm.codecache.CacheBase.get_system()
    if "device" in system:
        pytest.skip("a GPU machine: the CPU branch is not taken")
    got = keys.system_info(None, triton)
    assert json.dumps(got) == json.dumps(system)
    assert keys.system_hash(system) == system["hash"]


@pytest.mark.torch
@torch_settings(200)
@given(
    name=text_st,
    triton=st.none() | text_st,
    cuda=st.none() | st.sampled_from(["12.8", "13.0", "12.4"]),
    hip=st.none() | st.sampled_from(["6.4.43482", "7.0"]),
)
def test_system_hash_matches_torch_strategy(
    tm: SimpleNamespace, name: str, triton: str | None, cuda: str | None, hip: str | None
) -> None:
    """The GPU branch of get_system() (no GPU here to take it): its dict built as the installed
    torch's source builds it, the hash by its own strategy (2.13 on; 2.9 to 2.12 inline)."""
    got = keys.system_info(name, triton, cuda, hip)
    version = {"triton": triton, **({"cuda": cuda} if cuda is not None else {"hip": hip})}
    if tm.release >= (2, 15):
        hash_input: dict[str, Any] = {"version": version, "device": {"name": name}}
    else:
        hash_input = {"device": {"name": name}, "version": version}
    try:
        from torch._inductor.cache_key import SYSTEM_CACHE_KEY_STRATEGY

        expected_hash = SYSTEM_CACHE_KEY_STRATEGY.key_from_json(hash_input)
    except ImportError:  # 2.9 to 2.12: hashlib.sha256(json.dumps(system, sort_keys=True))
        expected_hash = hashlib.sha256(json.dumps(hash_input, sort_keys=True).encode("utf-8")).hexdigest()
    assert json.dumps(got) == json.dumps({**hash_input, "hash": expected_hash})


class _Choice:
    """Stands in for a ChoiceCaller: PersistentCache.lookup only calls hash_key()."""

    def __init__(self, key: str) -> None:
        self.key = key

    def hash_key(self) -> str:
        return self.key


@pytest.mark.torch
@torch_settings(60)
@given(inputs=inputs_repr_st, hint=st.none() | st.integers(-(2**40), 2**40), precision=st.sampled_from(["highest", "high"]))
def test_persistent_cache_key_matches_lookup(tm: SimpleNamespace, inputs: str, hint: int | None, precision: str) -> None:
    torch = tm.torch
    old_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with tm.utils.fresh_cache():
            pc = tm.codecache.PersistentCache()
            pc.lookup([_Choice("c1")], "addmm", inputs, lambda cs: {c: 0.25 for c in cs}, hint_override=hint)
            system = tm.codecache.CacheBase.get_system()
            path = Path(tm.cache_dir()) / "cache" / keys.system_hash(system)
            doc = json.loads(path.read_text())
        # 2.15 keys timings by utils.fp32_matmul_precision_key() ("cuda:<p>,mkldnn:<p>")
        precision_key = getattr(tm.utils, "fp32_matmul_precision_key", None)
        recorded = precision_key() if precision_key is not None else precision
    finally:
        torch.set_float32_matmul_precision(old_precision)
    (key,) = doc["cache"]["addmm"]
    assert key == keys.persistent_cache_inputs_key(inputs, hint)
    assert keys.split_inputs_key(key) == (inputs, hint)
    assert doc["cache"]["addmm"][key] == {recorded: {"c1": 0.25}}
    assert doc["system"] == system


# ---- source trees ----------------------------------------------------------------------------

_stems = st.sampled_from(["a", "b", "ab", "_c", "__init__", "__pycache__", "A", "x-y", "1", "", ".h", "a.b"])
_suffixes = st.sampled_from(["", ".py", ".py", ".pyc", ".so", ".abi3.so", EXT, ".txt", ".py~"])
_names = st.builds(lambda stem, suffix: stem + suffix, _stems, _suffixes).filter(lambda n: n not in ("", ".", ".."))
_trees = st.recursive(
    st.binary(max_size=12),
    lambda children: st.dictionaries(_names, children, max_size=5),
    max_leaves=14,
)


def _write_tree(root: Path, tree: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, node in tree.items():
        if isinstance(node, dict):
            _write_tree(root / name, node)
        else:
            (root / name).write_bytes(node)


def _has_dir_init(tree: dict[str, Any]) -> bool:
    return any(
        isinstance(node, dict) and (inspect.getmodulename(name) == "__init__" or _has_dir_init(node))
        for name, node in tree.items()
    )


def test_build_code_hash_refuses_directory_init(tmp_path: Path) -> None:
    materialize(tmp_path / "a", {"pkg/__init__.py": None, "pkg.py": "x"})
    materialize(tmp_path / "b", {"pkg/__init__.py": None})
    materialize(tmp_path / "c", {"mod.py/inner.py": "x"})
    for root in ("a", "b", "c"):
        with pytest.raises(BadInputError):
            keys.build_code_hash([str(tmp_path / root)], "", hashlib.sha256())


@pytest.mark.torch
@torch_settings(80)
@given(
    trees=st.lists(st.dictionaries(_names, _trees, max_size=6), min_size=1, max_size=2),
    prefix=st.sampled_from(["", "torch.", "x."]),
)
def test_build_code_hash_matches_torch(tm: SimpleNamespace, trees: list[dict[str, Any]], prefix: str) -> None:
    # A directory named __init__.py makes torch recurse into pkgutil.iter_modules(None) (all
    # of sys.path) when a same-named module file exists: cachedb refuses that (tested below).
    assume(not any(_has_dir_init(tree) for tree in trees))
    with tempfile.TemporaryDirectory() as tmp:
        roots = []
        for n, tree in enumerate(trees):
            _write_tree(Path(tmp) / f"root{n}", tree)
            roots.append(os.path.join(tmp, f"root{n}"))
        h = hashlib.sha256()
        try:
            tm.codecache.build_code_hash(roots, prefix, h)
            expected: str | None = h.hexdigest()
        except AssertionError:  # torch: a listed module without a loadable file
            expected = None
        assert build_hex(roots, prefix) == expected


@pytest.fixture(scope="session")
def my_torch_key(tm: SimpleNamespace) -> bytes:
    torch_dir = os.path.dirname(tm.torch.__file__)
    return keys.torch_key(torch_dir, str(tm.torch.__version__))


@pytest.mark.torch
def test_torch_key_matches_installed_torch(tm: SimpleNamespace, my_torch_key: bytes) -> None:
    tm.codecache.torch_key.clear()  # recompute, in case anything prepopulated it
    assert my_torch_key == tm.codecache.torch_key()
    assert len(my_torch_key) == 32


def torch_get_code_hash(tm: SimpleNamespace) -> Any:
    """torch_key()'s own inner ``get_code_hash(root)`` (OSS branch), as torch compiled it: the
    nested function's code object taken from torch_key's code, bound to codecache's globals."""
    import types

    wrapper = tm.codecache.torch_key
    funcs = [c.cell_contents for c in (wrapper.__closure__ or ()) if callable(getattr(c, "cell_contents", None))]
    (original,) = [f for f in funcs if getattr(f, "__name__", "") == "torch_key"]
    (code,) = [c for c in original.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == "get_code_hash"]
    return types.FunctionType(code, tm.codecache.__dict__)


@pytest.mark.torch
@torch_settings(40)
@given(tree=st.dictionaries(_names, _trees, max_size=6), extras=st.lists(st.booleans(), min_size=3, max_size=3))
def test_torch_key_matches_torch_get_code_hash(tm: SimpleNamespace, tree: dict[str, Any], extras: list[bool]) -> None:
    """torch's get_code_hash over a generated torch tree: it reads the installed torch's extra
    files (interface.cpp, streams.h from 2.14, script.ld); the tree holds copies of those, so
    cachedb, reading them from the tree, must agree. Extra files torch does not hash are added
    at random too."""
    assume(not _has_dir_init(tree) and "_inductor" not in tree)
    inductor = os.path.dirname(tm.codecache.__file__)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "torch"
        _write_tree(root, tree)
        for rel, add in zip(("codegen/aoti_runtime/interface.cpp", "codegen/aoti_runtime/streams.h", "script.ld"), extras):
            src = Path(inductor) / rel
            dst = root / "_inductor" / rel
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
            elif add:  # a file this torch does not ship: it must not be hashed either
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(b"not shipped by this torch")
        try:
            expected: bytes | None = torch_get_code_hash(tm)(str(root))
        except AssertionError:
            expected = None
        try:
            got: bytes | None = keys.torch_key(root, str(tm.torch.__version__))
        except BadInputError:
            got = None
    assert got == expected


@contextlib.contextmanager
def cutlass_dir(tm: SimpleNamespace, path: str) -> Iterator[None]:
    with tm.config.patch({tm.cutlass_dir_key: path}):
        tm.codecache.cutlass_key.clear()
        try:
            yield
        finally:
            tm.codecache.cutlass_key.clear()


@pytest.fixture(scope="session")
def cutlass_roots(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """CUTLASS roots: missing, a checkout-like python/ tree, and the installed cutlass_library."""
    base = tmp_path_factory.mktemp("cutlass")
    checkout = base / "checkout"
    materialize(checkout, {"python/cutlass_library/__init__.py": "", "python/cutlass_library/x.py": "x", "README": ""})
    roots = [str(base / "missing"), str(checkout)]
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.origin is not None:
        pkgs = base / "pkgs"
        pkgs.mkdir()
        (pkgs / "cutlass_library").symlink_to(os.path.dirname(spec.origin), target_is_directory=True)
        roots.append(str(pkgs))
    return roots


@pytest.mark.torch
def test_cutlass_key_matches_torch(tm: SimpleNamespace, cutlass_roots: list[str]) -> None:
    assert keys.cutlass_key(cutlass_roots[0]) == hashlib.sha256(b"").digest()
    for root in cutlass_roots:
        with cutlass_dir(tm, root):
            assert keys.cutlass_key(root) == tm.codecache.cutlass_key(), root


@pytest.fixture(scope="session")
def cutlass_sources(tm: SimpleNamespace) -> tuple[bytes, bytes]:
    return (
        Path(inspect.getfile(tm.cutlass_serialization)).read_bytes(),
        Path(inspect.getfile(tm.cutlass_utils)).read_bytes(),
    )


@pytest.mark.torch
@torch_settings(100)
@given(
    arch=st.sampled_from(["80", "90", "100", "120"]) | text_st,
    version=st.sampled_from(["12.8", "13.0", "12.4.0"]) | text_st,
    level=st.sampled_from(["0", "2222", "0201"]) | text_st,
    root_index=st.integers(0, 2),
)
def test_cutlass_config_request_key_matches_torch(
    tm: SimpleNamespace,
    cutlass_roots: list[str],
    cutlass_sources: tuple[bytes, bytes],
    arch: str,
    version: str,
    level: str,
    root_index: int,
) -> None:
    root = cutlass_roots[root_index % len(cutlass_roots)]
    with cutlass_dir(tm, root):
        expected = tm.cutlass_cache.get_config_request_key(arch, version, level)
        ck = tm.codecache.cutlass_key()
    got = keys.cutlass_config_request_key(
        arch, version, level, cutlass_key=ck, serialization_py=cutlass_sources[0], utils_py=cutlass_sources[1]
    )
    assert got == expected
    assert keys.cutlass_config_filename(got) == tm.cutlass_cache._generate_config_filename(expected)


# ---- autotune best configs -------------------------------------------------------------------

_kwarg_values = st.one_of(
    st.integers(-(2**31), 2**31), st.booleans(), st.none(), st.floats(allow_nan=False), text_st
)
_config_st = st.tuples(
    st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8), _kwarg_values, max_size=5),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(0, 6),
)


@pytest.mark.torch
@torch_settings(200)
@given(configs=st.lists(_config_st, max_size=6))
def test_configs_hash_matches_torch(tm: SimpleNamespace, configs: list[tuple[dict[str, Any], int, int]]) -> None:
    objects = [SimpleNamespace(kwargs=kw, num_warps=w, num_stages=s) for kw, w, s in configs]
    expected = tm.triton_heuristics.hash_configs(objects)
    assert keys.configs_hash(configs) == expected
    assert keys.configs_hash(objects) == expected


@pytest.mark.torch
@torch_settings(60)
@given(
    stem=path_text_st,
    tag=text_st,
    tk=st.binary(min_size=32, max_size=32),
    bh=st.text("0123456789ABCDEF", min_size=64, max_size=64),
    configs=st.lists(_config_st.filter(lambda c: all(isinstance(v, (int, bool, str)) or v is None for v in c[0].values())), min_size=1, max_size=3),
)
def test_best_config_keys_match_autotune_cache(
    tm: SimpleNamespace, stem: str, tag: str, tk: bytes, bh: str, configs: list[tuple[dict[str, Any], int, int]]
) -> None:
    """AutotuneCache.create + save with local and remote caches: every key it uses."""
    assume(stem not in (".", ".."))
    objects = [SimpleNamespace(kwargs=kw, num_warps=w, num_stages=s) for kw, w, s in configs]
    ch = tm.triton_heuristics.hash_configs(objects)
    meta = {"autotune_local_cache": True, "autotune_remote_cache": True, "backend_hash": bh, "is_fbcode": False}
    with (
        tm.utils.fresh_cache(),
        backend_override(tm, tm.RemoteAutotuneCache) as backend,
        torch_key_set(tm, tk),
        tm.torch.compiler.config.patch(cache_key_tag=tag),
    ):
        kernel_py = os.path.join(tm.cache_dir(), (stem + "xx")[1:3], stem + ".py")
        cache = tm.ac.AutotuneCache.create(meta, kernel_py, ch)
        assert cache is not None and cache.local_cache is not None and cache.remote_cache is not None
        with tm.CacheArtifactManager.with_fresh_cache():
            cache.save(objects[0], 5_000_000)
            # the Mega-Cache key: 2.13 on on cache.artifact_recorder, 2.9 to 2.12 in the manager
            recorder = getattr(cache, "artifact_recorder", None)
            artifact_key = recorder.key if recorder is not None else tm.CacheArtifactManager._new_cache_artifacts["autotune"][-1].key
        local_path = cache.local_cache[1]
        assert os.path.isfile(local_path)
        (redis_key,) = backend.store
    prepare = keys.best_config_prepare_key(kernel_py, tag)
    assert prepare == cache.remote_cache[1]
    assert keys.best_config_local_path(kernel_py, tk, tag) == local_path
    assert keys.best_config_relative_key(kernel_py, tk, tag) == artifact_key
    remote_id = keys.autotune_remote_cache_id(tk, bh, keys.configs_hash(configs))
    assert remote_id == cache.remote_cache_full_key
    assert keys.autotune_redis_key(remote_id, prepare) == redis_key


@pytest.mark.torch
@torch_settings(200)
@given(code=st.text(st.sampled_from("ab #\n\r\t'\"é"), max_size=60) | text_st)
def test_comment_stripped_hash_matches_torch(tm: SimpleNamespace, code: str) -> None:
    assert keys.comment_stripped_hash(code) == tm.ac._comment_stripped_hash(code)


@pytest.mark.torch
@torch_settings(60)
@given(code=text_st, bh=st.text("0123456789ABCDEF", min_size=64, max_size=64))
def test_bundled_autotune_key_matches_begin_compile(tm: SimpleNamespace, code: str, bh: str) -> None:
    from torch._guards import CompileContext, compile_context

    meta = {"autotune_local_cache": True, "bundled_autotune_remote_cache": True, "backend_hash": bh, "is_fbcode": False}
    with backend_override(tm, tm.RemoteBundledAutotuneCache) as backend, compile_context(CompileContext(None)):
        tm.ac.AutotuneCacheBundler.begin_compile(meta, code=code)
        tm.ac.AutotuneCacheBundler.end_compile()
        (redis_key,) = backend.gets
    key = keys.bundled_autotune_key(bh, code=code)
    assert keys.autotune_redis_key(keys.BUNDLED_AUTOTUNE_CACHE_ID, key) == redis_key


@pytest.mark.torch
def test_bundled_best_config_path_matches_load(tm: SimpleNamespace) -> None:
    """A bundle read from the remote cache is written back through codecache.get_path."""
    from torch._guards import CompileContext, compile_context

    bh, code = "F" * 64, "def kernel(): pass\n"
    entries = {
        "f" + "0123456789abcdef" * 4 + ".best_config": {"XBLOCK": 8, "num_warps": 1, "num_stages": 1},
        "a9" + "e" * 62 + ".best_config": {"num_warps": 4, "num_stages": 2},
    }
    meta = {"autotune_local_cache": True, "bundled_autotune_remote_cache": True, "backend_hash": bh, "is_fbcode": False}
    with tm.utils.fresh_cache(), backend_override(tm, tm.RemoteBundledAutotuneCache) as backend:
        redis_key = keys.autotune_redis_key(keys.BUNDLED_AUTOTUNE_CACHE_ID, keys.bundled_autotune_key(bh, code=code))
        backend.store[redis_key] = json.dumps(entries).encode("ascii")
        with compile_context(CompileContext(None)):
            tm.ac.AutotuneCacheBundler.begin_compile(meta, code=code)
            tm.ac.AutotuneCacheBundler.end_compile()
        base = tm.cache_dir()
        written = sorted(
            os.path.join(d, f) for d, _, files in os.walk(base) for f in files if f.endswith(".best_config")
        )
        assert written == sorted(keys.bundled_best_config_path(name, cache_dir=base) for name in entries)
        for name, data in entries.items():
            assert json.loads(Path(keys.bundled_best_config_path(name, cache_dir=base)).read_text()) == data


@pytest.mark.torch
@torch_settings(200)
@given(cache_id=st.text(st.sampled_from("ab{}0:k"), max_size=10) | text_st, key=text_st)
def test_redis_key_matches_torch(tm: SimpleNamespace, cache_id: str, key: str) -> None:
    try:
        expected = tm.ProbeRedisCache(cache_id)._get_key(key)
    except (KeyError, IndexError, ValueError, AttributeError):
        with pytest.raises(BadInputError):
            keys.autotune_redis_key(cache_id, key)
        return
    assert keys.autotune_redis_key(cache_id, key) == expected


# ---- runtime/caching isolation key -----------------------------------------------------------

_runtime_forms = ("inductor_configs", "torch_determinism_configs", "cuda_matmul_precision_configs")
_compile_forms = ("torch_version_hash", "triton_version_hash", "runtime", "runtime_version", "accelerator_properties")


def _selection(forms: tuple[str, ...]) -> st.SearchStrategy[Any]:
    return st.booleans() | st.fixed_dictionaries({f: st.booleans() for f in forms})


@pytest.mark.torch
@torch_settings(40)
@given(runtime=_selection(_runtime_forms), compile_=_selection(_compile_forms))
def test_isolation_key_matches_torch(tm: SimpleNamespace, runtime: Any, compile_: Any) -> None:
    if tm.caching_context is None:
        pytest.skip(f"torch {tm.torch.__version__} has no runtime/caching (2.10 on)")
    schema = {"runtime_context": runtime, "compile_context": compile_}
    context = tm.caching_context._isolation_context(schema)
    assert keys.isolation_key(context) == tm.caching_context._isolation_key(schema)


@pytest.mark.torch
def test_isolation_torch_version_hash_matches_torch(tm: SimpleNamespace, my_torch_key: bytes) -> None:
    if tm.caching_context is None:
        pytest.skip(f"torch {tm.torch.__version__} has no runtime/caching (2.10 on)")
    tm.caching_context._CompileContext.torch_version_hash.cache_clear()
    tm.codecache.torch_key.clear()
    assert keys.isolation_torch_version_hash(my_torch_key) == tm.caching_context._CompileContext.torch_version_hash()


# ---- CuTe-DSL kernel names ---------------------------------------------------------------------


@pytest.mark.torch
@torch_settings(30)
@given(
    src=text_st,
    descriptive=st.sampled_from([False, "original_aten", "torch", "inductor_node"]),
    names=st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), max_size=3, unique=True),
)
def test_cutedsl_kernel_name_matches_define_kernel(
    tm: SimpleNamespace, src: str, descriptive: Any, names: list[str]
) -> None:
    """CuteDSLScheduling.define_kernel on a real GraphLowering and real fx nodes."""
    from torch._inductor.codegen.cutedsl.cutedsl_scheduling import CuteDSLScheduling
    from torch._inductor.graph import GraphLowering
    from torch._inductor.utils import get_fused_kernel_name
    from torch._inductor.virtualized import V
    from torch.utils._ordered_set import OrderedSet

    torch = tm.torch
    fx_graph = torch.fx.Graph()
    x = fx_graph.placeholder("x")
    nodes = [fx_graph.call_function(torch.ops.aten.add.Tensor, (x, x), name=n) for n in names]
    # get_fused_kernel_name reads node.node.origins of each scheduled node
    schedule = [SimpleNamespace(node=SimpleNamespace(origins=OrderedSet(nodes)))] if nodes else []
    graph = GraphLowering(torch.fx.symbolic_trace(lambda t: t + 1))
    with V.set_graph_handler(graph), tm.config.patch({"triton.descriptive_names": descriptive}):
        graph.init_wrapper_code()
        fused = get_fused_kernel_name(schedule, descriptive) if descriptive else ""
        expected = CuteDSLScheduling(None).define_kernel(src, schedule)
    assert keys.cutedsl_kernel_name(fused, src) == expected


# ---- Triton-only ---------------------------------------------------------------------------------


@pytest.mark.torch
def test_backend_hash_matches_torch(tm: SimpleNamespace) -> None:
    pytest.importorskip("triton")
    if not tm.torch.cuda.is_available():
        pytest.skip("triton_hash_with_backend needs an active GPU driver")
    import torch.utils._triton as torch_triton
    from torch._inductor.runtime.triton_compat import triton_key

    backend = torch_triton.triton_backend()
    assert keys.backend_hash(triton_key(), backend.hash()) == torch_triton.triton_hash_with_backend()


@given(
    source_id=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    python=st.sampled_from(["3.10.14", "3.11.7", "3.12.3", "3.13.0"]),
    other=st.sampled_from(["3.10.14", "3.11.7", "3.12.3", "3.13.0"]),
    gpu=st.one_of(st.none(), st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA H200"])),
)
def test_package_keys_name_the_function_and_tell_systems_apart(
    source_id: str, python: str, other: str, gpu: str | None
) -> None:
    """A precompiled package's key holds torch's source id (the file ``dynamo/<source
    id>/entry``) and a tag of ``SystemInfo``: two systems torch would refuse to share a package
    between get two keys, one system always the same."""
    info = {"python_version": python, "torch_version": "2.13.0+cpu", "toolkit_version": None,
            "triton_version": (3, 7), "gpu_name": gpu}
    key = keys.package_key(source_id, info)
    assert keys.package_source_id(key) == source_id
    assert keys.package_source_id(source_id) == source_id  # stored without a system
    assert key == keys.package_key(source_id, dict(reversed(list(info.items()))))
    assert (key == keys.package_key(source_id, {**info, "python_version": other})) == (python == other)
    assert re.fullmatch(r"[0-9a-f]{64}\.[0-9a-f]{16}", key)
