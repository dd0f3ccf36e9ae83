"""``rlocks.RWLock``: a readers-writer lock across threads, processes and hosts.

One Redis hash holds both sides (``_engine/lua/rw_lib.lua``), each hold with its own lease.
Each side is an engine primitive of its own (:class:`LockSpec` of side ``r`` or ``w``)
with the ``threading.RLock`` surface. Readers and writers wait in one queue on the
server, in arrival order, so neither side starves.

:class:`RWPair` is shared with ``rlocks.asyncio.RWLock``, whose sides put the asyncio
surface on the same specs.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Generic, Optional, Type, TypeVar

from ._engine import checks
from ._engine.constructors import public_init
from ._engine.primitive import ENTRY_LEASE, LockSpec, Options, Primitive
from ._engine.scripts import Call, load
from ._engine.state import PrimitiveState, statistics
from ._engine.steps import Run, drive
from ._engine.surface import LockSurface
from .errors import UpgradeError

__all__ = ["RWLock", "ReadLock", "WriteLock", "UpgradeError"]

READ, WRITE = LockSpec("rw", "r"), LockSpec("rw", "w")
_LOCKED = load("rw_locked")


class Side(Primitive):
    """What both sides share, either surface: the other side, and the upgrade check."""

    __slots__ = ("_other",)

    _other: "Side"  # the other side of the same RWLock
    _label = "rlocks.RWLock"

    def _describe(self) -> str:
        side = "read" if self._spec.side == "r" else "write"
        return f"RWLock {self._shown} ({side})"

    def _check_upgrade(self, owner: str) -> None:
        """A thread that reads (and does not write) may not ask for the write side: two
        doing so would wait for each other for ever. Refused here, without I/O."""
        if self._spec.side == "w" and self._hold(owner).count == 0 \
                and self._other._hold(owner).count > 0:
            raise UpgradeError(
                f"{self._label}({self._shown}): this thread holds the read side and asks "
                "for the write side: an upgrade would deadlock with another reader doing "
                "the same; release the read side first", name=self._name)


class ReadLock(Side, LockSurface):
    """The read side of an :class:`RWLock` (``rwlock.read_lock``).

    Any number of threads, in any processes, may hold it at once, unless a thread holds
    the write side. Waiters are served in arrival order (a reader that arrives after a
    waiting writer waits for that writer); a thread already reading may still re-enter,
    and the write holder itself may take the read side, which is how a writer downgrades.
    """

    __slots__ = ()

    def locked(self) -> bool:
        """Whether anyone, anywhere, holds the read side now (one round trip)."""
        return bool(drive(_count(self)) > 0)

    def statistics(self) -> PrimitiveState:
        """The whole RWLock's state (both sides), as :meth:`RWLock.statistics`."""
        return statistics(self)


class WriteLock(Side, LockSurface):
    """The write side of an :class:`RWLock` (``rwlock.write_lock``).

    One thread at a time holds it, and only while nobody (else) holds the read side.
    While a thread waits for it, readers that arrive later wait behind it (one queue, in
    arrival order); a writer process that dies while waiting stops holding them back at
    most its queue entry's lease (2 s) later.

    ``threading.Condition(rw.write_lock).wait()`` by a writer that also reads (it
    downgraded) releases both sides while it waits and takes both back.
    """

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        checks.lock_wait(blocking, timeout, self._label, self._name)  # bad input first
        self._check_upgrade(self._owner())
        return super().acquire(blocking, timeout)

    acquire.__doc__ = LockSurface.acquire.__doc__
    __enter__ = acquire

    def locked(self) -> bool:
        """Whether anyone, anywhere, holds the write side now (one round trip)."""
        return bool(drive(_count(self)) > 0)

    def statistics(self) -> PrimitiveState:
        """The whole RWLock's state (both sides), as :meth:`RWLock.statistics`."""
        return statistics(self)

    def _held_with(self) -> Any:
        return self._other


