"""System fingerprints: Inductor's system hash completed with the torch build and the host."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

from ._errors import BadInputError, TorchUnavailableError


@dataclass(frozen=True)
class Fingerprint:
    """Where cache entries were produced.

    ``system`` is ``CacheBase.get_system()`` (torch/_inductor/codecache.py) exactly as Inductor
    writes it into ``cache/<system hash>``: ``{"device": {"name": ...}, "version": {"triton":
    ..., "cuda": ...}, "hash": ...}`` on a GPU, ``{"hash": "44136fa3…"}`` on a CPU-only
    machine (torch 2.15: ``{"version": {"triton": ...}, "hash": ...}`` there, and ``"version"``
    before ``"device"`` on a GPU). ``torch_key`` is the hex digest of ``torch_key()``; ``cpu_model`` and ``isa``
    (``torch.backends.cpu.get_cpu_capability()``) tell CPU machines apart, which share one
    system hash. Fields unknown for imported data are ``None``.
    """

    system: dict[str, Any]
    torch_version: str | None = None
    torch_key: str | None = None
    cpu_model: str | None = None
    isa: str | None = None
    _key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.system, dict) or not isinstance(self.system.get("hash"), str):
            raise BadInputError("system", f"not a system description with a 'hash': {self.system!r}")
        ident = {
            "system_hash": self.system_hash,
            "torch_version": self.torch_version,
            "torch_key": self.torch_key,
            "cpu_model": self.cpu_model,
            "isa": self.isa,
        }
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()
        object.__setattr__(self, "_key", key)

    @property
    def key(self) -> str:
        """The natural key: SHA-256 hex digest of the canonical JSON of the identifying fields."""
        return self._key

    @property
    def system_hash(self) -> str:
        return str(self.system["hash"])

    @property
    def device_name(self) -> str | None:
        return (self.system.get("device") or {}).get("name")

    @property
    def triton_key(self) -> str | None:
        return (self.system.get("version") or {}).get("triton")

    @property
    def cuda_version(self) -> str | None:
        return (self.system.get("version") or {}).get("cuda")

    @property
    def hip_version(self) -> str | None:
        return (self.system.get("version") or {}).get("hip")

    def recomputed_system_hash(self) -> str:
        """``system``'s hash recomputed by :func:`cachedb.keys.system_hash` with the formula of
        the torch release this fingerprint records (``torch_version``; the installed torch's
        where it is unknown). Equal to :attr:`system_hash` for every system torch 2.9 to 2.15
        writes; torch 2.15 hashes Triton's key on machines without a GPU, earlier releases
        do not. Raises :class:`~cachedb.BadInputError` for a system no torch release writes."""
        from .keys import system_hash

        return system_hash(self.system, torch_version=self.torch_version)

    @property
    def system_json(self) -> str:
        """``system`` as compact JSON, keys in Inductor's order."""
        return json.dumps(self.system)


def cpu_model() -> str | None:
    """The host CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def current() -> Fingerprint:
    """The fingerprint of this process: torch's system info, torch build and host.

    Raises :class:`~cachedb.TorchUnavailableError` where torch is not importable.
    """
    try:
        import torch
        from torch._inductor.codecache import CacheBase, torch_key
    except ImportError as exc:
        raise TorchUnavailableError(f"the current fingerprint needs torch: {exc}") from exc
    return Fingerprint(
        system=dict(CacheBase.get_system()),
        torch_version=str(torch.__version__),
        torch_key=torch_key().hex(),
        cpu_model=cpu_model(),
        isa=str(torch.backends.cpu.get_cpu_capability()),
    )


def _cpu_flags() -> str:
    """The CPU's feature flags (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


@functools.cache
def cpp_host_parts() -> dict[str, str]:
    """What :func:`cpp_host_key` hashes, by name: ``compiler`` (its file name), ``compiler_version``
    (``torch._inductor.cpp_builder.get_cpp_compiler`` / ``get_compiler_version_info``),
    ``cpu_flags`` (``/proc/cpuinfo``'s, sorted, space-separated), ``machine``, ``torch`` and
    ``python`` (``3.11``). Computed once per process (runs ``<compiler> -v``).

    Raises :class:`~cachedb.TorchUnavailableError` where torch is not importable."""
    try:
        import torch
        from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler
    except ImportError as exc:
        raise TorchUnavailableError(f"the C++ host key needs torch: {exc}") from exc

    compiler = get_cpp_compiler()
    return {
        "compiler": os.path.basename(compiler),
        "compiler_version": get_compiler_version_info(compiler),
        "cpu_flags": _cpu_flags(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }


@functools.cache
def cpp_host_key() -> str:
    """SHA-256 hex digest (64 characters) of what decides whether a C++ kernel library built
    here loads and runs correctly elsewhere (:func:`cpp_host_parts`, as sorted JSON): the C++
    compiler and its version, the CPU's feature flags (the libraries are built with
    ``-march=native``), the machine, the torch version and the Python version. Computed once
    per process.

    Raises :class:`~cachedb.TorchUnavailableError` where torch is not importable."""
    return hashlib.sha256(json.dumps(cpp_host_parts(), sort_keys=True).encode("utf-8")).hexdigest()
