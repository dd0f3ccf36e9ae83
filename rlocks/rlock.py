"""``rlocks.RLock``: ``threading.RLock`` across processes and hosts."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ._engine.constructors import public_init
from ._engine.primitive import ENTRY_LEASE, LockSpec, Options
from ._engine.state import PrimitiveState, statistics
from ._engine.surface import LockSurface

__all__ = ["RLock"]

_SPEC = LockSpec("rlock", "x")


class RLock(LockSurface):
    """A reentrant lock shared by every process that uses the same name and Redis.

    ``RLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None, replicas=0, replica_wait=1.0, fair=True,
    deadlock_timeout=1.0, entry_lease=2.0)``

    The owner is the calling *thread* (of this process, on this host): the thread that
    acquired may acquire again without blocking and must release as many times. Other
    threads, here or in other processes, wait. ``acquire``, ``release``, ``with``,
    ``locked`` and the ``threading.Condition`` protocol behave as in ``threading.RLock``;
    ``owned()`` (no I/O) and ``extend(ttl=None)`` are as redis-py's ``Lock`` has them
    (see their docstrings for the differences).

    - ``client``: a ``redis.Redis`` or ``redis.cluster.RedisCluster``; ``None`` uses
      ``RLOCKS_URL`` (default ``redis://localhost:6379/0``); or an
      :class:`rlocks.Quorum` of independent masters (a hold then needs a majority of
      them; waiters re-try instead of queueing: see docs/operations.md).
    - ``ttl``: the lease in seconds. A holder that dies stops blocking others at most
      ``ttl`` seconds later. While this process lives and keeps a reference to the lock,
      the lease is renewed about every ``ttl / 3`` (``auto_renew=False`` turns that off).
    - ``on_lost``: called as ``on_lost(lock)`` when a hold is found gone while this
      process still believes it holds it. It runs on rlocks' callback thread (one per
      process, one callback at a time), never on the renewal thread, so a slow callback
      does not delay other holds' renewal; exceptions are logged. An ``async def`` is
      refused (TypeError): only the ``rlocks.asyncio`` twins await it.
    - ``replicas``: after each grant and renewal, WAIT until that many replicas have it
      (at most ``replica_wait`` seconds, in the same round trip). A grant fewer replicas
      acknowledge is given back and :class:`~rlocks.errors.ReplicationError` is raised;
      a short renewal is logged. This narrows the failover window; it does not close it
      (see docs/operations.md). Not available on Redis Cluster clients.
    - ``fair``: ``True`` (the default) serves waiting threads of every process first
      come, first served: each waits in a queue on the server, a release wakes the oldest
      (a hint), and it takes the lock with its own acquire. ``False`` lets a free lock go
      to whoever asks first (the releasing thread may take it again at once) for up to
      100 ms after a release woke the oldest waiter, which has it first after that.
      Every process using the name must pass the same value. TypeError if not a bool.
    - ``entry_lease``: seconds (default 2.0) a waiting thread's place in the queue lives
      between its looks (it looks at least every third of it): a waiter that dies delays
      the next holder at most this long. TypeError/ValueError unless a number of
      seconds of at least 0.01.
    - ``deadlock_timeout``: after this many seconds of waiting (default 1.0), a blocking
      ``acquire`` checks, and checks again every ``deadlock_timeout``, whether it is part
      of a cycle of waits between RLocks and RWLock sides (any processes, any hosts);
      exactly one waiter of a cycle raises :class:`~rlocks.errors.DeadlockError` (it left
      the queue; its holds stay held). ``None`` turns detection off (a cycle through
      this object is then not seen). TypeError/ValueError for anything but a positive
      number of seconds or ``None``. See docs/deadlocks.md.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.RLock"

    @public_init
    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[[Any], object]] = None,
        replicas: int = 0,
        replica_wait: float = 1.0,
        fair: bool = True,
        deadlock_timeout: Optional[float] = 1.0,
        entry_lease: float = ENTRY_LEASE,
    ) -> None:
        self._configure(name, Options.of(locals()), "rlock", _SPEC)

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(self._backend.read(("EXISTS", self._keys.hash)))

    def statistics(self) -> PrimitiveState:
        """Holders, counts, leases and waiters, read from Redis now (a frozen dataclass,
        the same the ``rlocks`` command line prints). Redis errors propagate."""
        return statistics(self)
