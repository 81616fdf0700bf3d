"""Read ``guards_expr`` and the compile time of a pickled Inductor cache entry without executing it.

FX graph entries are pickles of ``torch._inductor.output_code.CompiledFxGraph``; AOTAutograd
entries are pickles of ``AOTAutogradResult`` / ``BundledAOTAutogradResult``
(``torch/_functorch/_aot_autograd/autograd_cache.py``). Both are dataclasses pickled with the
default ``__reduce_ex__``: ``NEWOBJ`` (or ``REDUCE``) creates the object, a state dict is
built with ``EMPTY_DICT`` + ``SETITEM(S)``, and ``BUILD`` applies it.

This module never unpickles. It walks the opcode stream (the frequent binary opcodes decoded
inline, every other one with :mod:`pickletools`' own argument readers, as
:func:`pickletools.genops` would) and
simulates the unpickler's stack, memo and mark stack with inert stand-ins: constants (str,
int, None, ...) keep their values, dicts keep their items, every created object is an
:class:`_Obj` that records the global it was made from and the state given to it by
``BUILD``. Only the state of the TOP-LEVEL object (the one ``STOP`` returns) is read, so the
``guards_expr``/time fields of nested objects (e.g. the forward/backward graphs inside an
AOTAutograd entry) are never mistaken for the entry's own.

Fields read (from the top-level state):

* ``guards_expr``: a ``str`` or ``None`` (``guards_known`` says it was read);
* FX entries: ``_time_taken_ns``;
* AOT entries: ``forward_time_taken_ns + backward_time_taken_ns``.

Truncated or malformed pickles raise :class:`~cachedb._errors.PickleScanError`. A well-formed
pickle that is not an entry gives an :class:`EntryFields` whose ``reason`` says what is missing.
"""

from __future__ import annotations

import io
import pickletools
import struct
from dataclasses import dataclass
from typing import Any

from .._errors import PickleScanError

__all__ = ["EntryFields", "fields_from_state", "read_entry_fields"]

#: The highest pickle protocol the scanner knows (that of Python 3.8+).
_HIGHEST_PROTOCOL = 5

#: pickletools' opcode table, by opcode character.
_CODE2OP = pickletools.code2op

#: Phrases of pickletools' errors that mean "the data ended too early".
_TRUNCATION_HINTS = ("exhausted before seeing STOP", "not enough data", "but only")


@dataclass(frozen=True)
class EntryFields:
    """What could be read from a pickled FX graph or AOTAutograd entry."""

    guards_expr: str | None
    #: ``guards_expr`` was read: ``None`` then truly means "no guards" (an unconditional hit).
    guards_known: bool
    time_taken_ns: int | None
    #: Why a field could not be read (``None`` when everything was read).
    reason: str | None


# --------------------------------------------------------------------------- inert stand-ins


class _Global:
    """A class or function reference (GLOBAL / STACK_GLOBAL / EXT*); never imported."""

    __slots__ = ("module", "name")

    def __init__(self, module: object, name: object) -> None:
        self.module = module
        self.name = name

    def qualname(self) -> str:
        if isinstance(self.module, str) and isinstance(self.name, str):
            return f"{self.module}.{self.name}"
        return "<unknown global>"


class _Obj:
    """An object the real unpickler would create (REDUCE, NEWOBJ, OBJ, INST, ...)."""

    __slots__ = ("factory", "state", "built")

    def __init__(self, factory: object) -> None:
        self.factory = factory
        self.state: dict[Any, Any] = {}
        self.built = False

    def describe(self) -> str:
        if isinstance(self.factory, _Global):
            return self.factory.qualname()
        return "<object>"


class _Dict:
    """A dict under construction; only its str-keyed items are kept."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: dict[Any, Any] = {}

    def set(self, key: object, value: object) -> None:
        # Only str keys can name the fields we read. Other keys are never hashed: a hostile
        # pickle can build tuples whose hash takes exponential time (x = (x, x), repeated).
        if type(key) is str:
            self.items[key] = value


class _Opaque:
    """Anything whose content is irrelevant here (lists, sets, buffers, persistent ids)."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind


# --------------------------------------------------------------------------- the walk


