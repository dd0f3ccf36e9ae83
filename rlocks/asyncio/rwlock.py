"""``rlocks.asyncio.RWLock``: the asyncio twin of :class:`rlocks.RWLock`."""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoScriptError

from .._engine.aio import AsyncReentrantLock, agather
from .._engine.clients import io_client
from .._engine.quorum import Quorum
from .._engine.state import PrimitiveState
from ..rwlock import _ReadCore, _RWPair, _SideCore, _WriteCore

__all__ = ["RWLock", "ReadLock", "WriteLock"]


class _AsyncSide(AsyncReentrantLock, _SideCore):
    __slots__ = ()

    _label = "rlocks.asyncio.RWLock"

    async def locked(self) -> bool:
        """Whether any owner, anywhere, holds this side now (one round trip; with a
        Quorum, one to each master at once, and a majority must agree)."""
        client = self._aclient()
        if isinstance(client, Quorum):
            return client.agreed(await agather(client, self._aholders_on)) > 0
        return await self._aholders_on(client) > 0

    async def _aholders_on(self, client: Any) -> int:
        client = io_client(client)
        results = await self._holders_pipeline(client).execute(raise_on_error=False)
        if isinstance(results[0], NoScriptError):
            await client.script_load(self._renew_script.source)
            results = await self._holders_pipeline(client).execute(raise_on_error=False)
        return self._holders_from(results)


class ReadLock(_AsyncSide, _ReadCore):
    """The read side of an :class:`RWLock`, owned by the running task."""

    __slots__ = ()


class WriteLock(_AsyncSide, _WriteCore):
    """The write side of an :class:`RWLock`, owned by the running task."""

    __slots__ = ()


class RWLock(_RWPair[ReadLock, WriteLock]):
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
        """Readers, the writer and the queue of waiting processes, read from Redis now
        (awaited: a few read-only round trips); see :meth:`rlocks.RWLock.statistics`.
        Redis errors propagate."""
        return await self._read._astatistics()
