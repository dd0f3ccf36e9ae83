"""``rlocks.asyncio.RWLock``: the asyncio twin of :class:`rlocks.RWLock`."""

from __future__ import annotations

from .._engine.aio import AsyncReentrantLock
from .. import rwlock as _sync

__all__ = ["RWLock", "ReadLock", "WriteLock"]


class _AsyncSide(AsyncReentrantLock):
    __slots__ = ()

    async def locked(self) -> bool:  # type: ignore[override]
        """Whether any owner, anywhere, holds this side now (one round trip)."""
        from .._engine.scripts import arun

        reply = await arun(
            self._aclient(), self._holders_script, (self._keys.hash,), (self._side,)  # type: ignore[attr-defined]  # noqa: E501
        )
        return reply.count > 0


class ReadLock(_AsyncSide, _sync.ReadLock):
    """The read side of an :class:`RWLock`, owned by the running task."""

    __slots__ = ()
    _label = "rlocks.asyncio.RWLock"


class WriteLock(_AsyncSide, _sync.WriteLock):
    """The write side of an :class:`RWLock`, owned by the running task."""

    __slots__ = ()
    _label = "rlocks.asyncio.RWLock"


class RWLock(_sync.RWLock):
    """A readers-writer lock across processes and hosts, for asyncio tasks.

    ``RWLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None)``; ``.read_lock`` and ``.write_lock`` are :class:`rlocks.asyncio.RLock`
    -like (``await acquire()``, ``await release()``, ``async with``), with the rules of
    :class:`rlocks.RWLock` between them (writer preference, downgrade allowed, upgrade
    refused with UpgradeError).
    """

    __slots__ = ()
    _read_type = ReadLock
    _write_type = WriteLock
