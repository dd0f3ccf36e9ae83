"""``rlocks.asyncio.RWLock``: the asyncio twin of :class:`rlocks.RWLock`."""

from __future__ import annotations

from typing import Any

from .._engine import checks
from .._engine.state import PrimitiveState, astatistics
from .._engine.steps import adrive
from .._engine.surface import AsyncLockSurface
from ..rwlock import RWPair, Side, _count

__all__ = ["RWLock", "ReadLock", "WriteLock"]


class ReadLock(Side, AsyncLockSurface):
    """The read side of an :class:`RWLock`, owned by the running task."""

    __slots__ = ()

    _label = "rlocks.asyncio.RWLock"

    async def locked(self) -> bool:
        """Whether anyone, anywhere, holds the read side now (one round trip)."""
        return bool(await adrive(_count(self)) > 0)

    async def statistics(self) -> PrimitiveState:
        """The whole RWLock's state (both sides), awaited."""
        return await astatistics(self)


class WriteLock(Side, AsyncLockSurface):
    """The write side of an :class:`RWLock`, owned by the running task."""

    __slots__ = ()

    _label = "rlocks.asyncio.RWLock"

    async def acquire(self, blocking: bool = True, timeout: Any = None) -> bool:
        # Bad input first (None: for ever, as in the asyncio surface).
        checks.lock_wait(blocking, -1 if timeout is None else timeout, self._label, self._name)
        self._check_upgrade(self._owner())
        return await super().acquire(blocking, timeout)

    acquire.__doc__ = AsyncLockSurface.acquire.__doc__

    async def locked(self) -> bool:
        """Whether anyone, anywhere, holds the write side now (one round trip)."""
        return bool(await adrive(_count(self)) > 0)

    async def statistics(self) -> PrimitiveState:
        """The whole RWLock's state (both sides), awaited."""
        return await astatistics(self)

    def _held_with(self) -> Any:
        return self._other


class RWLock(RWPair[ReadLock, WriteLock]):
    """A readers-writer lock across processes and hosts, for asyncio tasks.

    ``RWLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None, replicas=0, replica_wait=1.0, fair=True,
    deadlock_timeout=1.0, entry_lease=2.0)``; ``.read_lock`` and ``.write_lock``
    work like :class:`rlocks.asyncio.RLock` (``await acquire()``, ``await release()``,
    ``async with``), with the rules of :class:`rlocks.RWLock` between them (first come,
    first served, downgrade allowed, upgrade refused with UpgradeError). Same Redis state
    as :class:`rlocks.RWLock` of the same name.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.RWLock"
    _read_type = ReadLock
    _write_type = WriteLock

    async def statistics(self) -> PrimitiveState:
        """As :meth:`rlocks.RWLock.statistics`, awaited."""
        return await astatistics(self._read)
