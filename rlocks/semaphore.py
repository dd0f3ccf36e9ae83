"""``rlocks.Semaphore`` and ``rlocks.BoundedSemaphore``: ``threading``'s semaphores across
processes and hosts.

One Redis hash per semaphore (layout in ``_engine/lua/sem_lib.lua``): the free count, the
initial value and kind, and the permits each *process* holds under that process's lease.
Permits belong to the process (``identity.process_owner()``), not the thread, because
``threading.Semaphore`` lets any thread release what another acquired.
"""

from __future__ import annotations

import operator
from types import TracebackType
from typing import Any, Callable, Optional, Sequence, Tuple, Type

from redis.exceptions import ResponseError

from ._engine import checks, identity
from ._engine.clock import monotonic
from ._engine.constructors import public_init
from ._engine.inspect import PrimitiveState
from ._engine.primitive import Primitive
from ._engine.scripts import Arg, Call, Reply, load

__all__ = ["Semaphore", "BoundedSemaphore"]

# Lua numbers are doubles: counts above 2**53 would silently lose precision.
_COUNT_MAX = 2**53 - 1
_MISMATCH = "RLOCKS_SEM_MISMATCH"


def _count(value: object, what: str, label: str) -> int:
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{label}: {what} must be an int, not {type(value).__name__}") from None
    if number > _COUNT_MAX:
        raise ValueError(f"{label}: {what} must be at most 2**53 - 1, got {number}")
    return number


