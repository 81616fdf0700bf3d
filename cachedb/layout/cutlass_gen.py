"""Generate a CUTLASS op list with torch's own generator and store it in the database.

torch has no writer for ``configs_<request key>.json`` (formats doc §2.4): ``maybe_fetch_ops``
(torch/_inductor/codegen/cutlass/cache.py) only reads it, and on a miss every process runs the
CUTLASS generator again (``gen_ops``, torch/_inductor/codegen/cutlass/utils.py). :func:`generate`
runs that generator once, for a given arch / CUDA version / instantiation level, and returns
the op list exactly as ``maybe_fetch_ops`` reads it, under the request key it computes;
:func:`store` puts it into ``cutlass_op_lists`` / ``cutlass_ops``, where the live backend's
``maybe_fetch_ops`` (cachedb/live/_seams.py) finds it.

What is torch's and what is cachedb's:

- the request key is ``get_config_request_key(arch, version, level)``
  (torch/_inductor/codegen/cutlass/cache.py), with ``arch = cutlass_arch("cuda")`` and
  ``version = toolkit_version("cuda")`` cut to ``major.minor``, as ``maybe_fetch_ops`` does;
- the ops are ``pytree.tree_flatten(gen_ops("cuda"))[0]``, as ``CUTLASSGemmTemplate.gen_ops``
  (torch/_inductor/codegen/cutlass/gemm_template.py) flattens them on a cache miss;
- each op is ``get_cutlass_operation_serializer().serialize(op)``
  (torch/_inductor/codegen/cutlass/serialization.py) and the file is ``json.dumps`` of that
  list of strings with the default separators (``", "``, ``": "``), no trailing newline: the
  form of the real list in the test corpus, which ``json.load`` in ``maybe_fetch_ops`` reads.

The CUTLASS root. ``try_import_cutlass`` (codegen/cutlass/utils.py) imports the generator from
``<config.cutlass.cutlass_dir>/python/{cutlass_library,cutlass_cppgen,pycute}`` only, and the
request key hashes that root's top-level Python modules (``cutlass_key()``,
torch/_inductor/codecache.py: ``build_code_hash([cutlass_dir], "", sha256)``). A CUTLASS
checkout has none (only ``python/``, ``include/``, ...), nor does a root that does not exist, so
``cutlass_key() = sha256(b"")`` in both cases. Without a checkout, :func:`generate` builds such
a root from the installed ``nvidia-cutlass`` wheel: ``<cache_dir()>/cachedb_cutlass_root/python/``
holding symlinks to the installed packages. It is kept (not a temporary directory) because
``try_import_cutlass`` leaves symlinks to it under ``<cache_dir()>/torch_cutlass`` and asserts,
on its next run in that cache dir, that they still resolve to the same place.

Determinism. The set of ops is reproducible; their order is not: cutlass_library's
``generate_tile_descriptions_sm90`` (cutlass_library/sm90_utils.py) collects ``TileDescription``
objects, which hash by identity, in a ``set``, so the list order changes from one process to
the next (even with a fixed ``PYTHONHASHSEED``). Inductor does not depend on it:
``CUTLASSGemmTemplate.gen_ops`` keys the filtered ops by ``configuration_name()`` (unique per
op in these lists) and sorts them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import CacheDBError, TorchUnavailableError
from ..formats.cutlass_ops import parse_op_list
from ..db import CacheDB

__all__ = [
    "CUTLASS_PACKAGES",
    "CutlassGenerationError",
    "CutlassUnavailableError",
    "GeneratedOpList",
    "generate",
    "generate_and_store",
    "store",
]

#: The packages ``try_import_cutlass`` imports from ``<cutlass_dir>/python``.
CUTLASS_PACKAGES = ("cutlass_library", "cutlass_cppgen", "pycute")
#: Directory under ``cache_dir()`` holding the CUTLASS root built from the installed wheel.
ROOT_DIRNAME = "cachedb_cutlass_root"


class CutlassUnavailableError(CacheDBError):
    """torch's CUTLASS generator cannot run: ``cutlass_library`` (``pip install
    nvidia-cutlass``, or ``cachedb[cutlass]``) is missing, or torch cannot import it from the
    CUTLASS root."""


class CutlassGenerationError(CacheDBError):
    """torch's CUTLASS generator ran but gave no usable op list (unsupported arch, bad
    version, an empty list, ...)."""


@dataclass(frozen=True)
class GeneratedOpList:
    """What :func:`generate_and_store` did."""

    request_key: str
    arch: int
    cuda_version: str
    instantiation_level: str
    op_count: int
    size_bytes: int
    added: bool
    generate_s: float


def _import_torch_cutlass() -> tuple[Any, Any, Any, Any, Any, Any]:
    """``(config, cache, utils, serialization, cuda_env, pytree)`` of the installed torch."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise TorchUnavailableError(f"generating a CUTLASS op list needs torch: {exc}") from exc
    try:
        import torch._inductor.config as config
        from torch._inductor.codegen.cuda import cuda_env
        from torch._inductor.codegen.cutlass import cache, serialization, utils
        from torch.utils import _pytree as pytree
    except ImportError as exc:  # torch 2.9/2.10 keep these under codegen/cuda
        raise TorchUnavailableError(
            f"this torch has no torch._inductor.codegen.cutlass (torch >= 2.11 needed): {exc}"
        ) from exc
    return config, cache, utils, serialization, cuda_env, pytree


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise CutlassUnavailableError(
            f"Python package {name!r} is not installed; torch's CUTLASS generator needs "
            "nvidia-cutlass (pip install 'cachedb[cutlass]')"
        )
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _has_python_packages(root: str | os.PathLike[str]) -> bool:
    return (Path(root) / "python" / "cutlass_library").is_dir()


