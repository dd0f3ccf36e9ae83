"""asyncio twins of the rlocks primitives, over ``redis.asyncio``.

``rlocks.asyncio.RLock``, ``Lock``, ``RWLock``, ``Semaphore``, ``BoundedSemaphore``,
``Event`` and ``Barrier`` (and ``acquire_all``) share their Redis state, scripts and
semantics with the synchronous ones (an asyncio RLock and a threading RLock of the same
name are one lock), with the running **task** as owner of a lock hold. Every method that
talks to Redis is a coroutine: ``await lock.acquire()``, ``await lock.release()``, ``await
lock.locked()``, ``async with lock:``.

Differences from ``asyncio.Lock`` / ``asyncio.Semaphore``: ``release()`` and ``locked()``
are coroutines (they are round trips); ``acquire`` also takes ``blocking`` and ``timeout``;
locks are reentrant per task; ``asyncio.Condition`` cannot use them (it needs a
synchronous ``release``): ``rlocks.asyncio.Condition`` can, and notifies every process.
Use each primitive object from one event loop.

Closing: a primitive given a ``redis.asyncio`` client uses that client only (rlocks opens
no pool of its own for it), so ``await client.aclose()`` closes everything. Primitives
made with ``client=None`` share a client per event loop that rlocks opened: close it with
``await rlocks.asyncio.aclose()`` before the loop ends.
"""

from .._engine.surface import aclose
from .barrier import Barrier
from .condition import Condition
from .event import Event
from .lock import Lock
from .multi import acquire_all
from .rlock import RLock
from .rwlock import ReadLock, RWLock, WriteLock
from .semaphore import BoundedSemaphore, Semaphore

__all__ = ["RLock", "Lock", "RWLock", "ReadLock", "WriteLock", "Semaphore", "BoundedSemaphore",
           "Condition", "Event", "Barrier", "acquire_all", "aclose"]
