"""``rlocks.acquire_all``: several primitives at once, all or none, without deadlock."""

from __future__ import annotations

from typing import Any, Generator, List, Optional, Tuple

from ._engine.multi import Give, Take, check_all, give_all, take_all

__all__ = ["Holding", "acquire_all"]


def _run(steps: Generator[Any, Any, Any]) -> Any:
    """The blocking driver of :mod:`rlocks._engine.multi`'s steps."""
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
                value = (p.acquire(blocking=False) if wait == 0 else
                         p.acquire() if wait is None else p.acquire(timeout=wait))
            else:
                assert type(step) is Give
                value = step.prim.release()
        except BaseException as exc:  # noqa: BLE001 - the steps decide
            error = exc


class Holding:
    """What :func:`acquire_all` returns: true if it took them all. As a ``with``, it
    raises TimeoutError at entry if it did not, and gives them all back at exit."""

    __slots__ = ("_taken", "_wanted", "_wait")

    def __init__(self, taken: List[Any], wanted: List[Any], wait: Optional[float]) -> None:
        self._taken, self._wanted, self._wait = taken, wanted, wait

    def __bool__(self) -> bool:
        return bool(self._taken)

    @property
    def primitives(self) -> Tuple[Any, ...]:
        """The primitives held, in the order they were taken (empty if none)."""
        return tuple(self._taken)

    def release(self) -> None:
        """Give each back, the last taken first (each one's ``release``); all are given
        back even if one raises (LockLostError for a lost one), then the first error is
        raised. RuntimeError if nothing is held."""
        if not self._taken:
            raise RuntimeError("release of an acquire_all that holds nothing")
        taken, self._taken = self._taken, []
        _run(give_all(taken))

    def __enter__(self) -> "Holding":
        if not self._taken:
            names = ", ".join(p._describe() for p in self._wanted)
            raise TimeoutError(f"rlocks.acquire_all: not all of {names} could be had "
                               f"within {self._wait} s; none is held")
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        taken, self._taken = self._taken, []
        first: Optional[BaseException] = None
        for p in reversed(taken):
            try:
                p.__exit__(exc_type, exc, tb)
            except Exception as error:  # noqa: BLE001 - the others are given back first
                first = first or error
        if first is not None:
            raise first


def acquire_all(*primitives: Any, blocking: bool = True,
                timeout: Optional[float] = None) -> Holding:
    """Acquire every one of ``primitives`` (rlocks locks, RWLock sides, semaphores, of
    any servers) for the calling thread, or none of them.

    They are taken one by one in an order every process shares (their Redis keys), so
    two ``acquire_all`` calls of overlapping sets, in any order of arguments, never
    deadlock: see :mod:`rlocks._engine.multi`. Waits at most ``timeout`` seconds in all
    (None: for ever; ``blocking=False``: no waiting). Returns a :class:`Holding`, true
    if it holds them all; false, it gave back what it took. Used as ``with
    rlocks.acquire_all(a, b, timeout=5):`` it raises TimeoutError instead of entering,
    and gives them all back at exit. TypeError / ValueError before any I/O for what is
    not an rlocks primitive (or is an asyncio one), a primitive named twice, a bad
    timeout. An error while taking them gives back what was taken, then propagates."""
    ordered, wait = check_all(primitives, blocking, timeout, aio=False)
    return Holding(_run(take_all(ordered, wait)), ordered, timeout)
