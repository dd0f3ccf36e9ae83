"""``rlocks.asyncio.Condition``: the asyncio twin of :class:`rlocks.Condition`."""

from __future__ import annotations

from types import TracebackType
from typing import Callable, Optional, Type, TypeVar

from .._engine.condition import ConditionCore, wait_for_steps
from .._engine.steps import adrive
from .rlock import RLock
from .rwlock import WriteLock

__all__ = ["Condition"]

T = TypeVar("T")


class Condition(ConditionCore):
    """A condition variable across processes and hosts, for asyncio tasks.

    ``Condition(lock, *, name=None)`` with ``lock`` an :class:`rlocks.asyncio.RLock` or an
    :class:`rlocks.asyncio.RWLock`'s ``write_lock`` (anything else: TypeError, no I/O);
    ``name`` as for :class:`rlocks.Condition`.
    Same Redis state and semantics as :class:`rlocks.Condition` on a lock of the same
    name (threads and tasks may wait on and notify one condition), with the running
    task as the lock's owner.

    Differences from ``asyncio.Condition``: ``notify``, ``notify_all`` and ``release``
    are coroutines (each is a round trip); ``wait`` and ``wait_for`` take a ``timeout``
    (``None``: no limit) as in threading, and ``wait`` returns whether it was notified.
    A task cancelled while waiting leaves the queue (passing on a notification it had),
    takes the lock back, then re-raises, as ``asyncio.Condition.wait`` does.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.Condition"
    _accepts = (RLock, WriteLock)
    _accepted = (
        "an rlocks.asyncio.RLock or an rlocks.asyncio.RWLock's write_lock (for threading "
        "locks use rlocks.Condition)"
    )

    def __init__(self, lock: RLock | WriteLock, *, name: Optional[str] = None) -> None:
        super().__init__(lock, name)

    # -- the lock's surface, passed through -----------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """The lock's ``acquire``: see :meth:`rlocks.asyncio.RLock.acquire`."""
        return bool(await self._lock.acquire(blocking, timeout))

    async def release(self) -> None:
        """The lock's ``release`` (a coroutine: it is a round trip)."""
        await self._lock.release()

    async def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(await self._lock.locked())

    async def __aenter__(self) -> None:
        await self._lock.__aenter__()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self._lock.__aexit__(exc_type, exc, tb)

    # -- asyncio.Condition / threading.Condition --------------------------------------------

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """:meth:`rlocks.Condition.wait` for the running task: release the lock, wait for
        a notification or ``timeout`` seconds, take the lock back, return whether
        notified. Same errors, raised before any I/O for misuse.
        """
        return bool(await adrive(self._wait(timeout)))

    async def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = None) -> T:
        """Wait until ``predicate()`` (a plain callable, called with the lock held) is
        true, or ``timeout`` seconds passed; return its last value."""
        steps = wait_for_steps(predicate, timeout)
        try:
            while True:
                await self.wait(next(steps))
        except StopIteration as done:
            result: T = done.value
            return result

    async def notify(self, n: int = 1) -> None:
        """:meth:`rlocks.Condition.notify` for the running task (awaited: a round trip)."""
        await adrive(self._notify(self._notify_count(n)))

    async def notify_all(self) -> None:
        """:meth:`rlocks.Condition.notify_all` for the running task (a round trip)."""
        self._check_owned("notify")
        await adrive(self._notify(-1))