def _fail(where: str, reason: str, pos: int) -> PickleScanError:
    """A malformed pickle: ``reason``, at byte ``pos``."""
    return PickleScanError(where, f"{reason} (at byte {pos})")


def _truncated(where: str, what: str, pos: int) -> PickleScanError:
    """A pickle that ends inside the argument of the opcode at byte ``pos``."""
    return PickleScanError(where, f"truncated pickle: not enough data to read {what} (at byte {pos})")


#: Opcodes decoded inline that read argument bytes after the opcode, and what they read
#: (for the error a truncated pickle raises).
_INLINE_ARGS = {
    0x8C: "SHORT_BINUNICODE's length", 0x4B: "an integer", 0x71: "a 1-byte memo index",
    0x68: "a 1-byte memo index", 0x43: "a bytes length", 0x80: "the protocol",
}


def _scan_top_level(data: bytes, where: str) -> object:
    """Simulate the unpickler over ``data`` and return the stand-in of the top-level value.

    Hot loop (~0.3 us per opcode): the frequent opcodes are decoded inline, most frequent
    first (MEMOIZE and SHORT_BINUNICODE are ~90 % of a real entry's opcodes), with no bounds
    check where Python's own ``IndexError`` says the same thing (the handler at the end turns
    it into the :class:`PickleScanError` the check would have raised).
    """
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: dict[int, Any] = {}
    pos = 0
    code = -1
    n = len(data)
    stream: io.BytesIO | None = None
    unpack_from = struct.unpack_from
    try:
        while True:
            code = data[pos]  # IndexError: the data ended before STOP
            if code == 0x94:  # MEMOIZE
                memo[len(memo)] = stack[-1]  # IndexError: stack underflow
                pos += 1
                continue
            if code == 0x8C:  # SHORT_BINUNICODE
                end = pos + 2 + data[pos + 1]  # IndexError: truncated length
                if end > n:
                    raise _truncated(where, "SHORT_BINUNICODE's string", pos)
                text = data[pos + 2:end].decode("utf-8", "surrogatepass")
                stack.append(text)
                if end < n and data[end] == 0x94:  # MEMOIZE follows almost every string
                    memo[len(memo)] = text
                    end += 1
                pos = end
                continue
            if code == 0x4B:  # BININT1
                stack.append(data[pos + 1])
                pos += 2
                continue
            if code == 0x68:  # BINGET (1-byte memo index)
                try:
                    stack.append(memo[data[pos + 1]])
                except KeyError:
                    raise _fail(where, f"memo key {data[pos + 1]!r} was never stored", pos + 1) from None
                pos += 2
                continue
            if code == 0x6A:  # LONG_BINGET (4-byte memo index)
                if pos + 5 > n:
                    raise _truncated(where, "a 4-byte memo index", pos)
                index = unpack_from("<I", data, pos + 1)[0]
                try:
                    stack.append(memo[index])
                except KeyError:
                    raise _fail(where, f"memo key {index!r} was never stored", pos + 5) from None
                pos += 5
                continue
            if code == 0x71:  # BINPUT (1-byte memo index)
                memo[data[pos + 1]] = stack[-1]
                pos += 2
                continue
            if code == 0x4E:  # NONE
                stack.append(None)
                pos += 1
                continue
            if code == 0x88 or code == 0x89:  # NEWTRUE, NEWFALSE
                stack.append(code == 0x88)
                pos += 1
                continue
            if code == 0x5D:  # EMPTY_LIST
                stack.append(_Opaque("EMPTY_LIST"))
                pos += 1
                continue
            if code == 0x7D:  # EMPTY_DICT
                stack.append(_Dict())
                pos += 1
                continue
            if code == 0x28:  # MARK
                metastack.append(stack)
                stack = []
                pos += 1
                continue
            if code == 0x85 or code == 0x86 or code == 0x87:  # TUPLE1, TUPLE2, TUPLE3
                k = code - 0x84
                if len(stack) < k:
                    raise _fail(where, "stack underflow", pos + 1)
                items = stack[-k:]
                del stack[-k:]
                stack.append(tuple(items))
                pos += 1
                continue
            if code == 0x29:  # EMPTY_TUPLE
                stack.append(())
                pos += 1
                continue
            if code == 0x93:  # STACK_GLOBAL
                qual = stack.pop()
                stack.append(_Global(stack.pop(), qual))
                pos += 1
                continue
            if code == 0x81 or code == 0x52:  # NEWOBJ, REDUCE
                stack.pop()  # args
                stack.append(_Obj(stack.pop()))
                pos += 1
                continue
            if code == 0x75 or code == 0x73:  # SETITEMS, SETITEM
                if code == 0x75:
                    if not metastack:
                        raise _fail(where, "no MARK on the stack", pos + 1)
                    items = stack
                    stack = metastack.pop()
                    if len(items) % 2:
                        raise _fail(where, "SETITEMS with an odd number of items", pos + 1)
                else:
                    value = stack.pop()
                    items = [stack.pop(), value]
                target = stack[-1]
                if type(target) is _Dict:
                    for i in range(0, len(items), 2):
                        target.set(items[i], items[i + 1])
                pos += 1
                continue
            if code == 0x61:  # APPEND
                stack.pop()
                stack[-1]
                pos += 1
                continue
            if code == 0x65:  # APPENDS
                if not metastack:
                    raise _fail(where, "no MARK on the stack", pos + 1)
                stack = metastack.pop()
                stack[-1]
                pos += 1
                continue
            if code == 0x62:  # BUILD
                state = stack.pop()
                inst = stack[-1]
                if type(inst) is _Obj:
                    _apply_state(inst, state)
                pos += 1
                continue
            if code == 0x58:  # BINUNICODE
                if pos + 5 > n:
                    raise _truncated(where, "BINUNICODE's length", pos)
                end = pos + 5 + unpack_from("<I", data, pos + 1)[0]
                if end > n:
                    raise _truncated(where, "BINUNICODE's string", pos)
                stack.append(data[pos + 5:end].decode("utf-8", "surrogatepass"))
                pos = end
                continue
            if code == 0x4D or code == 0x4A:  # BININT2, BININT
                size = 2 if code == 0x4D else 4
                if pos + 1 + size > n:
                    raise _truncated(where, "an integer", pos)
                stack.append(unpack_from("<H" if size == 2 else "<i", data, pos + 1)[0])
                pos += 1 + size
                continue
            if code == 0x43 or code == 0x42:  # SHORT_BINBYTES, BINBYTES
                if code == 0x43:
                    start = pos + 2
                    end = start + data[pos + 1]
                else:
                    if pos + 5 > n:
                        raise _truncated(where, "a bytes length", pos)
                    start = pos + 5
                    end = start + unpack_from("<I", data, pos + 1)[0]
                if end > n:
                    raise _truncated(where, "bytes", pos)
                stack.append(data[start:end])
                pos = end
                continue
            if code == 0x47:  # BINFLOAT
                if pos + 9 > n:
                    raise _truncated(where, "BINFLOAT", pos)
                stack.append(unpack_from(">d", data, pos + 1)[0])
                pos += 9
                continue
            if code == 0x95:  # FRAME (8-byte length; frames change nothing here)
                if pos + 9 > n:
                    raise _truncated(where, "FRAME's length", pos)
                pos += 9
                continue
            if code == 0x80:  # PROTO
                proto = data[pos + 1]
                pos += 2
                if proto > _HIGHEST_PROTOCOL:
                    raise _fail(where, f"unsupported pickle protocol {proto!r}", pos)
                continue
            if code == 0x2E:  # STOP
                return stack.pop()

            # ---- every other opcode: pickletools' own argument readers
            if stream is None:
                stream = io.BytesIO(data)
            stack, pos = _other_opcode(data, pos, where, stack, metastack, memo, stream)
    except IndexError:
        raise _index_error(where, pos, code, n) from None
    except UnicodeDecodeError as exc:
        raise PickleScanError(where, f"malformed pickle: {exc} (at byte {pos})") from None


