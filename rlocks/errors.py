"""Exceptions raised by rlocks.

Every rlocks exception derives from :class:`RLocksError`. Misuse that ``threading`` reports
with ``RuntimeError`` raises a subclass that is *also* a ``RuntimeError``, so code written
for ``threading`` keeps catching what it caught before. Argument errors are plain
``TypeError`` / ``ValueError`` / ``OverflowError``, raised before any Redis call, exactly as
``threading`` raises them. Redis failures (``redis.exceptions.ConnectionError``,
``TimeoutError``, ...) pass through unchanged: they mean "we could not ask", which is a
different thing from "the answer was no".
"""

from __future__ import annotations

import asyncio
import threading
from typing import Optional, Tuple

__all__ = [
    "RLocksError",
    "NotOwnedError",
    "LockLostError",
    "UpgradeError",
    "ReplicationError",
    "DeadlockError",
    "BrokenBarrierError",
]


class RLocksError(Exception):
    """Root of every exception rlocks defines.

    ``name`` is the primitive's name (``None`` where no primitive is involved).
    """

    def __init__(self, message: str, *, name: Optional[str] = None) -> None:
        super().__init__(message)
        self.name = name


class NotOwnedError(RLocksError, RuntimeError):
    """The caller released (or waited on) something it does not hold.

    Raised where ``threading`` raises ``RuntimeError``: releasing an RLock another thread
    holds, or one nobody holds. Nothing in Redis was changed.
    """


class LockLostError(RLocksError, RuntimeError):
    """The caller held the primitive, but its hold is gone from Redis.

    The lease expired (the process stalled, renewal could not reach Redis, auto-renewal was
    off) or the key was deleted. Raised by ``release()`` in place of the release; whoever
    holds the primitive now was not touched. The local hold count still drops by one per
    ``release()``, so nested ``with`` blocks unwind normally.
    """


class UpgradeError(RLocksError, RuntimeError):
    """A thread that holds an RWLock's read side asked for its write side.

    Refused at once, without any I/O: two readers upgrading at the same time would each
    wait for the other forever. Release the read side first (or take the write side first
    and downgrade, which is allowed).
    """


class ReplicationError(RLocksError):
    """An acquire was granted, but fewer replicas than asked (``replicas=``) acknowledged
    it within ``replica_wait`` seconds.

    The grant was given back before this was raised: the caller holds nothing more than
    before. ``acknowledged`` and ``required`` say how many replicas answered and were asked.
    """

    def __init__(self, message: str, *, name: str, acknowledged: int, required: int) -> None:
        super().__init__(message, name=name)
        self.acknowledged = acknowledged
        self.required = required


class DeadlockError(RLocksError, RuntimeError):
    """A blocking acquire was part of a cycle of waits, and this waiter was chosen to
    break it (exactly one waiter of a cycle raises; the others keep waiting).

    The waiter left the queue before this was raised; what the owner already holds stays
    held, for its exception handler (or ``with`` blocks) to release, which lets the others
    proceed. ``cycle`` lists each owner of the cycle as ``(owner, holds, waits_for)``:
    owner id, the primitive of the cycle it holds and the one it waits for, both
    described as ``"RLock 'name'"`` / ``"RWLock 'name' (write)"``.
    """

    def __init__(
        self, message: str, *, name: str, cycle: Tuple[Tuple[str, str, str], ...]
    ) -> None:
        super().__init__(message, name=name)
        self.cycle = cycle


class BrokenBarrierError(RLocksError, threading.BrokenBarrierError, asyncio.BrokenBarrierError):
    """A Barrier's wait could not pass: the barrier is broken, or was reset, while the
    party waited, or was broken when it came (``abort()``, a party that timed out, was
    cancelled, or whose lease ended because its process died, an action that raised).

    Also a ``threading.BrokenBarrierError`` and an ``asyncio.BrokenBarrierError``, so code
    written for either keeps catching it. ``name`` is the barrier's name.
    """
