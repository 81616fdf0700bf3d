"""The factors of a cache key: what torch hashed into it, one item each.

For an FX graph entry torch's ``compiled_fx_graph_hash`` (torch/_inductor/codecache.py)
builds ``FxGraphHashDetails`` and, through ``FxGraphCachePickler.debug_lines``, one line per
hashed item: ``"[<hash>] <attr>: <value>"`` for an attribute, ``"[<hash>] <attr>[<i>]: ..."``
for each item of a list attribute and ``"[<hash>] <attr>[<k>]: ..."`` for each value of a dict
attribute. :func:`parse_debug_lines` turns those lines into :class:`Factor` rows:

- ``factor``: ``attr``, ``attr[i]`` (a list item: ``example_inputs[0]``) or ``attr.k`` (a dict
  value: ``inductor_config.max_autotune_pointwise``, ``fx_kwargs.is_backward``);
- ``hash``: the first :data:`HASH_CHARS` characters of torch's hash of that item;
- ``value``: a short readable form, at most :data:`VALUE_CHARS` characters: a tensor's
  ``TensorMetadata`` as ``float32[64]`` (its stride added where it is not the contiguous one),
  the graph's code with its white space folded, and ``#<hash>`` where torch's text is not
  printable (``torch_version`` is a digest).

:func:`differences` compares two factor sets in words. :func:`timing_factors` gives those of an
autotune timings lookup, which torch keys by a path, not a hash.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Characters of torch's factor hash kept (base32: 80 bits).
HASH_CHARS = 16
#: Characters of a factor's readable value kept.
VALUE_CHARS = 200
#: Characters of a factor's name kept.
NAME_CHARS = 200

_LINE = re.compile(r"\[(?P<hash>[a-z0-9]+)\] (?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<item>[^\]]*)\])?: ")
_TENSOR = re.compile(
    r"TensorMetadata\(dtype=torch\.(?P<dtype>\w+), shape=torch\.Size\(\[(?P<shape>[^\]]*)\]\), "
    r"stride=\((?P<stride>[^)]*)\)"
)


@dataclass(frozen=True)
class Factor:
    """One hashed item of a key: its name, the first :data:`HASH_CHARS` characters of torch's
    hash of it, and a short readable value."""

    factor: str
    hash: str
    value: str


def _contiguous(shape: list[str]) -> list[str] | None:
    stride, acc = [], 1
    for dim in reversed(shape):
        if not dim.isdigit():
            return None
        stride.append(str(acc))
        acc *= max(int(dim), 1)
    return list(reversed(stride))


def readable(value: str, hash_: str) -> str:
    """A short readable form of one debug line's value (``str`` of what torch hashed):
    ``TensorMetadata(...)`` as ``dtype[shape]`` (plus ``stride=(...)`` where it is not the
    contiguous stride), everything else with its white space folded, at most
    :data:`VALUE_CHARS` characters; ``#<hash>`` where the text is not printable."""
    m = _TENSOR.match(value)
    if m:
        shape = [d.strip() for d in m["shape"].split(",") if d.strip()]
        stride = [d.strip() for d in m["stride"].split(",") if d.strip()]
        text = f"{m['dtype']}[{', '.join(shape)}]"
        if stride != _contiguous(shape):
            text += f" stride=({', '.join(stride)})"
        return text[:VALUE_CHARS]
    text = " ".join(value.split())
    if not text.isprintable() or "\ufffd" in text:
        return f"#{hash_}"
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 3] + "..."


