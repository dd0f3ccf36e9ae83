"""rlocks: distributed, reentrant, thread-aware locks on Redis with the ``threading`` API.

``rlocks.RLock`` behaves like ``threading.RLock`` for every thread of every process that
uses the same Redis and name. See the README for semantics (leases, renewal, lost holds,
fork, cluster) and the differences from ``threading``.
"""

from .decorators import limited, synchronized
from .errors import LockLostError, NotOwnedError, RLocksError, UpgradeError
from .rlock import RLock
from .rwlock import RWLock
from .semaphore import BoundedSemaphore, Semaphore

__version__ = "0.1.0"

__all__ = [
    "RLock",
    "RWLock",
    "Semaphore",
    "BoundedSemaphore",
    "RLocksError",
    "NotOwnedError",
    "LockLostError",
    "UpgradeError",
    "synchronized",
    "limited",
    "__version__",
]
