"""``rlocks.RWLock``: a readers-writer lock across threads, processes and hosts.

One Redis hash per lock holds both sides (layout in ``_engine/lua/rw_lib.lua``); every
change is one Lua script. Each side is an engine :class:`~rlocks._engine.primitive.Primitive`
of its own (local holds, leases, lost-hold reporting), owned by the calling thread, with
the ``threading.RLock`` surface. The two sides wait on two wake-up channels, so "the last
reader left" wakes a writer and never a reader that would only find the writer's claim.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Callable, Optional, Sequence, Tuple, Type

from ._engine import checks, identity
from ._engine.keys import PrimitiveKeys
from ._engine.primitive import Primitive
from ._engine.scripts import Arg, Script, load, run
from .errors import LockLostError, NotOwnedError, RLocksError

__all__ = ["RWLock", "ReadLock", "WriteLock", "UpgradeError"]


class UpgradeError(RLocksError, RuntimeError):
    """A thread that holds the read side asked for the write side.

    Refused at once, without any I/O: two readers upgrading at the same time would each
    wait for the other forever. Release the read side first (or take the write side first
    and downgrade, which is allowed).
    """


def _with_lib(lib: str, name: str) -> Script:
    # The rw_* and sem_* files share helpers (state loading, lease purging, key expiry);
    # the library is prepended so each operation is still one script, one round trip.
    return Script(name, load(lib).source + "\n" + load(name).source)


# Set by WriteLock._take for the one call to _acquire_arguments it makes on this thread:
# a single try must not leave a claim behind, a waiting call must stake one.
_claiming = threading.local()


class _Side(Primitive):
    """One side of an RWLock: the ``threading.RLock`` surface on a shared hash."""

    __slots__ = ("_side",)

    _kind = "rw"
    _label = "rlocks.RWLock"
    _release_script = _with_lib("rw_lib", "rw_release")
    _renew_script = _with_lib("rw_lib", "rw_renew")
    _holders_script = _with_lib("rw_lib", "rw_holders")
    _side_code = ""  # 'r' or 'w', the field prefix in the hash

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self._side = self._side_code
        # Both sides share the hash; each waits on its own wake-up channel (same hash tag).
        hash_key = self._keys.hash
        channel = _read_channel(hash_key) if self._side == "r" else _write_channel(hash_key)
        self._keys = PrimitiveKeys(hash=hash_key, channel=channel)

    def _describe(self) -> str:
        kind = "read_lock" if self._side == "r" else "write_lock"
        return f"{self._label}({self._name!r}).{kind}"

    # -- script arguments (see the headers of the rw_*.lua files) ------------------------

    def _release_arguments(
        self, owner: str, count: int, everything: bool
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        keys = (self._keys.hash, _read_channel(self._keys.hash), _write_channel(self._keys.hash))
        return keys, (owner, self._side, count, 1 if everything else 0, self._publish)

    def _renew_arguments(self, owner: str) -> Tuple[Sequence[str], Sequence[Arg]]:
        return (self._keys.hash,), (owner, self._side, self._ttl_ms)

    # -- the threading.RLock surface -----------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire this side, or re-enter it if the calling thread holds it already.

        Blocks while the lock is unavailable (see :class:`RWLock`) when ``blocking`` is
        true, for at most ``timeout`` seconds unless it is -1 (forever). Returns True once
        held, False if it could not be had in time.

        Raises, before touching Redis: what ``threading.RLock.acquire`` raises for bad
        arguments; LockLostError if this thread's earlier hold of this side was lost and
        not yet released; :class:`UpgradeError` (a RuntimeError) when the write side is
        asked for by a thread that holds only the read side. Redis errors propagate.

        In Redis: adds one to this thread's count on this side and restarts its lease.
        """
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return self._take(identity.thread_owner(), 1, wait)

    def release(self) -> None:
        """Release one level of the calling thread's hold on this side.

        Raises RuntimeError (:class:`~rlocks.errors.NotOwnedError`) if the calling thread
        does not hold this side, without any I/O; LockLostError if its hold had already
        ended in Redis. Releasing the write side wakes every waiter; releasing the last
        read hold of the lock wakes one waiting writer (per process).
        """
        self._give_back(identity.thread_owner(), 1)

    __enter__ = acquire

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if isinstance(exc, LockLostError) and getattr(exc, "lock", None) is self:
            # An inner block already reported this side lost: unwind our level quietly.
            self._record_release(identity.thread_owner(), 1)
            return
        self.release()

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds this side now (one round trip)."""
        reply = run(self._client, self._holders_script, (self._keys.hash,), (self._side,))
        return reply.count > 0

    # -- threading.Condition protocol (same names and contracts as threading.RLock) ------

    def _is_owned(self) -> bool:
        """Whether the calling thread holds this side (local knowledge, no I/O)."""
        return self._held(identity.thread_owner()) > 0

    def _recursion_count(self) -> int:
        """How many times the calling thread holds this side (no I/O)."""
        return self._held(identity.thread_owner())

    def _release_save(self) -> Tuple[int, str]:
        """Release every level of the calling thread's hold; return what restores it."""
        owner = identity.thread_owner()
        count = self._held(owner)
        if count == 0:
            raise NotOwnedError(
                f"cannot release un-acquired lock {self._describe()}", name=self._name
            )
        self._give_back(owner, count, everything=True)
        return count, owner

    def _acquire_restore(self, state: Tuple[int, str]) -> None:
        """Re-acquire, blocking, the levels ``_release_save`` gave back."""
        count, _owner = state
        self._take(identity.thread_owner(), count, None)

    # -- introspection -------------------------------------------------------------------

    def __repr__(self) -> str:
        # Local truth only: no I/O in a repr.
        owners = self._local_owners()
        state = f"held here by {len(owners)} thread(s)" if owners else "not held here"
        kind = "read_lock" if self._side == "r" else "write_lock"
        return (
            f"<{self._label}.{kind} name={self._name!r} namespace={self._namespace!r} "
            f"{state} at {id(self):#x}>"
        )