class _SemaphoreCore(Primitive):
    """What a semaphore is, without I/O: hash layout, scripts, arguments, reply handling.

    Shared by :class:`Semaphore` and ``rlocks.asyncio.Semaphore``, which add their
    surfaces. Permits belong to the process (``identity.process_owner()``).
    """

    __slots__ = ("_value",)

    _label = "rlocks.Semaphore"
    _kind = "sem"
    _bounded = 0
    _acquire_script = load("sem_acquire", prelude="sem_lib")
    _release_script = load("sem_release", prelude="sem_lib")
    _renew_script = load("sem_renew", prelude="sem_lib")

    @public_init
    def __init__(
        self,
        name: str,
        value: int = 1,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
        replicas: int = 0,
        replica_wait: float = 1.0,
    ) -> None:
        label = f"{self._label}({name!r})"
        value = _count(value, "value", label)
        if value < 0:
            raise ValueError(f"{label}: semaphore initial value must be >= 0, got {value}")
        super().__init__(
            name,
            client=client,
            ttl=ttl,
            auto_renew=auto_renew,
            namespace=namespace,
            on_lost=on_lost,
            replicas=replicas,
            replica_wait=replica_wait,
        )
        self._value = value

    @property
    def value(self) -> int:
        """The initial value this object was built with (no I/O)."""
        return self._value

    # -- script arguments (see the headers of the sem_*.lua files) -----------------------

    def _acquire_arguments(
        self, owner: str, count: int, reentry: bool, waiting: bool
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        # Permits are counted, not nested: holding some already changes nothing here.
        return (self._keys.hash,), (owner, self._ttl_ms, count, self._value, self._bounded)

    def _release_arguments(
        self, owner: str, count: int, everything: bool
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        raise NotImplementedError("Semaphore.release builds its own call")

    def _renew_arguments(
        self, owner: str, lease_ms: Optional[int] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        lease = lease_ms or self._ttl_ms
        return (self._keys.hash,), (owner, lease, self._value, self._bounded)

    def _begin_release(self, n: int) -> Tuple[str, int, Call]:
        """The I/O-free start of a release: (owner, own permits taken off, the call)."""
        label = self._describe()
        n = _count(n, "n", label)
        if n < 1:
            raise ValueError(f"{label}: n must be one or more")
        owner = identity.process_owner()
        # This process's permits come off the local books before the I/O, so the local
        # count never exceeds Redis's and the renewer never sees a permit Redis lacks
        # unless it really was lost.
        own, lost = self._drop(owner, n)
        if lost:
            raise self._lost_error()
        call = self._prepared(
            ("release", owner, n, own),
            self._release_script,
            lambda: (
                (self._keys.hash, self._keys.channel),
                (owner, n, own, self._value, self._bounded, self._publish),
            ),
        )
        return owner, own, call

    def _undo_call(self, owner: str, count: int) -> Call:
        # Permits granted but not kept go back as this process's own.
        keys = (self._keys.hash, self._keys.channel)
        args = (owner, count, count, self._value, self._bounded, self._publish)
        return Call(self._release_script, keys, args)

    def _release_refused(
        self, owner: str, own: int, since: float, exc: ResponseError
    ) -> Exception:
        # Redis refused with an error reply and changed nothing: our permits are ours.
        self._unreserve(owner, own, since)
        return self._translate(exc)

    def _finish_release(self, owner: str, own: int, since: float, reply: Reply) -> None:
        """The I/O-free end of a release: refusals and losses become exceptions."""
        if reply.busy:
            self._unreserve(owner, own, since)
            raise ValueError(f"{self._describe()}: Semaphore released too many times")
        if reply.not_owner:
            if own and self._held(owner) == 0:
                # Every local permit came off the books above, so _hold_lost would find
                # nothing to mark: report the loss here, as a renewal would have.
                self._report_lost(owner, "its permits were gone at release")
            else:
                self._hold_lost(owner, "its permits were gone at release")
            raise self._lost_error()

    # -- local bookkeeping of permits ----------------------------------------------------

    def _unreserve(self, owner: str, own: int, since: float) -> None:
        # Redis refused the release and changed nothing: the permits are ours again.
        if own:
            self._record_grant(owner, own, since)

    def _translate(self, exc: ResponseError) -> Exception:
        text = str(exc)
        if not text.startswith(_MISMATCH):
            return exc
        try:
            stored_value, stored_bounded = (int(part) for part in text.split()[1:3])
        except ValueError:
            return exc
        stored_kind = "BoundedSemaphore" if stored_bounded == 1 else "Semaphore"
        mine = "BoundedSemaphore" if self._bounded else "Semaphore"
        return ValueError(
            f"{self._describe()}: Redis holds this name as a {stored_kind} with initial "
            f"value {stored_value}, but this object is a {mine} with initial value "
            f"{self._value}; nothing was changed"
        )

    # -- introspection -------------------------------------------------------------------

    def __repr__(self) -> str:
        # Local truth only: no I/O in a repr (the free count lives in Redis).
        held = sum(count for _owner, count in self._local_owners())
        return (
            f"<{self._label} name={self._name!r} namespace={self._namespace!r} "
            f"value={self._value} held here={held} at {id(self):#x}>"
        )


class Semaphore(_SemaphoreCore):
    """A counting semaphore shared by every process that uses the same name and Redis.

    ``Semaphore(name, value=1, *, client=None, ttl=30.0, auto_renew=True,
    namespace="rlocks", on_lost=None, replicas=0, replica_wait=1.0)``

    Like ``threading.Semaphore``: ``acquire()`` takes a permit, waiting while none is
    free; ``release(n)`` gives ``n`` back, and any thread may release (an unbounded
    semaphore's value grows past its initial value exactly as ``threading``'s does).

    Permits belong to the *process*: while this process lives and keeps a reference to
    the semaphore, its lease on them is renewed about every ``ttl / 3``; when it dies
    they come back to the pool at most ``ttl`` after its last renewal (a
    BoundedSemaphore never goes above its initial value, recovery included).

    The initial ``value`` (and whether the semaphore is bounded) is stored in Redis by the
    first operation that leaves state there. Every later operation, from any process,
    checks its own ``value`` and kind against the stored ones and raises ValueError naming
    both when they differ, changing nothing. A semaphore at rest (nobody holds a permit and
    the free count equals the initial value) leaves no key in Redis, so the next user's
    value then defines it afresh.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.Semaphore"

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take one permit for this process, waiting while none is free.

        Waits forever with ``timeout=None``, at most ``timeout`` seconds otherwise, not at
        all with ``blocking=False``. Returns True once a permit is taken, False if none
        could be had in time.

        Raises, before touching Redis, what ``threading.Semaphore.acquire`` raises for bad
        arguments; LockLostError if this process's permits were lost (lease ended) and not
        all released yet; ValueError if Redis holds this semaphore with another initial
        value or kind. Redis errors propagate.

        In Redis: one off the free count, one onto this process's permits, its lease
        restarted.
        """
        wait = checks.semaphore_wait(blocking, timeout, self._label, self._name)
        try:
            return self._take(identity.process_owner(), 1, wait)
        except ResponseError as exc:
            raise self._translate(exc) from None

    __enter__ = acquire

    def release(self, n: int = 1) -> None:
        """Give ``n`` permits back and wake up to ``n`` waiters (per waiting process).

        Any thread may release, whether or not this process acquired: permits this process
        holds are taken off its record first; the rest add to the free count, as in
        ``threading.Semaphore``.

        Raises, without changing anything in Redis: ValueError if ``n < 1``, if a
        BoundedSemaphore would go above its initial value ("Semaphore released too many
        times"), or if Redis holds this semaphore with another initial value or kind;
        TypeError if ``n`` is not an int; LockLostError if permits this process held were
        lost (lease ended: they are back in the pool already; the local count drops).
        """
        owner, own, call = self._begin_release(n)
        since = monotonic()
        try:
            reply = call(self._client)
        except ResponseError as exc:
            raise self._release_refused(owner, own, since, exc) from None
        # On any other error (connection...) the reserved permits stay dropped locally, as
        # RLock's release does: renewal stops and their lease runs out on the server.
        self._finish_release(owner, own, since, reply)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._unwound_quietly(exc, identity.process_owner()):
            self.release()

    def owned(self) -> bool:
        """Whether this process holds a permit, as far as it knows (local state, no I/O).

        Permits belong to the process, so this is True in every thread once any thread
        acquired; False once the permits are known lost.
        """
        return self._owns(identity.process_owner())

    def extend(self, ttl: Optional[float] = None) -> None:
        """Make this process's permits last at least ``ttl`` seconds from now (one round
        trip); ``None`` means the semaphore's own ``ttl``.

        For ``auto_renew=False``. Only this process's lease changes, and it is never
        shortened: a smaller ``ttl`` than what is left keeps what is left. Returns None.

        Raises, without any I/O: TypeError / ValueError for a bad ``ttl``; RuntimeError
        (:class:`~rlocks.errors.NotOwnedError`) if this process holds no permit;
        LockLostError if its permits are known lost. Raises LockLostError too if Redis
        answers that they are gone (reported lost; ``release()`` is still owed), and
        ValueError if Redis holds this name with another value or kind.
        """
        try:
            self._extend(identity.process_owner(), ttl)
        except ResponseError as exc:
            raise self._translate(exc) from None

    def statistics(self) -> PrimitiveState:
        """Holders, permits, free count and waiting processes, read from Redis now.

        A few read-only round trips; returns a frozen dataclass (the same the ``rlocks``
        command line prints). Redis errors propagate.
        """
        return self._statistics()


class BoundedSemaphore(Semaphore):
    """A :class:`Semaphore` whose free count never goes above its initial value.

    ``release()`` raises ValueError ("Semaphore released too many times") when it would,
    as ``threading.BoundedSemaphore`` does, and permits recovered from a dead process are
    capped at the initial value too. Redis remembers the kind: a Semaphore and a
    BoundedSemaphore cannot share a name.
    """

    __slots__ = ()

    _label = "rlocks.BoundedSemaphore"
    _bounded = 1