def _link(dst: Path, src: Path) -> None:
    """Make ``dst`` a symlink to ``src`` (replacing a symlink to elsewhere); race-tolerant."""
    if dst.is_symlink() and Path(os.readlink(dst)) == src:
        return
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(src, tmp)
    os.replace(tmp, dst)


def installed_cutlass_root(base: str | os.PathLike[str]) -> Path:
    """A CUTLASS root for ``config.cutlass.cutlass_dir`` made of the installed packages:
    ``<base>/cachedb_cutlass_root/python/<pkg>`` -> the installed ``<pkg>`` for each of
    :data:`CUTLASS_PACKAGES`. Its top level holds no Python module, so ``cutlass_key()`` over
    it is ``sha256(b"")``.

    Raises :class:`CutlassUnavailableError` when a package is not installed.
    """
    sources = {name: _package_dir(name) for name in CUTLASS_PACKAGES}
    python = Path(base) / ROOT_DIRNAME / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items():
        _link(python / name, src)
    return python.parent


def _clear_caches(cache: Any, utils: Any, serialization: Any, cuda_env: Any) -> None:
    """Clear the per-process caches that hold the arch, the CUDA version, the CUTLASS import
    and the generated ops (all ``functools`` caches in torch/_inductor/codegen/cutlass/utils.py,
    serialization.py, cache.py and codegen/cuda/cuda_env.py)."""
    for fn in (
        getattr(cuda_env, "get_cuda_arch", None),
        getattr(cuda_env, "get_cuda_version", None),
        getattr(utils, "cutlass_arch", None),
        getattr(utils, "toolkit_version", None),
        getattr(utils, "try_import_cutlass", None),
        getattr(utils, "_gen_ops_cached", None),  # keyed by arch/version, not by level
        getattr(serialization, "get_cutlass_operation_serializer", None),
        getattr(cache, "maybe_fetch_ops", None),
    ):
        clear = getattr(fn, "cache_clear", None)
        if callable(clear):
            clear()


@contextlib.contextmanager
def _patched(config: Any, patch: dict[str, Any], clear: Any) -> Iterator[None]:
    clear()
    try:
        with config.patch(patch):
            clear()
            try:
                yield
            finally:
                clear()
    finally:
        clear()


