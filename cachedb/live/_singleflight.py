"""One compile per graph: a process that misses an entry another process is compiling waits
for it instead of compiling it too.

When the ranks of a machine (processes sharing one local file), or the machines of a fleet
(sharing a remote tier), meet a new graph at once, each misses before any has stored it. Here
the first to miss *claims* the entry's key (torch's own key: only identical work is shared)
and compiles; the others wait for the entry to land, then serve it through torch's own checks,
exactly as a hit. A waiter compiles itself when the holder dies (its claim goes with it), stops
beating (a hung process: its heartbeat is older than :data:`STALE_S`), releases the claim
without storing the entry (a compile that failed, or torch bypassed its cache), or the wait
passes ``CACHEDB_COMPILE_WAIT`` seconds (600).

**On one machine** the claims live in a sidecar beside the local file, ``<database>.compile``
(owner-only, sparse), as the remote lookups' coalescing does (:mod:`cachedb.live._coalesce`):
an entry hashes to one of :data:`SLOTS` slots of :data:`SLOT_BYTES` bytes, which holds the
entry's digest, the holder's heartbeat (seconds since the epoch), pid and host. The claim is
an open-file-description record lock on the slot (Linux ``F_OFD_SETLK``): the kernel releases
it when its holder's descriptor closes, a killed process included. A slot another key's claim
holds (a collision) is no claim of this key: the process compiles at once.

**Across machines** (a remote tier, :mod:`cachedb.live._remote`) the claim is a lease row of
the shared database's ``compile_claims`` (it works through PgBouncer in transaction mode): the
holder's heartbeat renews it every :data:`BEAT_S` seconds, and a lease not renewed for
:data:`STALE_S` seconds is free to take. Only the process holding the machine's local claim
asks for the remote one, so a machine asks once.

A claim is released once the entry is stored (after the write-behind thread committed it,
and after the remote tier sent it: a waiter that wakes finds it), or when the compile it stood
for ends without one (``_compile_fx_inner``, ``aot_module_simplified``: :func:`compile_scope`).
A thread that holds a claim never waits for an AOTAutograd entry (an AOTAutograd compile can
hold one and need another: no two processes wait on each other); an FX graph entry it may wait
for, since an FX graph's holder waits for nothing.

Each wait logs one line (warning) saying what it waits for and on whom, and one line to the
trace log (``CACHEDB_LOG_FILE``) with its seconds and outcome; the waits that saved a compile
are counted in the database (``compile_waits``, ``cachedb stats``).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl

    _SETLK = fcntl.F_OFD_SETLK
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    fcntl = None  # type: ignore[assignment]

from ._coalesce import digest

log = logging.getLogger("cachedb.live")

#: Slots in the sidecar file (a power of two).
SLOTS = 1 << 16
#: Bytes per slot: the entry's 16-byte digest, the holder's heartbeat (float64, seconds since
#: the epoch), its pid (int32), its host (24 bytes, UTF-8, cut).
SLOT_BYTES = 64
_LAYOUT = struct.Struct("<16sdi24s12x")
#: ``struct flock`` of Linux (x86-64, AArch64): type, whence, start, length, pid (0 for OFD).
_FLOCK = struct.Struct("hhqqi4x")
#: Seconds between two heartbeats of a holder.
BEAT_S = 1.0
#: Seconds after its last heartbeat a holder counts as gone (a hung process).
STALE_S = 5.0
#: Seconds between two looks of a waiter at the entry and the claim (on this machine / at the
#: remote tier).
POLL_S = 0.05
REMOTE_POLL_S = 0.25
#: Suffix of the sidecar file.
SUFFIX = ".compile"
#: The host name recorded with a claim.
HOST = socket.gethostname()[:24]


class Outcome(enum.Enum):
    """What :meth:`Flights.on_miss` came to."""

    #: this process holds the claim: it compiles, and the others wait for it
    HOLD = "hold"
    #: the entry landed while this process waited: serve it (torch checks its guards)
    LANDED = "landed"
    #: compile without a claim: none could be had (a collision, no sidecar, a wait that ended
    #: without the entry: the holder died, hung, gave up, or the bound passed)
    ALONE = "alone"


@dataclass
class Claim:
    """A claim this process holds on one entry."""

    kind: str
    key: str
    index: int
    digest: bytes
    fd: int  #: the descriptor holding the slot's lock (closing it releases the claim)
    thread: int  #: the thread that claimed it
    remote: object | None = None  #: the remote tier's lease, if one is held
    #: the entry's put is queued (the write-behind thread releases the claim once it is written)
    put_queued: bool = False


@dataclass
class Remote:
    """The remote tier's side of one miss: ``claim()`` gives ``(lease, None)`` when this process
    took the lease, ``(None, holder)`` when another process holds it, ``(None, None)`` when the
    remote cannot say; ``landed()`` asks the remote for the entry again (True: it is in the
    local file now); ``held()`` tells whether the holder's lease is still live."""

    claim: Callable[[], tuple[object | None, str | None]]
    landed: Callable[[], bool]
    held: Callable[[], bool]