def _index_error(where: str, pos: int, code: int, n: int) -> PickleScanError:
    """The error for an ``IndexError`` in the hot loop of :func:`_scan_top_level` at the
    opcode at ``pos``: the data ended, an argument is cut off, or the stack ran empty."""
    if pos >= n:
        return _fail(where, "pickle ended before STOP", pos)
    if code in _INLINE_ARGS and pos + 1 >= n:
        return _truncated(where, _INLINE_ARGS[code], pos)
    return _fail(where, "stack underflow", pos + 1)


def _other_opcode(
    data: bytes, pos: int, where: str, stack: list[Any], metastack: list[list[Any]], memo: dict[int, Any],
    stream: io.BytesIO,
) -> tuple[list[Any], int]:
    """Apply the opcode at ``pos`` that the hot loop does not decode, reading its argument
    with pickletools' own reader, as :func:`pickletools.genops` would. Returns the stack
    (another list when the opcode pops a mark) and the position of the next opcode."""

    def fail(reason: str) -> PickleScanError:
        return _fail(where, reason, pos)

    def pop() -> Any:
        if not stack:
            raise fail("stack underflow")
        return stack.pop()

    def pop_mark() -> list[Any]:
        nonlocal stack
        if not metastack:
            raise fail("no MARK on the stack")
        items = stack
        stack = metastack.pop()
        return items

    def top() -> Any:
        if not stack:
            raise fail("stack underflow")
        return stack[-1]

    code = data[pos]
    at = pos + 1
    opcode = _CODE2OP.get(chr(code))
    if opcode is None:
        raise PickleScanError(where, f"malformed pickle: at position {pos}, opcode {bytes([code])!r} unknown")
    arg = None
    if opcode.arg is not None:
        stream.seek(at)
        try:
            arg = opcode.arg.reader(stream)
        except Exception as exc:  # ValueError (truncated / bad text), UnicodeDecodeError, ...
            msg = str(exc) or type(exc).__name__
            what = "truncated" if any(t in msg for t in _TRUNCATION_HINTS) else "malformed"
            raise PickleScanError(where, f"{what} pickle: {msg} (at byte {pos})") from None
        at = stream.tell()
    name = opcode.name
    pos = at  # errors below name the byte after the opcode

    # (the opcodes decoded above never come here)
    # ---- constants (the arg is the value)
    if name in _CONSTANT_OPS:
        if isinstance(arg, bytearray):
            arg = _Opaque("bytearray")
        stack.append(arg)
    # ---- memo
    elif name in ("PUT", "LONG_BINPUT"):
        if not isinstance(arg, int) or arg < 0:
            raise fail(f"bad memo index {arg!r}")
        memo[arg] = top()
    elif name in ("GET", "LONG_BINGET"):
        try:
            stack.append(memo[arg])
        except (KeyError, TypeError):
            raise fail(f"memo key {arg!r} was never stored") from None
    # ---- marks and containers
    elif name == "DICT":
        items = pop_mark()
        if len(items) % 2:
            raise fail("DICT with an odd number of items")
        d = _Dict()
        for i in range(0, len(items), 2):
            d.set(items[i], items[i + 1])
        stack.append(d)
    elif name == "TUPLE":
        items = pop_mark()  # first: pop_mark rebinds `stack`
        stack.append(tuple(items))
    elif name == "EMPTY_SET":
        stack.append(_Opaque(name))
    elif name == "LIST" or name == "FROZENSET":
        pop_mark()
        stack.append(_Opaque(name))
    elif name == "ADDITEMS":
        pop_mark()
        top()
    elif name == "POP":
        if stack:
            stack.pop()
        else:
            pop_mark()
    elif name == "POP_MARK":
        pop_mark()
    elif name == "DUP":
        stack.append(top())
    # ---- globals and objects
    elif name == "GLOBAL" or name == "INST":
        module, _, qual = (arg if isinstance(arg, str) else "").partition(" ")
        g = _Global(module, qual)
        if name == "GLOBAL":
            stack.append(g)
        else:
            pop_mark()
            stack.append(_Obj(g))
    elif name in ("EXT1", "EXT2", "EXT4"):
        stack.append(_Global(None, None))
    elif name == "NEWOBJ_EX":
        pop()  # kwargs
        pop()  # args
        stack.append(_Obj(pop()))
    elif name == "OBJ":
        items = pop_mark()
        if not items:
            raise fail("OBJ without a class")
        stack.append(_Obj(items[0]))
    elif name == "PERSID":
        stack.append(_Opaque("persistent id"))
    elif name == "BINPERSID":
        pop()
        stack.append(_Opaque("persistent id"))
    elif name == "NEXT_BUFFER":
        stack.append(_Opaque("buffer"))
    elif name == "READONLY_BUFFER":
        top()
    # ---- framing
    elif name == "PROTO":
        if not isinstance(arg, int) or arg > _HIGHEST_PROTOCOL:
            raise fail(f"unsupported pickle protocol {arg!r}")
    else:  # an opcode this module does not know: apply its documented stack effect
        before = list(opcode.stack_before)
        if pickletools.markobject in before:
            # The mark and the slice above it go at once; what lies below the mark is
            # popped too (and pushed back as per stack_after, e.g. APPENDS' list).
            pop_mark()
            before = before[: before.index(pickletools.markobject)]
        for _ in before:
            pop()
        for _ in opcode.stack_after:
            stack.append(_Opaque(name))
    return stack, pos


