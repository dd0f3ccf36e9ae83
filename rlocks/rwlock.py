"""``rlocks.RWLock``: a readers-writer lock across threads, processes and hosts.

One Redis hash per lock holds both sides (layout in ``_engine/lua/queue_lib.lua``); every
change is one Lua script. Each side is an engine primitive of its own (local holds,
leases, lost-hold reporting) with the ``threading.RLock`` surface. Readers and writers
wait in one queue on the server, in arrival order: a release hands the lock to the next
writer, or to every reader queued before the next writer, so neither side starves.

The I/O-free definitions (``_ReadCore``, ``_WriteCore``) are shared with
``rlocks.asyncio.RWLock``, whose sides put the asyncio surface on the same cores.
"""

from __future__ import annotations

from dataclasses import replace
from typing import (
    Any,
    Callable,
    ClassVar,
    Generic,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
)

from redis.exceptions import NoScriptError

from ._engine.clients import io_client
from ._engine.constructors import public_init
from ._engine.primitive import ENTRY_LEASE, Options, Primitive
from ._engine.quorum import Quorum
from ._engine.reentrant import ReentrantLock
from ._engine.scripts import Arg, load_queued
from ._engine.state import PrimitiveState
from .errors import UpgradeError

__all__ = ["RWLock", "ReadLock", "WriteLock", "UpgradeError"]