@dataclass
class _Scope:
    claims: list[Claim] = field(default_factory=list)


class Flights:
    """The claims of one local database file (see the module's docstring); fork-safe: a child
    forked while its parent held claims holds none."""

    def __init__(self, path: Path, database: Path, *, wait_s: float) -> None:
        self.path = path
        self.wait_s = wait_s
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        st = os.stat(database)
        self._identity = (st.st_dev, st.st_ino)
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], Claim] = {}
        self._beater: threading.Thread | None = None
        self._scopes = threading.local()
        self._pid = os.getpid()
        #: counts of this process: ``held``, ``waited``, ``landed``, ``alone``, ``took_over``
        self.counts: dict[str, int] = {}

    # -- the sidecar --------------------------------------------------------------------------

    def _slot(self, kind: str, key: str) -> tuple[int, bytes]:
        d = digest((*self._identity, "compile", kind, key))
        return int.from_bytes(d[:4], "little") & (SLOTS - 1), d

    def _read(self, index: int) -> tuple[bytes, float, int, str]:
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.pread(fd, SLOT_BYTES, index * SLOT_BYTES)
        finally:
            os.close(fd)
        if len(raw) < SLOT_BYTES:
            return b"", 0.0, 0, ""
        d, beat, pid, host = _LAYOUT.unpack(raw)
        return d, beat, pid, host.rstrip(b"\0").decode("utf-8", "replace")

    def _write(self, claim: Claim) -> None:
        os.pwrite(claim.fd, _LAYOUT.pack(claim.digest, time.time(), os.getpid(), HOST.encode()[:24]),
                  claim.index * SLOT_BYTES)

    def _try_hold(self, kind: str, key: str) -> Claim | None:
        index, d = self._slot(kind, key)
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.fcntl(fd, _SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, index * SLOT_BYTES, SLOT_BYTES, 0))
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise
        claim = Claim(kind, key, index, d, fd, threading.get_ident())
        self._write(claim)
        return claim

    # -- holding ------------------------------------------------------------------------------

    def _register(self, claim: Claim) -> None:
        with self._lock:
            self._held[(claim.kind, claim.key)] = claim
            if self._beater is None or not self._beater.is_alive():
                self._beater = threading.Thread(target=self._beat, name="cachedb-compile-beat", daemon=True)
                self._beater.start()
        scope = getattr(self._scopes, "stack", None)
        if scope:
            scope[-1].claims.append(claim)
        self.counts["held"] = self.counts.get("held", 0) + 1

    def _beat(self) -> None:
        while True:
            time.sleep(BEAT_S)
            with self._lock:
                held = list(self._held.values())
                if not held:
                    self._beater = None
                    return
            for claim in held:
                try:
                    self._write(claim)
                except OSError:  # released meanwhile
                    pass
                beat = getattr(claim.remote, "beat", None)
                if beat is not None:
                    beat()

    def holds(self, kind: str, key: str) -> bool:
        return (kind, key) in self._held

    def holding_any(self) -> bool:
        """Whether the calling thread holds a claim."""
        me = threading.get_ident()
        return any(c.thread == me for c in list(self._held.values()))

    def release(self, kind: str, key: str) -> None:
        """Release this process's claim on the entry (no-op without one)."""
        with self._lock:
            claim = self._held.pop((kind, key), None)
        if claim is None:
            return
        release = getattr(claim.remote, "release", None)
        if release is not None:
            release()
        try:
            os.close(claim.fd)
        except OSError:
            pass

    def mark_put_queued(self, kind: str, key: str) -> None:
        """The entry's put is queued for the write-behind thread: the claim stays past the end
        of its compile, and the thread releases it once the entry is written."""
        claim = self._held.get((kind, key))
        if claim is not None:
            claim.put_queued = True

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """A compile (``_compile_fx_inner``, ``aot_module_simplified``) on this thread: the claims
        it took and did not store an entry for are released when it ends."""
        stack = getattr(self._scopes, "stack", None)
        if stack is None:
            stack = self._scopes.stack = []
        stack.append(_Scope())
        try:
            yield
        finally:
            ended = stack.pop()
            for claim in ended.claims:
                if not claim.put_queued:
                    self.release(claim.kind, claim.key)

    def after_fork_in_child(self) -> None:
        """A forked child holds none of its parent's claims (its copies of their descriptors
        are closed; the locks stay the parent's)."""
        for claim in list(self._held.values()):
            with contextlib.suppress(OSError):
                os.close(claim.fd)
        self._held = {}
        self._lock = threading.Lock()
        self._beater = None
        self._scopes = threading.local()
        self._pid = os.getpid()

    # -- a miss -------------------------------------------------------------------------------

    def on_miss(self, kind: str, key: str, landed: Callable[[], bool], *,
                remote: Remote | None = None, warm_up: Callable[[], None] | None = None) -> Outcome:
        """A lookup of ``kind``/``key`` missed and torch is about to compile: claim the key, or
        wait for the process holding it (``landed()`` tells whether the entry is stored now).
        ``remote``: the remote tier's lease, asked once the local claim is held; where another
        machine holds it, this process waits for that machine's entry (the other ranks of this
        machine waiting on this process meanwhile). ``warm_up()`` is called as a wait begins
        (it must not block: :mod:`cachedb.live._warm_up`)."""
        if os.getpid() != self._pid:
            self.after_fork_in_child()
        if not getattr(self._scopes, "stack", None):
            return Outcome.ALONE  # not in a compile (a lookup alone): nothing to claim
        if self.holds(kind, key):
            return Outcome.HOLD
        if kind == "aotautograd" and self.holding_any():
            return Outcome.ALONE  # never wait for an AOTAutograd entry while holding a claim
        try:
            claim = self._try_hold(kind, key)
        except OSError as exc:  # a file system without these locks: compile alone
            log.debug("cachedb: no compile claims through %s: %s", self.path, exc)
            return Outcome.ALONE
        if claim is not None:
            if landed():  # stored between the lookup and the claim
                os.close(claim.fd)
                return Outcome.LANDED
            if remote is not None:
                lease, holder = remote.claim()
                if lease is None and holder is not None:  # another machine compiles it
                    # the other ranks of this machine wait on this claim meanwhile
                    if self._wait(kind, key, remote.landed, on=_holder_text(holder), local=False,
                                  alive=remote.held, warm_up=warm_up) is Outcome.LANDED:
                        os.close(claim.fd)
                        return Outcome.LANDED
                claim.remote = lease
            self._register(claim)
            return Outcome.HOLD
        stored, beat, pid, host = self._read(self._slot(kind, key)[0])
        if stored != self._slot(kind, key)[1]:
            return Outcome.ALONE  # the slot is another key's claim
        return self._wait(kind, key, landed, on=f"pid {pid} on {host}", local=True, warm_up=warm_up)

    def _wait(self, kind: str, key: str, landed: Callable[[], bool], *, on: str, local: bool,
              alive: Callable[[], bool] | None = None, warm_up: Callable[[], None] | None = None) -> Outcome:
        what = "FX graph" if kind == "fxgraph" else "AOTAutograd entry"
        log.warning("cachedb: waiting for %s %s, which %s is compiling (up to %g s)", what, key[:16], on,
                    self.wait_s)
        if warm_up is not None:
            try:
                warm_up()
            except Exception as exc:  # noqa: BLE001 - the wait goes on without it
                log.debug("cachedb: warm-up during a wait: %s", exc)
        started = time.monotonic()
        deadline = started + self.wait_s
        index, d = self._slot(kind, key)
        outcome, why = Outcome.ALONE, "the wait bound passed"
        polls = 0
        while time.monotonic() < deadline:
            if landed():
                outcome, why = Outcome.LANDED, "landed"
                break
            polls += 1
            if alive is not None and polls % 4 == 0 and not alive():
                outcome, why = Outcome.ALONE, "its holder's lease went stale or was released"
                self.counts["took_over"] = self.counts.get("took_over", 0) + 1
                break
            if local:
                stored, beat, _, _ = self._read(index)
                if stored == d and beat and time.time() - beat > STALE_S:
                    outcome, why = Outcome.ALONE, f"its holder stopped beating {time.time() - beat:.0f} s ago"
                    self.counts["took_over"] = self.counts.get("took_over", 0) + 1
                    break
                try:
                    claim = self._try_hold(kind, key)
                except OSError:
                    claim = None
                if claim is not None:  # released: stored, or given up (then this one compiles)
                    if landed():
                        os.close(claim.fd)
                        outcome, why = Outcome.LANDED, "landed"
                    else:
                        self._register(claim)
                        outcome, why = Outcome.HOLD, "its holder released it without the entry"
                    break
            time.sleep(POLL_S if local else REMOTE_POLL_S)
        seconds = time.monotonic() - started
        self.counts["waited"] = self.counts.get("waited", 0) + 1
        name = "landed" if outcome is Outcome.LANDED else "alone"
        self.counts[name] = self.counts.get(name, 0) + 1
        log.debug("cachedb: waited %.2f s for %s %s (%s): %s", seconds, kind, key, on, why)
        self.last_wait = (kind, key, seconds, outcome.value, on)
        return outcome


def _holder_text(holder: str) -> str:
    """``pid N on HOST (another machine)`` for a remote lease's holder ``host:pid:random``."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    return f"pid {pid} on {host} (through the remote tier)" if pid else holder


def for_database(path: Path | None, *, wait_s: float) -> Flights | None:
    """The :class:`Flights` of the local database file ``path``; ``None`` where there is no
    file, no ``fcntl``, or the sidecar cannot be created (each process then compiles alone)."""
    if path is None or fcntl is None:
        return None
    try:
        return Flights(Path(str(path) + SUFFIX), Path(path), wait_s=wait_s)
    except OSError as exc:
        log.debug("cachedb: no compile claims beside %s: %s", path, exc)
        return None
