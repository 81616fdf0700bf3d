"""Every ``CACHEDB_*`` environment variable: its form, its default, parsed and checked here.

:data:`VARIABLES` lists them; :func:`read` parses one, :func:`check_environment` all of them at
once (``cachedb.install`` and the activation of a process started under ``cachedb run`` call it
before anything is patched: a bad value there leaves cachedb off in that process, with one line
naming the variable, its value and the form expected, and torch runs as without cachedb).
An empty value counts as unset. The modules that use a variable read it through :func:`read`,
so a value is understood the same way everywhere.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import CacheDBError


class SettingError(CacheDBError, ValueError):
    """A ``CACHEDB_*`` variable holds a value of the wrong form. The message is one line:
    ``CACHEDB_TIMEOUT='10s': expected seconds, a number >= 0 (e.g. 10 or 0.5)``."""

    def __init__(self, name: str, value: str, form: str) -> None:
        self.name, self.value, self.form = name, value, form
        super().__init__(f"{name}={value!r}: expected {form}")


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(text)


def _seconds(minimum: float, *, open_below: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text.strip())
        if not math.isfinite(value) or value < minimum or (open_below and value == minimum):
            raise ValueError(text)
        return value

    return parse


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text.strip())
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(text)
        return value

    return parse


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError(text)
    return text


def _url(text: str) -> str:
    if "://" not in text or not text.split("://", 1)[0]:
        raise ValueError(text)
    return text


@dataclass(frozen=True)
class Variable:
    """One environment variable: ``name``, the ``form`` its value takes (said in an error),
    its ``parse`` function (raises ``ValueError`` for a value of another form), the value it
    stands for while unset or empty (``default``), and what it does (``doc``)."""

    name: str
    form: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


_SECONDS = "seconds, a number >= 0 (e.g. 10 or 0.5)"
_POSITIVE_SECONDS = "seconds, a number > 0 (e.g. 2 or 0.5)"
_FLAG = "1 or 0 (also true/false, yes/no, on/off)"

#: Every variable cachedb reads, by name.
VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("CACHEDB_ENABLE", _FLAG, _flag, False,
             "activate cachedb in this process when torch imports Inductor's cache modules"),
    Variable("CACHEDB_PATH", "a file path", _text, None, "the SQLite database (when CACHEDB_URL is unset)"),
    Variable("CACHEDB_URL", "a database URL such as postgresql+psycopg://host/db or sqlite:///path",
             _url, None, "the database, any SQLAlchemy URL"),
    Variable("CACHEDB_TIMEOUT", _SECONDS, _seconds(0.0), 10.0,
             "seconds a live lookup or write waits on a locked database; past it the database "
             "is left alone for a while and torch's files serve"),
    Variable("CACHEDB_EXIT_FLUSH", _SECONDS, _seconds(0.0), 5.0,
             "seconds a process waits at exit for its queued writes (FX graph and AOTAutograd "
             "entries, a remote tier's copies); what is still queued then is not written"),
    Variable("CACHEDB_FRESH_CACHE", "a directory path", _text, None,
             "set by cachedb inside a torch fresh_cache() block, for the processes started there: "
             "the cache dir in use outside the block; any other cache dir is served from a "
             "database of its own, in that directory"),
    Variable("CACHEDB_COMPILE_WAIT", _SECONDS, _seconds(0.0), 600.0,
             "seconds a process that misses an entry another process is compiling waits for it "
             "before it compiles it too (0: never waits)"),
    Variable("CACHEDB_MISS_LOG", "an integer >= 0", _integer(0), 1000,
             "lookups that missed kept per database, newest first, with what torch hashed into "
             "their keys (cachedb misses; 0: none recorded)"),
    Variable("CACHEDB_LOG_FILE", "a file path", _text, None, "a file every live process appends its lookup trace to"),
    Variable("CACHEDB_RETUNE", _FLAG, _flag, False, "keep torch's runtime re-tuning of stored winners"),
    Variable("CACHEDB_WRITE_BEHIND", _FLAG, _flag, True,
             "write FX graph and AOTAutograd entries on a background thread"),
    Variable("CACHEDB_TRUST", _FLAG, _flag, False,
             "load pickles and kernels from a database another user owns or others may write"),
    Variable("CACHEDB_REMOTE_URL", "a database URL such as postgresql+psycopg://host/db", _url, None,
             "the shared remote tier behind the local database"),
    Variable("CACHEDB_REMOTE_TIMEOUT", _POSITIVE_SECONDS, _seconds(0.0, open_below=True), 2.0,
             "seconds one remote lookup, connect or statement may take"),
    Variable("CACHEDB_REMOTE_IDLE", _SECONDS, _seconds(0.0), 1.0,
             "seconds a remote connection stays open after its last statement"),
    Variable("CACHEDB_REMOTE_TRUST", _FLAG, _flag, False, "take the remote's unsigned rows (the risk accepted)"),
    Variable("CACHEDB_TRUSTED_KEYS", "Ed25519 public keys (base64 or PEM), or files holding them", _text, None,
             "the writers whose signed remote rows are taken"),
    Variable("CACHEDB_SIGNING_KEY", "an Ed25519 private key (base64 of 32 bytes or PEM)", _text, None,
             "this writer's key: rows sent to a remote are signed with it"),
    Variable("CACHEDB_HMAC_KEY", "a secret (any non-empty text)", _text, None,
             "HMAC key: every row written is signed, every row read verified"),
    Variable("CACHEDB_COMPRESSION_LEVEL", "a zstd level, an integer from -131072 to 22 (0: the default level)",
             _integer(-(1 << 17), 22), None, "the zstd level of payloads"),
    Variable("CACHEDB_IMPORT_WORKERS", "an integer >= 0", _integer(0), None,
             "worker processes of an import (0: in-process)"),
)}


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of variable ``name`` (one of :data:`VARIABLES`) in ``environ`` (default
    ``os.environ``), parsed; its default when unset or empty.

    Raises:
        SettingError: the value is not of the variable's form.
        KeyError: ``name`` is not one of cachedb's variables.
    """
    variable = VARIABLES[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return variable.default
    try:
        return variable.parse(raw)
    except (ValueError, OverflowError):
        raise SettingError(name, raw, variable.form) from None


def value_or_default(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """:func:`read`, but the default for a value of the wrong form: for the readers past
    ``cachedb.install``, which already refused such a value with its message (and for the
    command line, where the variable is only a default)."""
    try:
        return read(name, environ)
    except SettingError:
        return VARIABLES[name].default


def check_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every variable of :data:`VARIABLES` parsed from ``environ`` (default ``os.environ``):
    ``{name: value}``. Raises :class:`SettingError` for the first (by name) whose value is
    not of its form."""
    return {name: read(name, environ) for name in sorted(VARIABLES)}


__all__ = ["SettingError", "VARIABLES", "Variable", "check_environment", "read", "value_or_default"]