def generate(
    arch: str,
    cuda_version: str,
    level: str = "0",
    *,
    cutlass_dir: str | os.PathLike[str] | None = None,
) -> tuple[str, bytes]:
    """Run torch's CUTLASS generator once; return ``(request_key, op list bytes)``.

    ``arch`` is a CUDA arch as ``config.cuda.arch`` takes it (``"90"``, ``"90a"``, ``"100"``);
    torch normalizes it (``_normalize_cuda_arch``: ``"89"`` -> ``"80"``) and the key uses the
    normalized value. ``cuda_version`` is ``config.cuda.version`` (``"12.8"``; the generator sees
    it as given, the key uses ``major.minor``). ``level`` is
    ``config.cutlass.cutlass_instantiation_level``. ``cutlass_dir``: the CUTLASS root to use;
    default: ``config.cutlass.cutlass_dir`` if it holds ``python/cutlass_library``, else a root
    built from the installed ``nvidia-cutlass`` wheel (module docstring).

    Mirrors ``maybe_fetch_ops`` (key) and ``CUTLASSGemmTemplate.gen_ops`` (ops) under
    ``torch._inductor.config.patch({"cuda.arch", "cuda.version",
    "cutlass.cutlass_instantiation_level", "cutlass.cutlass_dir"})``; torch's lru caches of the
    arch, version, CUTLASS import and generated ops are cleared before and after, so the
    process's later compiles see its own configuration again. Measured on 2 cores: arch 90 /
    CUDA 12.8 / level 0 gives 21,268 ops, 83.7 MB, in ~3.5 s (generator ~1.8 s, serializer
    ~1.5 s) plus ~3 s for the first import of cutlass_library, ~0.6 GB peak memory; arch 100 /
    CUDA 12.9 gives 127,808 ops, 518 MB, in ~29 s.

    Raises:
        TorchUnavailableError: torch (>= 2.11, with codegen/cutlass) is not importable.
        CutlassUnavailableError: cutlass_library is not installed or torch cannot import it.
        CutlassGenerationError: the generator failed or produced no ops.
    """
    config, cache, utils, serialization, cuda_env, pytree = _import_torch_cutlass()
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    arch, cuda_version, level = str(arch), str(cuda_version), str(level)
    if cutlass_dir is not None:
        root = Path(cutlass_dir)
        if not _has_python_packages(root):
            raise CutlassUnavailableError(f"{root}: not a CUTLASS root (no python/cutlass_library)")
    elif _has_python_packages(config.cutlass.cutlass_dir):
        root = Path(config.cutlass.cutlass_dir)
    else:
        root = installed_cutlass_root(cache_dir())

    def clear() -> None:
        _clear_caches(cache, utils, serialization, cuda_env)

    patch = {
        "cuda.arch": arch,
        "cuda.version": cuda_version,
        "cutlass.cutlass_instantiation_level": level,
        "cutlass.cutlass_dir": os.path.realpath(root),
    }
    with _patched(config, patch, clear):
        if not utils.try_import_cutlass():
            raise CutlassUnavailableError(
                f"torch cannot import CUTLASS from {root}/python (torch/_inductor/codegen/cutlass/"
                "utils.py: try_import_cutlass); see TORCH_LOGS=+inductor for the import error"
            )
        serializer = serialization.get_cutlass_operation_serializer()
        try:
            # maybe_fetch_ops: arch, version cut to major.minor, level -> request key.
            key_arch: str = utils.cutlass_arch("cuda")
            version: str = utils.toolkit_version("cuda")
            key_version = ".".join(str(version).split(".")[:2])
            request_key: str = cache.get_config_request_key(
                key_arch, key_version, config.cutlass.cutlass_instantiation_level
            )
            # CUTLASSGemmTemplate.gen_ops on a cache miss.
            ops = pytree.tree_flatten(utils.gen_ops("cuda"))[0]
        except CacheDBError:
            raise
        except Exception as exc:  # NotImplementedError (arch), ValueError, AssertionError, ...
            raise CutlassGenerationError(
                f"torch's CUTLASS generator failed for arch={arch!r} cuda={cuda_version!r} "
                f"level={level!r}: {type(exc).__name__}: {exc}"
            ) from exc
        if not ops:
            raise CutlassGenerationError(
                f"torch's CUTLASS generator produced no ops for arch={arch!r} cuda={cuda_version!r} "
                f"level={level!r}"
            )
        data = json.dumps([serializer.serialize(op) for op in ops]).encode("utf-8")
    return request_key, data


def store(
    db: CacheDB,
    request_key: str,
    data: bytes,
    *,
    arch: int | None = None,
    cuda_version: str | None = None,
    instantiation_level: str | None = None,
) -> bool:
    """Store the op list ``data`` under ``request_key`` (``repos.cutlass.put``), with one
    parsed row per op (:func:`cachedb.formats.cutlass_ops.parse_op_list`). Returns False if the same
    bytes were already stored under the key.

    Raises :class:`~cachedb.CutlassOpListError` if ``data`` is not an op list torch can read.
    """
    rows = parse_op_list(data, where=f"configs_{request_key}.json")
    with db.transaction() as repos:
        return repos.cutlass.put(
            request_key,
            data,
            rows,
            arch=arch,
            cuda_version=cuda_version,
            instantiation_level=instantiation_level,
        )


def generate_and_store(
    db: CacheDB,
    arch: str,
    cuda_version: str,
    level: str = "0",
    *,
    cutlass_dir: str | os.PathLike[str] | None = None,
) -> GeneratedOpList:
    """:func:`generate` then :func:`store`, recording the arch the key was computed with (torch's
    normalized arch), ``major.minor`` of the CUDA version and the level. Raises what they raise."""
    t0 = time.perf_counter()
    request_key, data = generate(arch, cuda_version, level, cutlass_dir=cutlass_dir)
    elapsed = time.perf_counter() - t0
    _, _, utils, _, _, _ = _import_torch_cutlass()
    key_arch = int(utils._normalize_cuda_arch(str(arch)))
    key_version = ".".join(str(cuda_version).split(".")[:2])
    rows_added = store(db, request_key, data, arch=key_arch, cuda_version=key_version, instantiation_level=str(level))
    return GeneratedOpList(
        request_key=request_key,
        arch=key_arch,
        cuda_version=key_version,
        instantiation_level=str(level),
        op_count=_count_ops(db, request_key),
        size_bytes=len(data),
        added=rows_added,
        generate_s=elapsed,
    )


def _count_ops(db: CacheDB, request_key: str) -> int:
    from sqlalchemy import select

    from ..store.models import CutlassOpList

    with db.read() as repos:
        count = repos.session.execute(
            select(CutlassOpList.op_count).where(CutlassOpList.request_key == request_key)
        ).scalar()
    return int(count or 0)

