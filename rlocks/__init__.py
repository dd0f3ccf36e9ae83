"""rlocks: distributed, reentrant, thread-aware locks on Redis with the ``threading`` API.

``rlocks.RLock`` behaves like ``threading.RLock`` for every thread of every process that
uses the same Redis and name. See docs/threading.md for the semantics (leases, renewal,
lost holds, fork, cluster) and the differences from ``threading``.
"""

import logging

from ._engine.quorum import Quorum
from .barrier import Barrier
from .condition import Condition
from .decorators import limited, synchronized
from .errors import (
    BrokenBarrierError,
    DeadlockError,
    LockLostError,
    NotOwnedError,
    RLocksError,
    UpgradeError,
)
from .event import Event
from .lock import Lock
from .multi import acquire_all
from .rlock import RLock
from .rwlock import RWLock
from .semaphore import BoundedSemaphore, Semaphore

__version__ = "0.1.0"

# A library says nothing unless the program configures logging (the logging HOWTO's rule
# for libraries): without a handler here, WARNING records such as "lost" would reach
# stderr through logging.lastResort in programs that never asked for them.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "RLock",
    "Lock",
    "RWLock",
    "Quorum",
    "Semaphore",
    "BoundedSemaphore",
    "Condition",
    "Event",
    "Barrier",
    "RLocksError",
    "NotOwnedError",
    "LockLostError",
    "UpgradeError",
    "DeadlockError",
    "BrokenBarrierError",
    "acquire_all",
    "synchronized",
    "limited",
    "__version__",
]
