"""``guards_expr`` and the compile time of an entry this process's torch just pickled, read
at C speed.

A live write (``FxGraphCache._write_to_local_cache`` / ``AOTAutogradCache._write_to_local_cache``,
torch/_inductor/codecache.py and torch/_functorch/_aot_autograd/autograd_cache.py) hands cachedb
the bytes torch itself produced with ``pickle.dumps`` and will itself ``pickle.loads`` on every
hit. For those bytes the opcode walk of :mod:`cachedb.formats.pickle_scan` (~0.3 us per opcode in
Python: 0.5 ms for a 100 KB entry, 19 ms for 20 MB) is replaced by the C unpickler with every
global it names replaced by an inert stand-in class (:class:`_Inert`): no class or function of
the pickle is imported or called, its objects only record the state ``BUILD`` gives them.

Files read from disk (``cachedb import``) keep the opcode walk, which never builds the pickle's
containers at all. Anything this reader does not take cleanly (a pickle of protocol 0 or 1, an
exception, a top-level value that is not an object with state) goes to the opcode walk too, so
both give the same :class:`~cachedb.formats.pickle_scan.EntryFields` for every input.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from .pickle_scan import EntryFields, fields_from_state, read_entry_fields

__all__ = ["read_own_entry_fields"]


class _Inert:
    """An object of a class the pickle names: created without running anything, it keeps
    the state ``BUILD`` gives it (``__dict__`` and slot state merged, str keys only)."""

    __slots__ = ("state", "built")
    qualname = "<unknown global>"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        self = object.__new__(cls)
        self.state = {}
        self.built = False
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # REDUCE calls the "class"
        pass

    def __setstate__(self, state: Any) -> None:
        self.built = True
        slotstate: Any = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        for part in (state, slotstate):
            if type(part) is dict:
                self.state.update((k, v) for k, v in part.items() if type(k) is str)


#: Stand-in classes by ``(module, name)``, shared by every read (a class costs ~10 us to make;
#: a real entry names dozens of globals). Emptied when it reaches :data:`_MAX_CLASSES`.
_CLASSES: dict[tuple[str, str], type[_Inert]] = {}
_MAX_CLASSES = 4096


class _InertUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` (the C one) whose globals are all :class:`_Inert` subclasses."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))

    def find_class(self, module: str, name: str) -> type[_Inert]:
        found = _CLASSES.get((module, name))
        if found is None:
            # The opcode walk reads a GLOBAL's names as pickletools does (escapes undone, then
            # ASCII); the C unpickler takes them as UTF-8. Names where the two could differ
            # (damaged bytes, never torch's) go to the opcode walk.
            if not (module.isascii() and name.isascii()) or "\\" in module or "\\" in name:
                raise pickle.UnpicklingError("a global name the opcode walk reads otherwise")
            if len(_CLASSES) >= _MAX_CLASSES:
                _CLASSES.clear()
            found = type("Inert", (_Inert,), {"__slots__": (), "qualname": f"{module}.{name}"})
            _CLASSES[(module, name)] = found
        return found

    def persistent_load(self, pid: Any) -> None:
        return None


def read_own_entry_fields(data: bytes, *, where: str = "<payload>") -> EntryFields:
    """:func:`cachedb.formats.pickle_scan.read_entry_fields` of ``data`` (bytes: a pickled FX graph or
    AOTAutograd entry this process's torch produced), read by the C unpickler over inert
    stand-ins; inputs it does not take cleanly are read by the opcode walk instead.

    Raises :class:`~cachedb.PickleScanError` (from the opcode walk) when ``data`` is not a
    complete, well-formed pickle.
    """
    if data[:1] != b"\x80" or data[1:2] < b"\x02":
        # Not protocol 2 or later (torch writes 4 or 5): protocols 0 and 1 name most of their
        # arguments on text lines, which the C unpickler parses more leniently than the walk.
        return read_entry_fields(data, where=where)
    try:
        top = _InertUnpickler(data).load()
    except Exception:
        top = None
    if isinstance(top, _Inert) and top.built:
        return fields_from_state(top.state, type(top).qualname)
    return read_entry_fields(data, where=where)
