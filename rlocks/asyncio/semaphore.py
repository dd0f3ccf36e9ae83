"""``rlocks.asyncio.Semaphore`` and ``BoundedSemaphore``: asyncio twins of rlocks' semaphores."""

from __future__ import annotations

from .._engine.state import PrimitiveState, astatistics
from .._engine.surface import AsyncPermitSurface
from ..semaphore import SemaphoreCore

__all__ = ["Semaphore", "BoundedSemaphore"]


class Semaphore(SemaphoreCore, AsyncPermitSurface):
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

    async def statistics(self) -> PrimitiveState:
        """As :meth:`rlocks.Semaphore.statistics`, awaited."""
        return await astatistics(self)


class BoundedSemaphore(Semaphore):
    """:class:`rlocks.BoundedSemaphore` for asyncio."""

    __slots__ = ()

    _label = "rlocks.asyncio.BoundedSemaphore"
    _bounded = True
