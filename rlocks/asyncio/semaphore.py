"""``rlocks.asyncio.Semaphore`` and ``BoundedSemaphore``: asyncio twins of rlocks' semaphores."""

from __future__ import annotations

from typing import Any, Optional

from redis.exceptions import ResponseError

from .._engine import checks, identity
from .._engine.aio import AsyncPrimitive
from .._engine.clock import monotonic
from .. import semaphore as _sync

__all__ = ["Semaphore", "BoundedSemaphore"]


class _AsyncSemaphore(AsyncPrimitive):
    """The awaited surface shared by both asyncio semaphores (permits belong to the process)."""

    __slots__ = ()

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take one permit, waiting (without blocking the loop) while none is free.

        Same arguments, return value and errors as :meth:`rlocks.Semaphore.acquire`;
        cancelling the waiting task leaves no permit taken.
        """
        wait = checks.semaphore_wait(blocking, timeout, self._label, self._name)
        try:
            return await self._atake(identity.process_owner(), 1, wait)
        except ResponseError as exc:
            raise self._translate(exc) from None  # type: ignore[attr-defined]

    async def release(self, n: int = 1) -> None:
        """Give ``n`` permits back (a round trip); errors as :meth:`rlocks.Semaphore.release`."""
        owner, own, call = self._begin_release(n)  # type: ignore[attr-defined]
        since = monotonic()
        try:
            reply = await self._arun_call(call)
        except ResponseError as exc:
            raise self._release_refused(owner, own, since, exc) from None  # type: ignore[attr-defined]  # noqa: E501
        self._finish_release(owner, own, since, reply)  # type: ignore[attr-defined]

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        from ..errors import LockLostError

        if isinstance(exc, LockLostError) and getattr(exc, "lock", None) is self:
            self._record_release(identity.process_owner(), 1)
            return
        await self.release()

    def __enter__(self) -> None:
        raise TypeError(f"{self._label} is for asyncio: use 'async with', not 'with'")

    def __exit__(self, *exc_info: Any) -> None:  # pragma: no cover - __enter__ refuses
        raise TypeError(f"{self._label} is for asyncio: use 'async with', not 'with'")


class Semaphore(_AsyncSemaphore, _sync.Semaphore):
    """:class:`rlocks.Semaphore` for asyncio: ``await acquire()``, ``await release(n)``."""

    __slots__ = ()
    _label = "rlocks.asyncio.Semaphore"


class BoundedSemaphore(_AsyncSemaphore, _sync.BoundedSemaphore):
    """:class:`rlocks.BoundedSemaphore` for asyncio."""

    __slots__ = ()
    _label = "rlocks.asyncio.BoundedSemaphore"