#: Constant opcodes the walk leaves to pickletools (BININT*, BINUNICODE, SHORT_BINUNICODE,
#: (SHORT_)BINBYTES and BINFLOAT are decoded inline).
_CONSTANT_OPS = frozenset(
    {
        "INT", "LONG", "LONG1", "LONG4",
        "STRING", "BINSTRING", "SHORT_BINSTRING",
        "BINBYTES8", "BYTEARRAY8",
        "UNICODE", "BINUNICODE8",
        "FLOAT",
    }
)  # fmt: skip


def _apply_state(inst: _Obj, state: object) -> None:
    """BUILD: ``inst.__dict__.update(state)`` (and slot state), as the unpickler does."""
    inst.built = True
    slotstate: object = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slotstate = state
    for part in (state, slotstate):
        if isinstance(part, _Dict):
            inst.state.update(part.items)


# --------------------------------------------------------------------------- fields


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_entry_fields(data: bytes, *, where: str = "<payload>") -> EntryFields:
    """Read ``guards_expr`` and the compile time of a pickled FX graph / AOTAutograd entry.

    The pickle is never executed. Raises :class:`PickleScanError` when ``data`` is not a
    complete, well-formed pickle; a well-formed pickle that does not hold the expected fields
    gives ``guards_known=False`` / ``time_taken_ns=None`` and a ``reason``.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PickleScanError(where, f"expected bytes, got {type(data).__name__}")
    if not data:
        raise PickleScanError(where, "empty payload")
    result = _scan_top_level(bytes(data), where)

    if not isinstance(result, _Obj):
        kind = "a dict" if isinstance(result, _Dict) else type(result).__name__
        return EntryFields(None, False, None, f"top-level value is {kind}, not a cache entry object")
    if not result.built:
        return EntryFields(
            None, False, None, f"top-level object {result.describe()} carries no state (no BUILD)"
        )
    return fields_from_state(result.state, result.describe())


def fields_from_state(state: dict[Any, Any], described: str) -> EntryFields:
    """The :class:`EntryFields` of a top-level entry object whose ``BUILD`` state (its
    ``__dict__`` and slot state merged) is ``state``; ``described`` names its class
    (``module.qualname``) in the reasons."""
    reasons: list[str] = []

    guards_expr: str | None = None
    guards_known = False
    if "guards_expr" not in state:
        reasons.append(f"top-level object {described} has no guards_expr field")
    else:
        value = state["guards_expr"]
        if value is None or isinstance(value, str):
            guards_expr, guards_known = value, True
        else:
            reasons.append("guards_expr is not a str or None")

    time_taken_ns: int | None = None
    if "forward_time_taken_ns" in state or "backward_time_taken_ns" in state:
        fw = state.get("forward_time_taken_ns")
        bw = state.get("backward_time_taken_ns")
        if _is_int(fw) and _is_int(bw):
            time_taken_ns = fw + bw
        else:
            reasons.append("forward_time_taken_ns/backward_time_taken_ns are not both ints")
    elif "_time_taken_ns" in state:
        value = state["_time_taken_ns"]
        if _is_int(value):
            time_taken_ns = value
        else:
            reasons.append("_time_taken_ns is not an int" if value is not None else "_time_taken_ns is None")
    else:
        reasons.append(f"top-level object {described} has no time-taken field")

    return EntryFields(guards_expr, guards_known, time_taken_ns, "; ".join(reasons) or None)
