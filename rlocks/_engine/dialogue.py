"""The two drivers of every I/O-free dialogue in the engine.

An operation that needs I/O (a script call with its NOSCRIPT recovery, an acquire through
the queue, a renewal batch, the wake-up hub's reader loop) is written once, as a generator
that yields each step it needs (a script call, a wait, a SUBSCRIBE, ...) and receives that
step's result, or has the exception the step raised thrown in at the ``yield``. The
threading surfaces run it with :func:`drive`, which blocks on each step; the asyncio
surfaces with :func:`adrive`, which awaits it. So a change to a wait policy or to error
handling is one edit in the dialogue, and the drivers only know how to perform a step.

Every exception a step raises goes back into the dialogue, ``BaseException`` included: an
interrupt or a cancellation raised while a step was in flight reaches the dialogue's
``except``/``finally`` (to give back a grant, close a connection) before it propagates
out of the driver, unless the dialogue handles it.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, Optional, TypeVar

__all__ = ["adrive", "drive", "stopped"]

Step = TypeVar("Step")
Result = TypeVar("Result")


def drive(steps: Generator[Step, Any, Result], perform: Callable[[Step], Any]) -> Result:
    """Run ``steps`` to its end, blocking in ``perform`` for each step; returns the
    dialogue's return value and raises what the dialogue raises."""
    got: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = steps.send(got) if error is None else steps.throw(error)
        except StopIteration as stop:
            result: Result = stop.value
            return result
        got = error = None
        try:
            got = perform(step)
        except BaseException as exc:  # noqa: BLE001 - thrown into the dialogue
            error = exc


async def adrive(
    steps: Generator[Step, Any, Result], perform: Callable[[Step], Awaitable[Any]]
) -> Result:
    """:func:`drive` for asyncio: each step is awaited (a cancellation while one is in
    flight is thrown into the dialogue like any other exception)."""
    got: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = steps.send(got) if error is None else steps.throw(error)
        except StopIteration as stop:
            result: Result = stop.value
            return result
        got = error = None
        try:
            got = await perform(step)
        except BaseException as exc:  # noqa: BLE001 - thrown into the dialogue
            error = exc


def stopped(runner: Optional[Any]) -> bool:
    """Whether ``runner``, the thread or asyncio task that drives a long-lived dialogue
    (a hub's reader, a renewer's loop), is not running: none yet, ended, or cancelled (a
    program's shutdown code may cancel every task of a loop that goes on running).
    Whoever needs it running then starts a new one."""
    if runner is None:
        return True
    done = getattr(runner, "done", None)
    if done is not None:
        return bool(done())
    return not runner.is_alive()
