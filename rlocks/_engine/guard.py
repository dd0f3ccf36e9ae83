"""``async with lock.guard():``: a critical section that is stopped when its hold is lost.

A hold can be lost while its holder runs: the lease ran out while the process was
stopped, a failover dropped it, someone forced it. ``with lock:`` tells the holder at its
release, after the body has run on unprotected; ``on_lost`` tells a callback. A guard
stops the body instead: the task that entered it is cancelled as soon as this process
finds the hold lost (its renewer looks every third of the ``ttl``, so within a renewal
period of the loss; a grant elsewhere in this process that excludes it, at once), and
the ``async with`` raises :class:`~rlocks.errors.LockLostError` in place of the
cancellation. A cancellation from anyone else passes through unchanged.

Threads cannot be cancelled from outside, so the threading primitives offer the nearest
thing (:meth:`check`, :attr:`lost`): a worker looks when it can.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from . import checks
from .holds import Hold

__all__ = ["Guard"]


class Guard:
    """What ``lock.guard(timeout=None)`` returns (asyncio primitives)."""

    __slots__ = ("_prim", "_timeout", "_task", "_hold", "_body", "_fired", "_watch")

    def __init__(self, prim: Any, timeout: Optional[float]) -> None:
        if timeout is not None:  # TypeError / ValueError now, before any I/O
            checks.lock_wait(True, timeout, prim._label, prim._name)
        self._prim, self._timeout = prim, timeout
        self._task: Optional["asyncio.Task[Any]"] = None
        self._hold: Optional[Hold] = None
        self._body = self._fired = False

    async def __aenter__(self) -> Any:
        prim = self._prim
        if self._task is not None:
            raise RuntimeError(f"this guard of {prim._describe()} is in use: take a new "
                               "one, lock.guard(), for each async with")
        if not await prim.acquire(timeout=self._timeout):
            raise TimeoutError(f"{prim._describe()} was not acquired within "
                               f"{self._timeout} s")
        task = asyncio.current_task()
        assert task is not None  # (acquire needs one)
        loop = asyncio.get_running_loop()
        self._task, self._body, self._fired = task, True, False
        hold = self._hold = prim._current()

        def lost() -> None:  # from whichever thread found the loss
            try:
                loop.call_soon_threadsafe(self._stop)
            except RuntimeError:
                pass  # the loop is closed: no body runs any more

        self._watch = lost
        if hold is None or not hold.watch(lost):
            self._stop()  # lost already, between the grant and here
        return prim

    def _stop(self) -> None:
        """(On the loop.) Cancel the body, if it still runs."""
        if self._body and not self._fired and self._task is not None:
            self._fired = True
            self._task.cancel(f"{self._prim._describe()} was lost")

    async def __aexit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> None:
        prim, hold, task = self._prim, self._hold, self._task
        self._body = False
        if hold is not None:
            hold.unwatch(self._watch)
        self._task = None
        if not self._fired:
            await prim.__aexit__(exc_type, exc, tb)
            return
        assert task is not None
        task.uncancel()  # the guard's own request (taken back even if the body swallowed it)
        # Someone else cancelled the task too (a TaskGroup sibling failed, a shutdown):
        # that cancellation goes on, unchanged.
        external = task.cancelling() > 0
        try:
            await prim.release()  # owed still; a lost hold's raises LockLostError
        except Exception as error:  # noqa: BLE001 - the loss is what the caller hears
            if not external and getattr(error, "lock", None) is prim:
                raise error from None
        if external:
            if isinstance(exc, asyncio.CancelledError):
                raise exc
            raise asyncio.CancelledError()
        assert hold is not None
        raise prim._lost_error(hold) from None