def parse_debug_lines(lines: Iterable[str]) -> list[Factor]:
    """The factors of torch's debug lines (``FxGraphCachePickler.debug_lines``, what
    ``compiled_fx_graph_hash`` returns beside the key), in torch's order. A value spanning
    several lines (the graph's code) belongs to the line that starts it; text before the first
    ``[hash] name:`` line is ignored. A name met twice keeps its first value."""
    factors: dict[str, Factor] = {}
    current: tuple[str, str, list[str]] | None = None

    def close() -> None:
        if current is not None and current[0] not in factors:
            name, hash_, parts = current
            factors[name] = Factor(name, hash_, readable("\n".join(parts), hash_))

    for chunk in lines:
        for line in str(chunk).split("\n"):
            m = _LINE.match(line)
            if m is None:
                if current is not None:
                    current[2].append(line)
                continue
            close()
            name, item = m["name"], m["item"]
            if item is not None:
                name = f"{name}[{item}]" if item.isdigit() else f"{name}.{item}"
            current = (name[:NAME_CHARS], m["hash"][:HASH_CHARS], [line[m.end():]])
    close()
    return list(factors.values())


@dataclass(frozen=True)
class Difference:
    """One factor that differs: its value in the stored entry and in the key wanted (``None``
    where that side lacks the factor)."""

    factor: str
    stored: str | None
    wanted: str | None

    def words(self) -> str:
        """``factor: stored -> wanted`` (``(none)`` for a side without it)."""
        return f"{self.factor}: {self.stored if self.stored is not None else '(none)'} -> " \
               f"{self.wanted if self.wanted is not None else '(none)'}"


def differences(stored: Mapping[str, tuple[str, str]], wanted: Mapping[str, tuple[str, str]]) -> list[Difference]:
    """The factors whose hashes differ between ``stored`` and ``wanted`` (each ``{factor:
    (hash, value)}``), or that one side lacks, in ``wanted``'s order then ``stored``'s."""
    out = []
    for name, (h, v) in wanted.items():
        if name not in stored:
            out.append(Difference(name, None, v))
        elif stored[name][0] != h:
            out.append(Difference(name, stored[name][1], v))
    out += [Difference(name, v, None) for name, (_h, v) in stored.items() if name not in wanted]
    return out


def equal_count(stored: Mapping[str, tuple[str, str]], wanted: Mapping[str, tuple[str, str]]) -> int:
    """How many factors ``stored`` and ``wanted`` share with the same hash."""
    return sum(1 for name, (h, _v) in wanted.items() if name in stored and stored[name][0] == h)


# -- autotune timings ------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 3] + "..."


def system_words(system_hash: str, device_name: str | None = None, cuda_version: str | None = None,
                 hip_version: str | None = None) -> str:
    """A system hash in words: ``NVIDIA H100 80GB HBM3 / CUDA 12.8 (#<hash[:12]>)``, the device
    and its toolkit where the system has a GPU, else ``no GPU (#<hash[:12]>)``."""
    parts = [device_name or "no GPU"]
    if cuda_version:
        parts.append(f"CUDA {cuda_version}")
    if hip_version:
        parts.append(f"HIP {hip_version}")
    return f"{' / '.join(parts)} (#{system_hash[:12]})"


def timing_key(system_hash: str, op: str, inputs: str, hint_override: int | None, precision: str) -> str:
    """cachedb's key of one autotune timings lookup, ``<op>:<digest>`` (at most 81 characters):
    torch's own is the path ``local_cache[op][inputs key][precision]`` of the system's
    ``cache/<system hash>`` document (``PersistentCache.lookup``, torch/_inductor/codecache.py)."""
    return f"{op[:64]}:{_digest(chr(0).join([system_hash, op, inputs, repr(hint_override), precision]))}"


