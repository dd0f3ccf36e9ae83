"""``rlocks.asyncio.RLock``: the asyncio twin of :class:`rlocks.RLock`."""

from __future__ import annotations

from typing import Any

from .._engine.aio import AsyncReentrantLock, agather
from .._engine.quorum import Quorum
from ..rlock import _RLockCore

__all__ = ["RLock"]


class RLock(AsyncReentrantLock, _RLockCore):
    """A reentrant lock across processes and hosts, owned by the running asyncio task.

    ``RLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None, replicas=0, replica_wait=1.0, fair=True,
    deadlock_timeout=1.0, entry_lease=2.0)`` with ``client`` a
    ``redis.asyncio.Redis`` (``None``: ``RLOCKS_URL``).
    Same state and semantics as :class:`rlocks.RLock`; the same task may acquire again
    and must release as many times. ``on_lost`` may be an ``async def``: it is then run
    as a task on the event loop that found the loss (exceptions logged); a plain function
    runs on rlocks' callback thread, as for :class:`rlocks.RLock`, so that a slow one
    blocks neither the loop nor renewal (use ``loop.call_soon_threadsafe`` from it to act
    on the loop). Construction does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.RLock"

    async def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip; with a
        Quorum, one to each master at once, and a majority must agree)."""
        client = self._aclient()
        if isinstance(client, Quorum):

            async def exists(master: Any) -> int:
                return int(await master.exists(self._keys.hash))

            return client.agreed(await agather(client, exists)) > 0
        return bool(await client.exists(self._keys.hash))