class ReadLock(_Side):
    """The read side of an :class:`RWLock` (``rwlock.read_lock``).

    Any number of threads, in any processes, may hold it at once, unless a thread holds
    the write side or a writer is waiting (writer preference: new readers then wait; a
    thread already reading may still re-enter, and the write holder itself may take the
    read side, which is how a writer downgrades).
    """

    __slots__ = ()

    _side_code = "r"
    _acquire_script = _with_lib("rw_lib", "rw_acquire_read")

    def _acquire_arguments(self, owner: str, count: int) -> Tuple[Sequence[str], Sequence[Arg]]:
        return (self._keys.hash,), (owner, self._ttl_ms, count)


class WriteLock(_Side):
    """The write side of an :class:`RWLock` (``rwlock.write_lock``).

    One thread at a time holds it, and only while nobody (else) holds the read side.
    While a thread waits for it, new readers wait too; that claim lasts one ``ttl``
    after the waiter's latest attempt, so a writer that dies while waiting stops holding
    readers back at most ``ttl`` later.
    """

    __slots__ = ("_read",)

    _side_code = "w"
    _acquire_script = _with_lib("rw_lib", "rw_acquire_write")
    _unclaim_script = _with_lib("rw_lib", "rw_unclaim")

    def __init__(self, name: str, read: ReadLock, **options: Any) -> None:
        super().__init__(name, **options)
        self._read = read

    def _acquire_arguments(self, owner: str, count: int) -> Tuple[Sequence[str], Sequence[Arg]]:
        claim = 1 if getattr(_claiming, "on", True) else 0
        return (self._keys.hash,), (owner, self._ttl_ms, count, claim)

    def _take(self, owner: str, count: int, wait: Optional[float]) -> bool:
        if self._read._held(owner) > 0 and self._held(owner) == 0:
            raise UpgradeError(
                f"{self._describe()}: this thread holds the read side; upgrading to the "
                "write side is refused (it would deadlock two upgraders). Release the "
                "read side first",
                name=self._name,
            )
        waiting = wait != 0.0
        _claiming.on = waiting
        try:
            granted = super()._take(owner, count, wait)
        except BaseException:
            if waiting:
                self._unclaim(owner, quiet=True)
            raise
        finally:
            _claiming.on = True
        if not granted and waiting:
            self._unclaim(owner, quiet=False)
        return granted

    def _unclaim(self, owner: str, quiet: bool) -> None:
        """Withdraw ``owner``'s claim after it stopped waiting (it ends by itself anyway)."""
        keys = (self._keys.hash, _read_channel(self._keys.hash))
        try:
            run(self._client, self._unclaim_script, keys, (owner, self._publish))
        except Exception:
            if not quiet:
                raise
            # Already unwinding another error; the claim ends with its ttl regardless.


def _read_channel(hash_key: str) -> str:
    return f"{hash_key}:wake"


def _write_channel(hash_key: str) -> str:
    return f"{hash_key}:wake:writers"


class RWLock:
    """A readers-writer lock shared by every process that uses the same name and Redis.

    ``RWLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None)``

    ``rwlock.read_lock`` and ``rwlock.write_lock`` each behave like a
    ``threading.RLock`` (``acquire``, ``release``, ``with``, ``locked``, ``_is_owned``,
    ``_recursion_count``, and the ``Condition`` protocol) with these rules between them:

    - any number of threads, here or in other processes, may hold the read side at once;
    - the write side excludes every other thread, on both sides;
    - each side is reentrant for the thread that holds it;
    - writer preference: once a thread waits for the write side, new readers wait, so a
      stream of readers never starves a writer (a thread already reading may re-enter);
    - downgrade is allowed: the write holder may take the read side, then release the
      write side and keep reading;
    - upgrade is refused: a thread holding only the read side that asks for the write
      side gets :class:`UpgradeError` (a RuntimeError) at once instead of a deadlock.

    ``client``, ``ttl``, ``auto_renew``, ``namespace`` and ``on_lost`` mean what they
    mean for :class:`rlocks.RLock`; every hold (each reader, the writer) has its own
    lease, so one dead reader stops counting ``ttl`` after it died while others read on.
    ``on_lost`` is called with the side (``read_lock`` / ``write_lock``) that was lost.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ("_read", "_write", "__weakref__")

    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
    ) -> None:
        options = dict(
            client=client, ttl=ttl, auto_renew=auto_renew, namespace=namespace, on_lost=on_lost
        )
        read = ReadLock(name, **options)
        # The read side validated everything and picked the client; the write side shares it.
        options["client"] = read.client
        self._read = read
        self._write = WriteLock(name, read, **options)

    @property
    def read_lock(self) -> ReadLock:
        """The shared side."""
        return self._read

    @property
    def write_lock(self) -> WriteLock:
        """The exclusive side."""
        return self._write

    @property
    def name(self) -> str:
        return self._read.name

    @property
    def namespace(self) -> str:
        return self._read.namespace

    @property
    def ttl(self) -> float:
        return self._read.ttl

    @property
    def client(self) -> Any:
        return self._read.client

    def __repr__(self) -> str:
        reading = len(self._read._local_owners())
        writing = len(self._write._local_owners())
        return (
            f"<rlocks.RWLock name={self.name!r} namespace={self.namespace!r} "
            f"readers here={reading} writers here={writing} at {id(self):#x}>"
        )
