"""``rlocks.RLock``: ``threading.RLock`` across processes and hosts."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ._engine.primitive import Primitive
from ._engine.reentrant import ReentrantLock
from ._engine.scripts import Arg, load_queued

__all__ = ["RLock"]


class _RLockCore(Primitive):
    """What an RLock is, without I/O: its key kind, scripts and their arguments.

    Shared by :class:`RLock` and ``rlocks.asyncio.RLock``, which add their surfaces.
    """

    __slots__ = ()

    _kind = "rlock"
    _excludes = True
    _detects_deadlocks = True
    _acquire_script = load_queued("rlock_acquire")
    _release_script = load_queued("rlock_release")
    _renew_script = load_queued("rlock_renew")
    _leave_script = load_queued("rlock_leave")
    _quorum_refusal = None

    # -- script arguments (see the headers of the rlock_*.lua files) ---------------------

    def _acquire_arguments(
        self, owner: str, count: int, reentry: bool, entry: Optional[str], listen: bool = False
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        args = (owner, self._entry_id(entry), self._ttl_ms, count,
                1 if reentry else 0, self._queue_flag(entry, listen))
        return self._keys.queued(), (*self._context(), *args)

    def _release_arguments(self, owner: str, count: int) -> Tuple[Sequence[str], Sequence[Arg]]:
        return self._keys.queued(), (*self._context(), owner, count)

    def _leave_arguments(
        self, owner: str, entry: str, ask: Optional[Tuple[str, str, int]] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        args: Tuple[Arg, ...] = (owner, entry, "")
        if ask is not None:
            args = (owner, entry, ask[0], ask[2])
        return self._keys.queued(), (*self._context(), *args)

    def _renew_arguments(
        self, owner: str, lease_ms: Optional[int] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        call = self._items_call(self._renew_items(owner), lease_ms)
        return call.keys, call.args


class RLock(ReentrantLock, _RLockCore):
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
    - ``fair``: ``True`` (the default) serves waiters of every process first come, first
      served: they queue on the server and a release hands the lock to the oldest one in
      the same script, so it returns without another round trip. ``False`` lets a free
      lock go to whoever asks first (the releasing thread may take it again at once); a
      release then wakes one waiting process instead of granting it, and grants it at the
      first release after its patience (100 ms) ends. Every process using the name must
      pass the same value. TypeError if not a bool.
    - ``entry_lease``: seconds (default 2.0) a process's queue entry lives unless its
      renewer renews it (every third of it while a thread waits), and a hand-over grant
      lives until its process adopts it: a waiting process that dies, or dies just after
      being handed the lock, delays the next holder at most this long. A shorter one
      bounds that stall at the price of more renewals. A handed waiter leaves the
      adoption of its grant to its renewer only while max(1 s, two thirds of this) of
      the grant's lease is left; otherwise (always at 1 s or less) it adopts it before
      returning (one round trip). TypeError/ValueError unless a number of seconds >= 0.01.
    - ``deadlock_timeout``: after this many seconds of waiting (default 1.0), a blocking
      ``acquire`` checks, and checks again every ``deadlock_timeout``, whether it is part
      of a cycle of waits between RLocks and RWLock sides (any processes, any hosts);
      exactly one waiter of a cycle raises :class:`~rlocks.errors.DeadlockError` (it left
      the queue; its holds stay held). ``None`` turns detection off (a cycle through
      this object is then not seen). TypeError/ValueError for anything but a positive
      number of seconds or ``None``. See the README, "Deadlock detection".

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.RLock"

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(self._client.exists(self._keys.hash))
