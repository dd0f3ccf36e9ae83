"""``rlocks.asyncio.RLock``: the asyncio twin of :class:`rlocks.RLock`."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .._engine.aio import AsyncReentrantLock
from ..rlock import _RLockCore

__all__ = ["RLock"]


class RLock(AsyncReentrantLock, _RLockCore):
    """A reentrant lock across processes and hosts, owned by the running asyncio task.

    ``RLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None)`` with ``client`` a ``redis.asyncio.Redis`` (``None``: ``RLOCKS_URL``).
    Same state and semantics as :class:`rlocks.RLock`; the same task may acquire again
    and must release as many times. Construction does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.RLock"

    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[["RLock"], object]] = None,
        replicas: int = 0,
        replica_wait: float = 1.0,
    ) -> None:
        super().__init__(
            name,
            client=client,
            ttl=ttl,
            auto_renew=auto_renew,
            namespace=namespace,
            on_lost=on_lost,
            replicas=replicas,
            replica_wait=replica_wait,
        )

    async def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(await self._aclient().exists(self._keys.hash))