def timing_factors(system_hash: str, system_value: str, op: str, inputs: str, hint_override: int | None,
                   precision: str, choices: Iterable[tuple[str, str | None]] = ()) -> list[Factor]:
    """The factors of an autotune timings lookup, what ``PersistentCache.lookup``
    (torch/_inductor/codecache.py, torch 2.9 to 2.15) looks up: the document of the system
    (``system``: ``CacheBase.get_system()["hash"]``, in words :func:`system_words`), then
    ``local_cache[op][inputs]`` (``inputs`` + ``_<hint_override>`` where there is one)
    ``[torch.get_float32_matmul_precision()][choice.hash_key()]`` for every choice. Factors:
    ``system``, ``op``, ``inputs[i]`` (each item of the inputs key torch builds,
    ``AlgorithmSelectorCache.key_of`` per input node: device, dtype, sizes, strides, offset;
    ``inputs`` whole where it is not a list), ``hint_override`` (where given), ``precision`` and
    ``choice[<hash>]`` per choice (its ``name`` as the value, where known). Hashes: the first
    :data:`HASH_CHARS` hex characters of SHA-256 of the item (torch hashes none of them)."""
    out = [Factor("system", system_hash[:HASH_CHARS], _short(system_value)), Factor("op", _digest(op), _short(op))]
    try:
        items = ast.literal_eval(inputs)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        items = None
    if isinstance(items, (list, tuple)):
        for i, item in enumerate(items):
            text = repr(item)
            out.append(Factor(f"inputs[{i}]", _digest(text), _short(text)))
    else:
        out.append(Factor("inputs", _digest(inputs), _short(inputs)))
    if hint_override is not None:
        out.append(Factor("hint_override", _digest(str(hint_override)), str(hint_override)))
    out.append(Factor("precision", _digest(precision), _short(precision)))
    out += [choice_factor(choice_hash, name) for choice_hash, name in choices]
    return out


def choice_factor(choice_hash: str, name: str | None) -> Factor:
    """The factor ``choice[<hash>]`` of one autotune choice (``ChoiceCaller.hash_key()``), its
    ``name`` as the value where known."""
    return Factor(f"choice[{choice_hash[:NAME_CHARS - 8]}]", _digest(choice_hash), _short(name or choice_hash))


# -- C++ kernel libraries --------------------------------------------------------------------

#: The ``entry_factors`` kind of a C++ host's factors (keyed by its host key): what a stored
#: library's host was, for the misses of another host.
CPP_HOST = "cpp_host"

#: The version line of ``<compiler> -v`` (torch's ``get_compiler_version_info`` joins its lines
#: with ``_``): ``gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)``, ``clang version 18.1.8``.
_COMPILER_VERSION = re.compile(r"(?:^|_)([^_\n]*?\bversion \d[^_\n]*)")


def _compiler_words(text: str) -> str:
    """The line of ``<compiler> -v`` that names its version, else the text folded."""
    found = _COMPILER_VERSION.findall(text)
    return _short(found[-1].strip() if found else text)


def _flags_words(flags: str) -> str:
    words = flags.split()
    return _short(f"{len(words)} flags: {' '.join(w for w in words if w.startswith(('avx', 'amx', 'sve', 'neon')))}")


def cpp_host_factors(host_key: str, parts: Mapping[str, str] | None) -> list[Factor]:
    """The factors of the host a C++ kernel library is stored under: ``host`` (its host key,
    :func:`cachedb.fingerprint.cpp_host_key`) and, where ``parts`` (what that key hashes,
    :func:`cachedb.fingerprint.cpp_host_parts`) are known, ``host.<part>`` for each:
    ``host.compiler``, ``host.compiler_version`` (in words its version line), ``host.cpu_flags``
    (in words their count and the vector ones: ``avx2``, ``avx512f``, ...), ``host.machine``,
    ``host.torch``, ``host.python``. Hashes: SHA-256 of each part's text (torch hashes the
    library's command line, which says ``-march=native`` and no version)."""
    out = [Factor("host", host_key[:HASH_CHARS], f"#{host_key[:12]}")]
    for name, text in sorted((parts or {}).items()):
        text = str(text)
        value = (_compiler_words(text) if name == "compiler_version" else
                 _flags_words(text) if name == "cpu_flags" else _short(text))
        out.append(Factor(f"host.{name}"[:NAME_CHARS], _digest(text), value))
    return out


