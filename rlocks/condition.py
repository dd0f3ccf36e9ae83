"""``rlocks.Condition``: ``threading.Condition`` across processes and hosts."""

from __future__ import annotations

from types import TracebackType
from typing import Callable, Optional, Type, TypeVar

from ._engine.condition import ConditionCore, wait_for_steps
from ._engine.steps import drive
from .rlock import RLock
from .rwlock import WriteLock

__all__ = ["Condition"]

T = TypeVar("T")


class Condition(ConditionCore):
    """A condition variable shared by every process that uses the same lock name and Redis.

    ``Condition(lock, *, name=None)``: ``lock`` (required) is an :class:`rlocks.RLock` or
    an :class:`rlocks.RWLock`'s ``write_lock``; anything else is a TypeError (no I/O). The
    condition takes the lock's name, client and namespace: every ``Condition`` built on a
    lock of the same name, in any process, is the same condition. ``acquire``,
    ``release`` and ``with cond:`` are the lock's own.

    ``name`` tells apart several conditions of one lock (a bounded buffer's "not full"
    and "not empty"): conditions with different names are independent, as two
    ``threading.Condition`` objects on one lock are; the same name (or ``None``, the
    lock's default condition) is the same condition everywhere.

    ``wait``, ``wait_for``, ``notify`` and ``notify_all`` behave as in
    ``threading.Condition``, for threads of every process: a notification goes to the
    oldest waiters, wherever they wait. A waiter's entry in Redis has a lease of the
    lock's ``ttl``, renewed while it waits, so a notification is never kept by a waiter
    whose process died (it is passed on within one ``ttl``). Construction does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.Condition"
    _accepts = (RLock, WriteLock)
    _accepted = (
        "an rlocks.RLock or an rlocks.RWLock's write_lock (for asyncio locks use "
        "rlocks.asyncio.Condition)"
    )

    def __init__(self, lock: RLock | WriteLock, *, name: Optional[str] = None) -> None:
        super().__init__(lock, name)

    # -- the lock's surface, passed through (as threading.Condition does) ----------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """The lock's ``acquire``: see :meth:`rlocks.RLock.acquire`."""
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        """The lock's ``release``: see :meth:`rlocks.RLock.release`."""
        self._lock.release()

    def __enter__(self) -> bool:
        return bool(self._lock.__enter__())

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._lock.__exit__(exc_type, exc, tb)

    # -- threading.Condition ------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Release the lock (every level), wait until notified or ``timeout`` seconds
        passed (``None``: no limit), take the lock back (blocking as long as it takes),
        and return whether this waiter was notified.

        The calling thread must hold the lock: otherwise RuntimeError
        (:class:`~rlocks.errors.NotOwnedError`), without I/O; a bad ``timeout`` is a
        TypeError / ValueError / OverflowError as in threading, without I/O. Returns True
        also when a notification arrived just as the time ran out (the waiter took it,
        so it is not lost), and, rarely, spuriously: when this waiter stalled longer than
        the lock's ``ttl`` and its entry expired, or another notified waiter could not
        reach Redis for a whole ``ttl`` while taking the lock back (re-check your
        predicate, as ``wait_for`` does). Blocks through a Redis outage (refused or broken
        connections, a restart), as the lock's own waits do, until the time-out; the
        lock is always taken back, waiting for Redis as long as it takes. Other Redis
        errors propagate after the lock is taken back.

        In Redis: adds an entry to the condition's waiters (while still holding the
        lock), renews its lease every ``ttl / 3`` while waiting, and removes it on
        leaving. About five round trips when notified promptly.
        """
        return bool(drive(self._wait(timeout)))

    def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = None) -> T:
        """Wait until ``predicate()`` is true, or ``timeout`` seconds passed; return the
        predicate's last value. The calling thread must hold the lock; ``predicate`` is
        called with it held. Same as ``threading.Condition.wait_for``.
        """
        steps = wait_for_steps(predicate, timeout)
        try:
            while True:
                self.wait(next(steps))
        except StopIteration as done:
            result: T = done.value
            return result

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` of the oldest waiters, in any process (one round trip; none
        for ``n=0``). The calling thread must hold the lock: otherwise RuntimeError
        (:class:`~rlocks.errors.NotOwnedError`); TypeError / ValueError for an ``n``
        that is not an int >= 0; both without I/O. Waiters whose lease ended (their
        process died) are dropped first and never count. Redis errors propagate.
        """
        drive(self._notify(self._notify_count(n)))

    def notify_all(self) -> None:
        """Wake every waiter, in every process (one round trip). The calling thread must
        hold the lock: otherwise RuntimeError (:class:`~rlocks.errors.NotOwnedError`)."""
        self._check_owned("notify")
        drive(self._notify(-1))