class _SideCore(Primitive):
    """What both sides share, without I/O: the keys, scripts and their arguments.

    Both sides run the queue-and-hand-over scripts on one hash, one queue and one wake-up
    channel: readers and writers wait in one FIFO (see ``lua/rw_acquire.lua``).
    """

    __slots__ = ("_side",)

    _kind = "rw"
    _label = "rlocks.RWLock"
    _detects_deadlocks = True
    _acquire_script = load_queued("rw_acquire")
    _release_script = load_queued("rw_release")
    _renew_script = load_queued("rw_renew")
    _leave_script = load_queued("rw_leave")
    _side_code = ""  # 'r' or 'w', the field prefix in the hash
    _side_name = ""  # 'read_lock' or 'write_lock'
    _quorum_refusal = None

    def __init__(self, name: str, options: Options) -> None:
        self._configure(name, options)
        self._side = self._side_code

    def _describe(self) -> str:
        return f"{self._label}({self._name!r}).{self._side_name}"

    def _hold_key(self, owner: str) -> Tuple[int, str, str]:
        # Both sides share the hash: an owner's read and write holds are counted apart,
        # as Redis counts them (fields r:<owner> and w:<owner>).
        pool, key, _owner = super()._hold_key(owner)
        return pool, key, f"{self._side}:{owner}"

    def _queues_locally(self, owner: str) -> bool:
        # Either side counts: a writer taking the read side (a downgrade) is granted at
        # once by the script, and queueing it behind local readers that wait for this
        # very writer would deadlock. The books count the sides apart (as Redis does).
        # With fair=False it tries first, as any other barger does.
        pool, key, _field = super()._hold_key(owner)
        return self._fair and all(
            self._held_in_process((pool, key, f"{side}:{owner}")) == 0 for side in "rw"
        )

    def _describe_class(self) -> str:
        return f"{self._label}.{self._side_name}"

    # -- script arguments (see the headers of the rw_*.lua files) ------------------------

    def _other_side_held(self, owner: str) -> bool:
        """Whether ``owner`` holds the other side in this process, through any object of
        the name (no I/O)."""
        pool, key, _field = super()._hold_key(owner)
        other = "w" if self._side == "r" else "r"
        return self._held_in_process((pool, key, f"{other}:{owner}")) > 0

    def _acquire_depends(self, owner: str) -> Tuple[Any, ...]:
        return (self._other_side_held(owner),)

    def _acquire_arguments(
        self, owner: str, count: int, reentry: bool, entry: Optional[str], listen: bool = False
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        # reentry + 2 when the owner holds the other side: only then is an unadopted grant
        # of that side the owner's to keep (a writer taking the read side); otherwise it
        # is a grant to a wait of this thread that has ended, and the script gives it
        # back (lua/rw_acquire.lua).
        flags = (1 if reentry else 0) + (2 if self._other_side_held(owner) else 0)
        args = (owner, self._entry_id(entry), self._side, self._ttl_ms, count, flags,
                self._queue_flag(entry, listen))
        return self._keys.queued(), (*self._context(), *args)

    def _release_arguments(self, owner: str, count: int) -> Tuple[Sequence[str], Sequence[Arg]]:
        return self._keys.queued(), (*self._context(), owner, self._side, count)

    def _leave_arguments(
        self, owner: str, entry: str, ask: Optional[Tuple[str, str, int]] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        args: Tuple[Arg, ...] = (owner, entry, "")
        if ask is not None:
            args = (owner, entry, *ask)
        return self._keys.queued(), (*self._context(), *args)

    def _renew_items(self, owner: str) -> Tuple[str, ...]:
        return (self._side, owner)

    def _adopt_item(self, owner: str) -> Tuple[str, str]:
        # This side's grant only: one of the other side was made to a wait of this thread
        # that has ended, and its marker must stay for the leave (or the lease) that
        # takes it back (lua/queue_lib.lua, op_renew).
        return ("a" + self._side, owner)

    def _deadlock_side(self) -> str:
        return self._side

    def _renew_arguments(
        self, owner: str, lease_ms: Optional[int] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        call = self._items_call(self._renew_items(owner), lease_ms)
        return call.keys, call.args

    def _holders_pipeline(self, client: Any) -> Any:
        """A pipeline, not sent, whose last reply says who holds: a renewal with no item
        (it tidies holds whose lease ended, so the counters are live), then the counters."""
        call = self._items_call(())
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        pipe.hmget(self._keys.hash, "#w", "#nr")
        return pipe

    def _holders_from(self, results: List[Any]) -> int:
        """How many owners hold this side, from ``_holders_pipeline``'s replies."""
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, NoScriptError):
                raise result
        writer, readers = results[-1]
        if self._side == "w":
            return 0 if writer is None else 1
        return int(readers or 0)


class _ReadCore(_SideCore):
    __slots__ = ()

    _side_code = "r"
    _side_name = "read_lock"


class _WriteCore(_SideCore):
    __slots__ = ("_read",)

    _side_code = "w"
    _side_name = "write_lock"
    _excludes = True

    def __init__(self, name: str, read: _ReadCore, options: Options) -> None:
        super().__init__(name, options)
        self._read = read

    def _check_acquire(self, owner: str) -> None:
        super()._check_acquire(owner)
        if self._read._held(owner) > 0 and self._held(owner) == 0:
            raise UpgradeError(
                f"{self._describe()}: this owner holds the read side; upgrading to the "
                "write side is refused (it would deadlock two upgraders). Release the "
                "read side first",
                name=self._name,
            )

    def _refused(self, owner: str, reentry: bool) -> BaseException:
        if reentry:
            return super()._refused(owner, reentry)
        # Reads without writing through another object of this name: still an upgrade.
        return UpgradeError(
            f"{self._describe()}: this owner holds the read side; upgrading to the "
            "write side is refused",
            name=self._name,
        )


class _SyncSide(ReentrantLock, _SideCore):
    __slots__ = ()

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds this side now (one round trip; with a
        Quorum, one to each master at once, and a majority must agree)."""
        if isinstance(self._client, Quorum):
            return self._client.agreed(self._client.map(self._holders_on)) > 0
        return self._holders_on(self._client) > 0

    def _holders_on(self, client: Any) -> int:
        results = self._holders_pipeline(io_client(client)).execute(raise_on_error=False)
        if isinstance(results[0], NoScriptError):
            client.script_load(self._renew_script.source)
            results = self._holders_pipeline(io_client(client)).execute(raise_on_error=False)
        return self._holders_from(results)


class ReadLock(_SyncSide, _ReadCore):
    """The read side of an :class:`RWLock` (``rwlock.read_lock``).

    Any number of threads, in any processes, may hold it at once, unless a thread holds
    the write side. Waiters are served in arrival order (a reader that arrives after a
    waiting writer waits for that writer); a thread already reading may still re-enter,
    and the write holder itself may take the read side, which is how a writer downgrades.
    """

    __slots__ = ()


class WriteLock(_SyncSide, _WriteCore):
    """The write side of an :class:`RWLock` (``rwlock.write_lock``).

    One thread at a time holds it, and only while nobody (else) holds the read side.
    While a thread waits for it, readers that arrive later wait behind it (one queue, in
    arrival order); a writer process that dies while waiting stops holding them back at
    most the queue entry's lease (2 s) later.

    ``threading.Condition(rw.write_lock).wait()`` by a writer that also reads (it
    downgraded) releases both sides while it waits and takes both back.
    """

    __slots__ = ()

    def _held_with(self) -> ReadLock:
        read = self._read
        assert isinstance(read, ReadLock)  # built by RWLock: the sync read side
        return read


R = TypeVar("R", bound=_ReadCore)
W = TypeVar("W", bound=_WriteCore)


class _RWPair(Generic[R, W]):
    """Both sides of one readers-writer lock, built together (sync or asyncio sides)."""

    __slots__ = ("_read", "_write", "__weakref__")

    _read_type: Type[R]
    _write_type: Type[W]
    #: Public class name used in messages, e.g. ``"rlocks.RWLock"``.
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
        read = self._read_type(name, options)
        # The read side checked everything and picked the client; the write side shares it.
        self._read: R = read
        self._write: W = self._write_type(name, read, replace(options, client=read.client))

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
        # A copy would share both sides' holds; see Primitive.__reduce_ex__.
        raise TypeError(
            f"cannot pickle or copy {self._read._label!r} object {self.name!r}: its holds "
            "belong to this process; build another object with the same name instead"
        )

    def __repr__(self) -> str:
        reading = len(self._read._local_owners())
        writing = len(self._write._local_owners())
        return (
            f"<{self._read._label} name={self.name!r} namespace={self.namespace!r} "
            f"readers here={reading} writers here={writing} at {id(self):#x}>"
        )


class RWLock(_RWPair[ReadLock, WriteLock]):
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
      ``fair=False`` lets a free lock go to whoever asks first, barging past the queue;
      a release still wakes only as many waiting processes as it can serve, and grants
      them at the first release after their patience (100 ms) ends;
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
        """Readers, the writer and the queue of waiting processes, from Redis.

        A few read-only round trips; returns a frozen dataclass (the same the ``rlocks``
        command line prints). Redis errors propagate.
        """
        return self._read._statistics()
