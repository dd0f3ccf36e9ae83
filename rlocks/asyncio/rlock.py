"""``rlocks.asyncio.RLock``: the asyncio twin of :class:`rlocks.RLock`."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .._engine.constructors import public_init
from .._engine.primitive import ENTRY_LEASE, Options
from .._engine.state import PrimitiveState, astatistics
from .._engine.surface import AsyncLockSurface
from ..rlock import _SPEC

__all__ = ["RLock"]


class RLock(AsyncLockSurface):
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

    @public_init
    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
        replicas: int = 0,
        replica_wait: float = 1.0,
        fair: bool = True,
        deadlock_timeout: Optional[float] = 1.0,
        entry_lease: float = ENTRY_LEASE,
    ) -> None:
        self._configure(name, Options.of(locals()), "rlock", _SPEC)

    async def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(await self._backend.aread(("EXISTS", self._keys.hash)))

    async def statistics(self) -> PrimitiveState:
        """As :meth:`rlocks.RLock.statistics`, awaited."""
        return await astatistics(self)
