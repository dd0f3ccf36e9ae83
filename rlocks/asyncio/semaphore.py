"""``rlocks.asyncio.Semaphore`` and ``BoundedSemaphore``: asyncio twins of rlocks' semaphores."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from redis.exceptions import ResponseError

from .._engine import checks
from .._engine.aio import AsyncPrimitive
from .._engine.dialogue import adrive
from .._engine.scripts import op_stream
from .._engine.state import PrimitiveState
from ..semaphore import _SemaphoreCore

__all__ = ["Semaphore", "BoundedSemaphore"]


class Semaphore(AsyncPrimitive, _SemaphoreCore):
    """:class:`rlocks.Semaphore` for asyncio: ``await acquire()``, ``await release(n)``.

    ``Semaphore(name, value=1, *, client=None, ttl=30.0, auto_renew=True,
    namespace="rlocks", on_lost=None, replicas=0, replica_wait=1.0, fair=True,
    entry_lease=2.0)`` with ``client`` a
    ``redis.asyncio.Redis``. Same Redis state and rules as :class:`rlocks.Semaphore`,
    with the task in the thread's place: each permit is accounted to the task that took
    it, and any task may release.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.Semaphore"

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take one permit, waiting (without blocking the loop) while none is free.

        Same arguments, return value and errors as :meth:`rlocks.Semaphore.acquire`;
        cancelling the waiting task leaves no permit taken.
        """
        wait = checks.semaphore_wait(blocking, timeout, self._label, self._name)
        try:
            return await self._aacquire(self._owner(), 1, wait)
        except ResponseError as exc:
            raise self._translate(exc) from None

    async def release(self, n: int = 1) -> None:
        """Give ``n`` permits back (a round trip); errors as :meth:`rlocks.Semaphore.release`.

        Cancelling the task while the release is in flight still gives the permits back
        (the round trip is shielded); the CancelledError is raised as usual.
        """
        begun = self._begin_permit_release(self._owner(), n)
        try:
            # Shielded, as RLock's release: a release cancelled half-way (opening its
            # connection) still reaches Redis instead of leaving the permits there, off
            # the local books and unrenewed, until their lease ends.
            await adrive(self._release_steps(begun, op_stream()),
                         lambda step: asyncio.shield(self._arun_call(*step)))
        finally:
            # What a refusal restored is no longer in it: the rest did end here.
            self._ended(begun)

    def owned(self) -> bool:
        """Whether the running task holds a permit (local state, no I/O, not a coroutine)."""
        return self._owns(self._owner())

    async def extend(self, ttl: Optional[float] = None) -> None:
        """Make the running task's permits last at least ``ttl`` seconds from now (one
        round trip); same rules and errors as :meth:`rlocks.Semaphore.extend`."""
        try:
            await self._aextend(self._owner(), ttl)
        except ResponseError as exc:
            raise self._translate(exc) from None

    async def statistics(self) -> PrimitiveState:
        """Holders, permits, free count and waiting processes, read from Redis now
        (awaited: a few read-only round trips); see :meth:`rlocks.Semaphore.statistics`.
        Redis errors propagate."""
        return await self._astatistics()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        if not self._exit_reported_loss(exc, self._owner()):
            await self.release()


class BoundedSemaphore(Semaphore):
    """:class:`rlocks.BoundedSemaphore` for asyncio."""

    __slots__ = ()

    _label = "rlocks.asyncio.BoundedSemaphore"
    _bounded = 1
