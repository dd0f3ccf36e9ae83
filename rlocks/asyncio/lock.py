"""``rlocks.asyncio.Lock``: the asyncio twin of :class:`rlocks.Lock`."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .._engine import checks, dialogues, identity
from .._engine.constructors import public_init, public_method
from .._engine.nonreentrant import ProcessOwned
from .._engine.primitive import ENTRY_LEASE, Options
from .._engine.state import PrimitiveState, astatistics
from .._engine.steps import adrive
from .._engine.surface import AsyncLockSurface
from ..lock import _SPEC

__all__ = ["Lock"]


class Lock(ProcessOwned, AsyncLockSurface):
    """A lock that is not reentrant, across processes and hosts, for asyncio:
    ``asyncio.Lock`` across processes.

    ``Lock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None, replicas=0, replica_wait=1.0, fair=True, entry_lease=2.0)`` with
    ``client`` a ``redis.asyncio.Redis`` (``None``: ``RLOCKS_URL``). Same state and
    semantics as :class:`rlocks.Lock`: a second acquire by the task that holds it waits,
    and any task of the holding process may release it. Construction does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.Lock"

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
        entry_lease: float = ENTRY_LEASE,
    ) -> None:
        self._configure(name, Options.of(locals()), "lock", _SPEC)

    def _caller(self) -> str:
        return identity.task_owner()

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """As :meth:`rlocks.Lock.acquire`, awaited, for the running task; ``timeout=None``
        (or -1) waits for ever. A task cancelled while it acquires leaves nothing held."""
        if timeout is None:
            timeout = -1
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return await self._aacquire(self._asker(), 1, wait)

    acquire = public_method(acquire)

    async def release(self) -> None:
        """Release the lock, from any task of the process that holds it (errors as
        :meth:`rlocks.Lock.release`); the round trip runs on if the task is cancelled."""
        owner = self._releasing()
        await adrive(dialogues.release(self._hold_object(owner), owner))

    async def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(await self._backend.aread(("EXISTS", self._keys.hash)))

    async def statistics(self) -> PrimitiveState:
        """As :meth:`rlocks.Lock.statistics`, awaited."""
        return await astatistics(self)
