"""Inductor's cache-key formulas, re-implemented without torch and bit-exact with torch 2.9 to 2.15.

Every public function names the torch function it mirrors (paths relative to the installed
``torch`` package). They only hash and format: they never import torch, never read torch's
live state (configs, ``cache_dir()``, devices) and take whatever that state would supply as
arguments instead. The only functions that touch the file system are :func:`build_code_hash`,
:func:`torch_key` and :func:`cutlass_key`, which read a source tree the way torch does, and
those whose formula changed between torch releases when no ``torch_version`` is given: they
read the installed torch's version from its ``version.py`` (:mod:`._versions`).

One module per torch module mirrored; this package re-exports every public name, so
``from cachedb.keys import X`` and ``cachedb.keys.X`` work for all of them:

- :mod:`.codecache`: torch/_inductor/codecache.py (entry names, code hashes, paths,
  system hash, ``PersistentCache`` keys);
- :mod:`.source_hashes`: torch/_inductor/codecache.py (``build_code_hash``, ``torch_key``,
  ``cutlass_key``: source-tree digests);
- :mod:`.autotune_cache`: torch/_inductor/runtime/autotune_cache.py (best configs, remote
  and bundled autotune caches);
- :mod:`.triton_heuristics`: torch/_inductor/runtime/triton_heuristics.py (``configs_hash``);
- :mod:`.remote_cache`: torch/_inductor/remote_cache.py (Redis keys);
- :mod:`.cutlass`: torch/_inductor/codegen/cutlass/cache.py (CUTLASS op lists);
- :mod:`.caching_context`: torch/_inductor/runtime/caching/context.py (isolation key);
- :mod:`.cutedsl`: torch/_inductor/codegen/cutedsl/cutedsl_scheduling.py (kernel names);
- :mod:`.dynamo_package`: torch/_dynamo/package.py (precompiled packages: source id and
  the system they were built for);
- :mod:`._common`: torch/_inductor/cache_key.py (the hashing primitives);
- :mod:`._versions`: which torch release's formula applies.

Notation used below: ``hex(x) = hashlib.sha256(x).hexdigest()``; ``b32_51(d) =
base64.b32encode(d)[:51].decode().lower()``; ``‖`` is byte concatenation; strings are UTF-8
encoded before hashing. torch 2.13 spells these as the strategies of
``torch/_inductor/cache_key.py`` (``COMPACT``, ``CODE``, ``SYSTEM``, ``AUTOTUNE``).

Formulas that changed between torch releases follow a ``torch_version`` keyword (the installed
torch's by default; for stored data, the version its fingerprint records), and their docstrings
say which release does what (:mod:`._versions` lists the changes): ``system_info`` and
``system_hash`` (2.15), ``torch_key`` (2.14), ``get_hash`` (2.11), ``best_config_local_path``
(2.13).

Frozen test vectors: ``tests/data/key_vectors/torch-<VERSION>.json``, one per torch release
(made by ``tests/data/make_key_vectors.py`` from that torch's own functions).
"""

from __future__ import annotations

from . import _versions  # noqa: F401  (keys._versions: which release's formula applies)
from ._common import KeyComponent
from .autotune_cache import (
    AUTOTUNE_REMOTE_SALT,
    BEST_CONFIG_EXTENSION,
    BUNDLED_AUTOTUNE_CACHE_ID,
    BUNDLED_AUTOTUNE_SALT,
    autotune_remote_cache_id,
    backend_hash,
    best_config_filename,
    best_config_local_path,
    best_config_prepare_key,
    best_config_relative_key,
    bundled_autotune_key,
    bundled_best_config_path,
    comment_stripped_hash,
)
from .caching_context import isolation_key, isolation_torch_version_hash
from .codecache import (
    CPU_SYSTEM_HASH,
    code_hash,
    get_hash,
    get_path,
    persistent_cache_inputs_key,
    sha256_digest_name,
    sha256_hash,
    split_inputs_key,
    system_hash,
    system_info,
)
from .cutedsl import cutedsl_kernel_name
from .dynamo_package import package_key, package_source_id, package_system_tag
from .cutlass import (
    CUTLASS_CONFIG_PREFIX,
    cutlass_config_filename,
    cutlass_config_request_key,
    cutlass_toolkit_version,
)
from .remote_cache import REDIS_KEY_VERSION, autotune_redis_key
from .source_hashes import build_code_hash, cutlass_key, torch_key
from .triton_heuristics import configs_hash

__all__ = [
    "AUTOTUNE_REMOTE_SALT",
    "BEST_CONFIG_EXTENSION",
    "BUNDLED_AUTOTUNE_CACHE_ID",
    "BUNDLED_AUTOTUNE_SALT",
    "CPU_SYSTEM_HASH",
    "CUTLASS_CONFIG_PREFIX",
    "KeyComponent",
    "REDIS_KEY_VERSION",
    "autotune_redis_key",
    "autotune_remote_cache_id",
    "backend_hash",
    "best_config_filename",
    "best_config_local_path",
    "best_config_prepare_key",
    "best_config_relative_key",
    "build_code_hash",
    "bundled_autotune_key",
    "bundled_best_config_path",
    "code_hash",
    "comment_stripped_hash",
    "configs_hash",
    "cutedsl_kernel_name",
    "cutlass_config_filename",
    "cutlass_config_request_key",
    "cutlass_key",
    "cutlass_toolkit_version",
    "get_hash",
    "get_path",
    "isolation_key",
    "isolation_torch_version_hash",
    "package_key",
    "package_source_id",
    "package_system_tag",
    "persistent_cache_inputs_key",
    "sha256_digest_name",
    "sha256_hash",
    "split_inputs_key",
    "system_hash",
    "system_info",
    "torch_key",
]
