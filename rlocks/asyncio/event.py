"""``rlocks.asyncio.Event``: the asyncio twin of :class:`rlocks.Event`."""

from __future__ import annotations

from typing import Any, Optional

from .._engine import identity, metrics
from .._engine.backends import backend_for
from .._engine.constructors import public_init
from .._engine.event import ENTRY_LEASE, EventCore
from .._engine.steps import adrive
from .._engine.surface import LoopDefault

__all__ = ["Event"]


class Event(EventCore):
    """An Event across processes and hosts, for asyncio tasks.

    ``Event(name, *, client=None, namespace="rlocks", entry_lease=2.0)`` with ``client``
    a ``redis.asyncio`` client (``None``: each event loop's own client for
    ``RLOCKS_URL``, closed by ``await rlocks.asyncio.aclose()``). The same Redis state
    and semantics as :class:`rlocks.Event` of the same name: threads and tasks, in any
    process, set and wait on one Event.

    Differences from ``asyncio.Event``: ``set``, ``clear`` and ``is_set`` are coroutines
    (each is a round trip), and ``wait`` takes a ``timeout`` (``None``: no limit) and
    returns False when it runs out, as ``threading.Event.wait`` does. A task cancelled
    while it waits removes its entry in Redis (a shielded round trip) before the
    cancellation goes on; if Redis cannot be reached, the entry ends with its lease.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.Event"
    _aio = True

    @public_init
    def __init__(self, name: str, *, client: Any = None, namespace: str = "rlocks",
                 entry_lease: float = ENTRY_LEASE) -> None:
        self._configure(name, client, namespace, entry_lease)

    def _backend_of(self, client: Any) -> Any:
        return LoopDefault() if client is None else backend_for(client)

    @staticmethod
    def _owner() -> str:
        return identity.task_owner()

    @property
    def client(self) -> Any:
        """The client this Event talks to (with ``client=None``: the running loop's)."""
        if self._client is None:
            return self._backend.server().client
        return self._client

    async def is_set(self) -> bool:
        """As :meth:`rlocks.Event.is_set`, awaited (one read)."""
        return bool(await adrive(self._is_set()))

    async def set(self) -> None:
        """As :meth:`rlocks.Event.set`, awaited (one round trip)."""
        await adrive(self._set())

    async def clear(self) -> None:
        """As :meth:`rlocks.Event.clear`, awaited (one round trip)."""
        await adrive(self._clear())

    async def wait(self, timeout: Optional[float] = None) -> bool:
        """As :meth:`rlocks.Event.wait`, for the running task: True once the Event is set
        or a ``set()`` came while it waited, False after ``timeout`` seconds (``None``: no
        limit). Misuse errors before any I/O, as there."""
        seconds = self._seconds(timeout)
        if seconds == 0:  # (a look: no wait to count)
            return bool(await adrive(self._wait(self._owner(), seconds)))
        with metrics.waits(self):
            return bool(await adrive(self._wait(self._owner(), seconds)))
