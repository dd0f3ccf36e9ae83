"""The ``threading.RLock`` surface, for primitives whose holds belong to a thread.

``rlocks.RLock`` and both sides of ``rlocks.RWLock`` are reentrant locks owned by the
calling thread: they share ``acquire``/``release``/``with`` and the ``threading.Condition``
protocol exactly, and differ only in their scripts, their keys and ``locked()``. Keeping
the surface here, once, is what keeps their behaviour (errors, lost-hold unwinding,
Condition support) the same.
"""

from __future__ import annotations

import time
from typing import Optional, Tuple

from ..errors import NotOwnedError
from . import checks
from .primitive import Primitive, SyncPrimitive
from .state import PrimitiveState
from .waiting import backoff, take_back_pauses

__all__ = ["OwnerViews", "ReentrantLock"]


class OwnerViews(Primitive):
    """What the owner of a reentrant lock learns of its own hold without I/O (see
    ``Primitive._owner``): written once for the threading surface (:class:`ReentrantLock`)
    and the asyncio one (``aio.AsyncReentrantLock``)."""

    __slots__ = ()

    def owned(self) -> bool:
        """Whether the owner (the calling thread; the running task in ``rlocks.asyncio``)
        holds the lock, as far as this process knows (no I/O, not a coroutine).

        Like redis-py's ``Lock.owned()``, but from local state: False once the hold is
        known lost (``release()`` is still owed and raises LockLostError), True for a hold
        that ended in Redis unnoticed so far (``extend()`` or ``release()`` would tell).
        """
        return self._owns(self._owner())

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the owner's current hold (the calling thread's; the running
        task's in ``rlocks.asyncio``), or None when it holds nothing here (no I/O).

        Every fresh grant of this lock (of this side, for an RWLock) gets a larger token
        than every earlier grant of it, in any process, even across lease expiries,
        forced releases, hand-overs and a Redis restart that lost the counter (tokens
        never fall below the server clock in microseconds). Re-entry keeps the token; a
        ``Condition.wait`` gives the lock up, so the hold it takes back has a new one.
        Pass it with every write to the resource the lock protects, and have the resource
        refuse a token smaller than the largest it has seen (README, "Fencing tokens"):
        a holder whose lease ended unnoticed then cannot overwrite its successor's work.
        A hold known lost keeps its (stale) token until it is released.

        Raises RLocksError on a lock whose client is a :class:`rlocks.Quorum`: its
        masters count independently, so no one number orders its grants; use
        :attr:`tokens`.
        """
        return self._token(self._owner())

    @property
    def tokens(self) -> Optional[Tuple[Optional[int], ...]]:
        """The fencing tokens of the owner's current hold (the calling thread's; the
        running task's in ``rlocks.asyncio``), one per master, or None when it holds
        nothing here (no I/O).

        On a :class:`rlocks.Quorum`: each master's token, in the order of the Quorum's
        clients, None for a master that did not grant this hold. Any two holds were
        granted by majorities that share a master, and that master's tokens order them:
        the protected resource keeps, per master, the largest token seen and refuses a
        write whose token for some master is below it (README, "Fencing tokens"); every
        process must list the masters in the same order. Without a Quorum: ``(token,)``.
        Re-entry keeps the tokens.
        """
        return self._tokens(self._owner())

    def _is_owned(self) -> bool:
        """Whether the owner holds the lock (local knowledge, no I/O)."""
        return self._held(self._owner()) > 0

    def _recursion_count(self) -> int:
        """How many times the owner holds the lock (no I/O)."""
        return self._held(self._owner())


class ReentrantLock(OwnerViews, SyncPrimitive):
    """Engine base of a thread-owned reentrant lock; subclasses add scripts and ``locked``."""

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, or re-enter it if the calling thread holds it already.

        Blocks while the lock is unavailable when ``blocking`` is true, for at most
        ``timeout`` seconds unless it is -1 (forever). Returns True once held, False if it
        could not be had in time. An uncontended acquire, re-entry included, is one round
        trip (which also restarts the hold's lease).

        Raises what ``threading.RLock.acquire`` raises for bad arguments (ValueError,
        OverflowError, TypeError) before touching Redis; LockLostError if this thread's
        hold was lost and is not yet released (re-entering it would hide the loss);
        redis-py errors if Redis cannot be reached (a blocked call then returns or raises
        within its timeout plus the client's socket timeout).

        In Redis: adds one to this thread's count in the lock's hash and restarts its lease.
        """
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return self._acquire(self._owner(), 1, wait)

    def release(self) -> None:
        """Release one level of the calling thread's hold; at the last, free the lock.

        Raises RuntimeError (:class:`~rlocks.errors.NotOwnedError`) if the calling thread
        does not hold the lock, without any I/O; :class:`~rlocks.errors.LockLostError` if
        the hold had already ended in Redis (lease expired, key deleted): whoever holds it
        now is not touched. Freeing the lock wakes waiters (one per waiting process).
        """
        self._release(self._owner(), 1)

    __enter__ = acquire

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        raise NotImplementedError

    def extend(self, ttl: Optional[float] = None) -> None:
        """Make the calling thread's hold last at least ``ttl`` seconds from now (one round
        trip); ``None`` means the lock's own ``ttl``.

        For ``auto_renew=False``, where nothing else renews the lease. It never shortens
        a lease: a smaller ``ttl`` than what is left keeps what is left (another object of
        this lock held by the same thread may rely on it). Returns None.

        Raises, without any I/O: TypeError / ValueError for a bad ``ttl``;
        RuntimeError (:class:`~rlocks.errors.NotOwnedError`) if the calling thread does
        not hold the lock; :class:`~rlocks.errors.LockLostError` if its hold is known
        lost. Raises LockLostError too if Redis answers that the hold is gone (it is then
        reported lost; ``release()`` is still owed). Redis errors propagate.
        """
        self._extend(self._owner(), ttl)

    def statistics(self) -> PrimitiveState:
        """Holders, counts, leases and waiting processes, read from Redis now.

        A few read-only round trips; returns a frozen dataclass (the same the ``rlocks``
        command line prints). Redis errors propagate.
        """
        return self._statistics()

    # -- threading.Condition protocol (same names and contracts as threading.RLock) ------

    def _release_save(self) -> Tuple[int, str, int]:
        """Release every level of the calling thread's hold; return what restores it.

        With the levels of :meth:`_held_with` this lock (a writer's read side, given back
        first): a thread waiting on a ``Condition`` must let others in, and no one could
        write while it still read. Raises RuntimeError, changing nothing, when the thread
        also holds it through another object of its name (see ``_check_condition_wait``;
        an object on another client is found by the release, which is then undone).
        """
        owner = self._owner()
        count = self._held(owner)
        if count == 0:
            raise NotOwnedError(
                f"cannot release un-acquired lock {self._describe()}", name=self._name
            )
        inner = self._held_with()
        self._check_condition_wait(owner, inner)
        inner_count = inner._held(owner) if inner is not None else 0
        # A refusal takes the levels back as re-entries, which issue no token: put the
        # hold's own back, so the refusal changes nothing.
        tokens = self._tokens_held(owner)
        inner_tokens = inner._tokens_held(owner) if inner is not None else (None, None)
        if inner is not None and inner_count:
            left = inner._release(owner, inner_count)
            if left:
                inner._acquire(owner, inner_count, None)  # still held: a re-entry, at once
                inner._put_tokens(owner, inner_tokens)
                raise inner._foreign_levels(owner, left)
        left = self._release(owner, count)
        if left:
            self._acquire(owner, count, None)
            self._put_tokens(owner, tokens)
            if inner is not None and inner_count:
                inner._acquire(owner, inner_count, None)  # the writer's read: at once
                inner._put_tokens(owner, inner_tokens)
            raise self._foreign_levels(owner, left)
        return count, owner, inner_count

    def _acquire_restore(self, state: Tuple[int, str, int]) -> None:
        """Re-acquire, blocking, the levels ``_release_save`` gave back: this lock's first,
        then those of :meth:`_held_with` it (a writer takes its read side at once).

        Blocks while Redis cannot be reached (a restart), trying again with a growing
        pause; raises other errors (and an interrupt) without the levels."""
        count, _owner, inner_count = state
        owner = self._owner()
        inner = self._held_with()
        for lock, levels in ((self, count), (inner, inner_count)):
            if lock is None or not levels:
                continue
            pauses = backoff()
            # It must end held: never a deadlock's victim, and a link error is ridden
            # through (waiting.take_back_pauses), or wait() would raise without the lock.
            with lock._taking_back(owner):
                while True:
                    try:
                        lock._acquire(owner, levels, None)
                        break
                    except Exception as exc:  # noqa: BLE001 - raised again unless a link error
                        time.sleep(take_back_pauses(exc, pauses))

    def _held_with(self) -> Optional["ReentrantLock"]:
        """Another lock whose holds this one's ``Condition`` protocol releases and restores
        along with its own (``None``; a write side names its read side)."""
        return None

    # -- introspection -------------------------------------------------------------------

    def __repr__(self) -> str:
        # Local truth only: no I/O in a repr. "held" means held by a thread of this process.
        owners = self._local_owners()
        if len(owners) == 1:
            owner, count = owners[0]
            state = f"held owner={owner!r} count={count}"
        elif owners:
            state = f"held here by {len(owners)} threads"
        else:
            state = "not held here"
        return (
            f"<{self._describe_class()} name={self._name!r} namespace={self._namespace!r} "
            f"{state} at {id(self):#x}>"
        )

    def _describe_class(self) -> str:
        return self._label
