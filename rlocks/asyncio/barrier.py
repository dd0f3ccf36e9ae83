"""``rlocks.asyncio.Barrier``: the asyncio twin of :class:`rlocks.Barrier`."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from .._engine import identity, metrics
from .._engine.barrier import BarrierCore
from .._engine.constructors import public_init
from .._engine.primitive import ENTRY_LEASE
from .._engine.steps import adrive
from .._engine.surface import LoopDefault

__all__ = ["Barrier"]


class Barrier(BarrierCore):
    """A barrier for ``parties`` asyncio tasks (and threads), in any process.

    ``Barrier(name, parties, action=None, timeout=None, *, client=None,
    namespace="rlocks", entry_lease=2.0)`` with ``client`` a ``redis.asyncio.Redis`` or
    ``RedisCluster`` (``None``: ``RLOCKS_URL``, a client per event loop). Same Redis
    state and semantics as :class:`rlocks.Barrier` of the same name: tasks and threads
    may be parties of one barrier. The running task is the party.

    Differences from ``asyncio.Barrier``: ``wait`` takes a ``timeout`` and the barrier a
    default one and an ``action`` (a plain callable, or an ``async def`` that is
    awaited), as in threading; ``n_waiting()`` and ``broken()`` are coroutines (each is
    a round trip), ``parties`` is a plain property. A task cancelled while it waits (or
    while its ``async`` action runs) breaks the barrier, as a time-out does, then the
    cancellation propagates: ``asyncio.Barrier`` instead takes it out of the count,
    which across processes could hand two parties one index.
    """

    __slots__ = ()

    _label = "rlocks.asyncio.Barrier"
    _aio = True

    @public_init
    def __init__(self, name: str, parties: int, action: Optional[Callable[[], Any]] = None,
                 timeout: Optional[float] = None, *, client: Any = None,
                 namespace: str = "rlocks", entry_lease: float = ENTRY_LEASE) -> None:
        super().__init__(name, parties, action, timeout, client, namespace, entry_lease)

    def _backend_of(self, client: Any) -> Any:
        return LoopDefault() if client is None else super()._backend_of(client)

    @property
    def client(self) -> Any:
        """The client this barrier talks to (with ``client=None``: this loop's default)."""
        if self._client is None:
            return self._backend.server().client
        return self._client

    async def wait(self, timeout: Optional[float] = None) -> int:
        """:meth:`rlocks.Barrier.wait` for the running task: returns the arrival index;
        BrokenBarrierError (also an ``asyncio.BrokenBarrierError``) when broken, reset or
        timed out. A cancelled wait breaks the barrier (if it had arrived), then
        re-raises CancelledError."""
        seconds = self._wait_seconds(timeout)
        with metrics.waits(self):
            turn = await adrive(self._wait(identity.task_owner(), seconds))
        if not turn.act:
            return int(turn.arrival)
        action = self._action
        assert action is not None
        try:
            result = action()
            if inspect.isawaitable(result):
                await result
        except BaseException:
            await adrive(self._finish(turn, False))
            raise
        return int(await adrive(self._finish(turn, True)))

    async def reset(self) -> None:
        """:meth:`rlocks.Barrier.reset`, awaited (one round trip)."""
        await adrive(self._reset(identity.task_owner()))

    async def abort(self) -> None:
        """:meth:`rlocks.Barrier.abort`, awaited (one round trip)."""
        await adrive(self._abort(identity.task_owner()))

    async def n_waiting(self) -> int:
        """How many parties wait in the generation filling now (0 while broken): a
        coroutine, as it is a round trip."""
        waiting, _broken = await adrive(self._peek(identity.task_owner()))
        return int(waiting)

    async def broken(self) -> bool:
        """Whether the barrier is broken: a coroutine, as it is a round trip."""
        _waiting, broken = await adrive(self._peek(identity.task_owner()))
        return bool(broken)
