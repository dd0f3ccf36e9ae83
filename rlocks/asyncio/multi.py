"""``rlocks.asyncio.acquire_all``: the asyncio twin of :func:`rlocks.acquire_all`."""

from __future__ import annotations

from typing import Any, Generator, List, Optional, Tuple

from .._engine.multi import Give, Take, check_all, give_all, take_all

__all__ = ["Holding", "acquire_all"]


async def _run(steps: Generator[Any, Any, Any]) -> Any:
    """The awaited driver of :mod:`rlocks._engine.multi`'s steps."""
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            if type(step) is Take:
                p, wait = step
                value = await (p.acquire(blocking=False) if wait == 0 else
                               p.acquire() if wait is None else p.acquire(timeout=wait))
            else:
                assert type(step) is Give
                value = await step.prim.release()
        except BaseException as exc:  # noqa: BLE001 - the steps decide
            error = exc


class Holding:
    """What :func:`acquire_all` returns: ``await`` it to take them all (it is then true
    if it did), or ``async with`` it (TimeoutError at entry if not all could be had;
    all given back at exit)."""

    __slots__ = ("_taken", "_wanted", "_wait", "_done", "_timeout")

    def __init__(self, wanted: List[Any], wait: Optional[float],
                 timeout: Optional[float]) -> None:
        self._wanted, self._wait = wanted, wait
        self._taken: List[Any] = []
        self._done = False
        self._timeout = timeout

    async def _take(self) -> "Holding":
        if self._done:
            raise RuntimeError("this acquire_all was awaited already: call it again")
        self._done = True
        self._taken = await _run(take_all(self._wanted, self._wait))
        return self

    def __await__(self) -> Generator[Any, None, "Holding"]:
        return self._take().__await__()

    def __bool__(self) -> bool:
        return bool(self._taken)

    @property
    def primitives(self) -> Tuple[Any, ...]:
        return tuple(self._taken)

    async def release(self) -> None:
        """As :meth:`rlocks.multi.Holding.release`, awaited."""
        if not self._taken:
            raise RuntimeError("release of an acquire_all that holds nothing")
        taken, self._taken = self._taken, []
        await _run(give_all(taken))

    async def __aenter__(self) -> "Holding":
        if not self._done:
            await self._take()
        if not self._taken:
            names = ", ".join(p._describe() for p in self._wanted)
            raise TimeoutError(f"rlocks.asyncio.acquire_all: not all of {names} could be "
                               f"had within {self._timeout} s; none is held")
        return self

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        taken, self._taken = self._taken, []
        first: Optional[BaseException] = None
        for p in reversed(taken):
            try:
                await p.__aexit__(exc_type, exc, tb)
            except Exception as error:  # noqa: BLE001 - the others are given back first
                first = first or error
        if first is not None:
            raise first


def acquire_all(*primitives: Any, blocking: bool = True,
                timeout: Optional[float] = None) -> Holding:
    """As :func:`rlocks.acquire_all`, for the running task: ``if await
    rlocks.asyncio.acquire_all(a, b, timeout=5): ...`` or ``async with
    rlocks.asyncio.acquire_all(a, b):``. Arguments are checked at the call, before any
    I/O. A task cancelled while taking them gives back what it took."""
    ordered, wait = check_all(primitives, blocking, timeout, aio=True,
                              label="rlocks.asyncio.acquire_all")
    return Holding(ordered, wait, timeout)