def cpp_library_factors(key: str, host_key: str, parts: Mapping[str, str] | None) -> list[Factor]:
    """The factors of a C++ kernel library lookup: ``source`` (torch's key of the library,
    ``CppCodeCache.load_async``'s ``code_hash`` of its source and compiler command line,
    torch/_inductor/codecache.py; or an ISA probe's, ``VecISA.check_build``) and the host's
    (:func:`cpp_host_factors`)."""
    return [Factor("source", _digest(key), _short(key)), *cpp_host_factors(host_key, parts)]


# -- precompiled Dynamo packages -------------------------------------------------------------

#: The ``entry_factors`` kind of a package system's factors (keyed by its system tag,
#: :func:`cachedb.keys.package_system_tag`): what a stored package's system was.
PACKAGE_SYSTEM = "precompile_system"


def package_system_factors(tag: str, system_info: Mapping[str, object] | None) -> list[Factor]:
    """The factors of the system a precompiled Dynamo package is stored for: ``system`` (its
    tag) and, where ``system_info`` (``dataclasses.asdict(SystemInfo.current())``,
    torch/_dynamo/package.py: what the tag hashes and what torch's
    ``SystemInfo.check_compatibility`` compares when it loads a package) is known,
    ``system.<field>`` for each: ``python_version``, ``torch_version``, ``toolkit_version``,
    ``triton_version``, ``gpu_name``. Hashes: SHA-256 of each field's ``repr``."""
    out = [Factor("system", tag[:HASH_CHARS], f"#{tag}")]
    for name, value in sorted((system_info or {}).items()):
        out.append(Factor(f"system.{name}"[:NAME_CHARS], _digest(repr(value)), _short(str(value))))
    return out


def package_factors(source_id: str, tag: str, system_info: Mapping[str, object] | None) -> list[Factor]:
    """The factors of a precompiled package lookup (``DiskDynamoCache.load``,
    torch/_dynamo/package.py): ``source_id`` (``CompilePackage.source_id_from_fn``: the
    SHA-256 of the function's qualified name and first line) and its system's
    (:func:`package_system_factors`)."""
    return [Factor("source_id", _digest(source_id), _short(source_id)), *package_system_factors(tag, system_info)]


# -- best configs ----------------------------------------------------------------------------

#: The miss log's and ``entry_factors``' kind of a best config (``.best_config`` files).
BEST_CONFIG = "best_config"


def best_config_factors(kernel: str, cache_key_tag: str, torch_key_hex: str,
                        configs_hash: str | None = None) -> list[Factor]:
    """The factors of a best config lookup (``AutotuneCache.read_best``,
    torch/_inductor/runtime/autotune_cache.py, torch 2.9 to 2.15). Its key hashes ``kernel``
    (``os.path.basename`` of the kernel's file: the hash of its source,
    ``AutotuneCache._prepare_key``), ``cache_key_tag`` (``torch.compiler.config``) and
    ``torch_key`` (``_make_local_cache_key``: torch's key, hex); a stored config is used only
    for the same ``configs_hash`` (the hash of the kernel's candidate configs,
    ``_load_cached_autotuning``), given where known. Hashes: SHA-256 of each value."""
    out = [Factor("kernel", _digest(kernel), _short(kernel)),
           Factor("cache_key_tag", _digest(cache_key_tag), _short(cache_key_tag) or "(none)"),
           Factor("torch_key", torch_key_hex[:HASH_CHARS], f"#{torch_key_hex[:12]}")]
    if configs_hash is not None:
        out.append(configs_hash_factor(configs_hash))
    return out


def configs_hash_factor(configs_hash: str) -> Factor:
    """The factor ``configs_hash`` of a best config: the hash of its kernel's candidate configs
    (``AutotuneCache.configs_hash``), as stored in the best config itself."""
    return Factor("configs_hash", _digest(configs_hash), _short(configs_hash))