def _count(side: Side) -> Any:
    """How many owners hold ``side`` now (a dialogue: one read-only script)."""
    k = side._keys
    reply = yield Run(side._backend, Call(_LOCKED, (k.hash, k.queue, k.leases),
                                          (side._spec.side,)))
    return reply.a


R = TypeVar("R", bound=Side)
W = TypeVar("W", bound=Side)


class RWPair(Generic[R, W]):
    """Both sides of one readers-writer lock, built together (sync or asyncio sides)."""

    __slots__ = ("_read", "_write", "__weakref__")

    _read_type: Type[R]
    _write_type: Type[W]
    _label: ClassVar[str] = "rlocks.RWLock"

    @public_init
    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
        replicas: int = 0,
        replica_wait: float = 1.0,
        fair: bool = True,
        deadlock_timeout: Optional[float] = 1.0,
        entry_lease: float = ENTRY_LEASE,
    ) -> None:
        options = Options.of(locals())
        read: R = self._read_type.__new__(self._read_type)
        read._configure(name, options, "rw", READ)
        write: W = self._write_type.__new__(self._write_type)
        write._configure(name, options, "rw", WRITE)
        write._client, write._backend = read._client, read._backend
        read._other, write._other = write, read
        self._read, self._write = read, write

    @property
    def read_lock(self) -> R:
        """The shared side."""
        return self._read

    @property
    def write_lock(self) -> W:
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

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cannot pickle or copy {self._label}({self.name!r}): it stands for "
                        "this process's holds")

    def __repr__(self) -> str:
        return (f"<{self._label} name={self.name!r} namespace={self.namespace!r} "
                f"readers here={len(self._read._mine)} writers here={len(self._write._mine)} "
                f"at {id(self):#x}>")


class RWLock(RWPair[ReadLock, WriteLock]):
    """A readers-writer lock shared by every process that uses the same name and Redis.

    ``RWLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None, replicas=0, replica_wait=1.0, fair=True,
    deadlock_timeout=1.0, entry_lease=2.0)``

    ``rwlock.read_lock`` and ``rwlock.write_lock`` each behave like a
    ``threading.RLock`` (``acquire``, ``release``, ``with``, ``locked``, ``_is_owned``,
    ``_recursion_count``, and the ``Condition`` protocol) with these rules between them:

    - any number of threads, here or in other processes, may hold the read side at once;
    - the write side excludes every other thread, on both sides;
    - each side is reentrant for the thread that holds it;
    - first come, first served (``fair=True``, the default): readers and writers wait in
      one queue on the server; a release hands the lock to the next writer, or to every
      reader queued before the next writer, so neither a stream of readers nor a stream
      of writers starves the other (a thread already reading may re-enter at once).
      ``fair=False`` lets a free lock go to whoever asks first, barging past the queue,
      for up to 100 ms after a release woke the waiters it can serve;
    - downgrade is allowed: the write holder may take the read side, then release the
      write side and keep reading;
    - upgrade is refused: a thread holding only the read side that asks for the write
      side gets :class:`UpgradeError` (a RuntimeError) at once instead of a deadlock.

    ``client``, ``ttl``, ``auto_renew``, ``namespace``, ``on_lost``, ``replicas``,
    ``replica_wait``, ``fair``, ``deadlock_timeout`` and ``entry_lease`` mean what they
    mean for
    :class:`rlocks.RLock`; every hold (each reader, the writer) has its own lease, so one
    dead reader stops counting ``ttl`` after it died while others read on. ``on_lost`` is
    called with the side (``read_lock`` / ``write_lock``) that was lost.

    With ``client=rlocks.Quorum(...)`` waiters re-try instead of queueing on the server,
    so the first-come-first-served rule above does not hold: a steady stream of readers
    can keep a writer out.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _read_type = ReadLock
    _write_type = WriteLock

    def statistics(self) -> PrimitiveState:
        """Readers, the writer and the waiters, from Redis (a frozen dataclass, the same
        the ``rlocks`` command line prints). Redis errors propagate."""
        return statistics(self._read)
