"""``rlocks.RLock``: ``threading.RLock`` across processes and hosts."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable, Optional, Sequence, Tuple, Type

from ._engine import checks, identity
from ._engine.primitive import Primitive
from ._engine.scripts import Arg, load
from .errors import LockLostError, NotOwnedError

__all__ = ["RLock"]


class RLock(Primitive):
    """A reentrant lock shared by every process that uses the same name and Redis.

    ``RLock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None)``

    The owner is the calling *thread* (of this process, on this host): the thread that
    acquired may acquire again without blocking and must release as many times. Other
    threads, here or in other processes, wait.

    - ``client``: a ``redis.Redis`` or ``redis.cluster.RedisCluster``; ``None`` uses
      ``RLOCKS_URL`` (default ``redis://localhost:6379/0``).
    - ``ttl``: the lease in seconds. A holder that dies stops blocking others at most
      ``ttl`` seconds later. While this process lives and keeps a reference to the lock,
      the lease is renewed about every ``ttl / 3`` (``auto_renew=False`` turns that off).
    - ``on_lost``: called as ``on_lost(lock)``, from the renewal thread, when a hold is
      found gone while this process still believes it holds it.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.RLock"
    _kind = "rlock"
    _acquire_script = load("rlock_acquire")
    _release_script = load("rlock_release")
    _renew_script = load("rlock_renew")

    def __init__(
        self,
        name: str,
        *,
        client: Any = None,
        ttl: float = 30.0,
        auto_renew: bool = True,
        namespace: str = "rlocks",
        on_lost: Optional[Callable[["RLock"], object]] = None,
    ) -> None:
        super().__init__(
            name,
            client=client,
            ttl=ttl,
            auto_renew=auto_renew,
            namespace=namespace,
            on_lost=on_lost,
        )

    # -- script arguments (see the headers of the rlock_*.lua files) ---------------------

    def _acquire_arguments(self, owner: str, count: int) -> Tuple[Sequence[str], Sequence[Arg]]:
        reentry = 1 if self._held(owner) > 0 else 0
        return (self._keys.hash,), (owner, self._ttl_ms, count, reentry)

    def _release_arguments(
        self, owner: str, count: int, everything: bool
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        keys = (self._keys.hash, self._keys.channel)
        return keys, (owner, count, 1 if everything else 0, self._publish)

    def _renew_arguments(self, owner: str) -> Tuple[Sequence[str], Sequence[Arg]]:
        return (self._keys.hash,), (owner, self._ttl_ms)

    # -- the threading.RLock surface -----------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, or re-enter it if the calling thread holds it already.

        Blocks until the lock is free when ``blocking`` is true, for at most ``timeout``
        seconds unless it is -1 (forever). Returns True once held, False if it could not
        be had in time. Re-entry returns True at once (one round trip, which also renews
        the lease).

        Raises what ``threading.RLock.acquire`` raises for bad arguments (ValueError,
        OverflowError, TypeError) before touching Redis; LockLostError if this thread's
        earlier hold was lost and not yet released; redis-py errors if Redis cannot be
        reached (a blocked call then returns or raises within its timeout plus the
        client's socket timeout).

        In Redis: adds one to this thread's count in the lock's hash and resets its lease.
        """
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return self._take(identity.thread_owner(), 1, wait)

    def release(self) -> None:
        """Release one level of the calling thread's hold; at the last, free the lock.

        Raises RuntimeError (:class:`~rlocks.errors.NotOwnedError`) if the calling thread
        does not hold the lock, without any I/O; :class:`~rlocks.errors.LockLostError` if
        the hold had already ended in Redis (lease expired, key deleted): whoever holds it
        now is not touched. Freeing the lock wakes one waiter per waiting process.
        """
        self._give_back(identity.thread_owner(), 1)

    __enter__ = acquire

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if isinstance(exc, LockLostError) and getattr(exc, "lock", None) is self:
            # An inner block already reported this lock lost: unwind our level quietly
            # instead of raising the same news a second time.
            self._record_release(identity.thread_owner(), 1)
            return
        self.release()

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(self._client.exists(self._keys.hash))

    # -- threading.Condition protocol (same names and contracts as threading.RLock) ------

    def _is_owned(self) -> bool:
        """Whether the calling thread holds the lock (local knowledge, no I/O)."""
        return self._held(identity.thread_owner()) > 0

    def _recursion_count(self) -> int:
        """How many times the calling thread holds the lock (no I/O)."""
        return self._held(identity.thread_owner())

    def _release_save(self) -> Tuple[int, str]:
        """Release every level of the calling thread's hold; return what restores it."""
        owner = identity.thread_owner()
        count = self._held(owner)
        if count == 0:
            raise NotOwnedError(
                f"cannot release un-acquired lock {self._describe()}", name=self._name
            )
        # Every level in Redis, not only this object's: a Condition must really let go.
        self._give_back(owner, count, everything=True)
        return count, owner

    def _acquire_restore(self, state: Tuple[int, str]) -> None:
        """Re-acquire, blocking, the levels ``_release_save`` gave back."""
        count, _owner = state
        self._take(identity.thread_owner(), count, None)

    # -- introspection -------------------------------------------------------------------

    def __repr__(self) -> str:
        # Local truth only: no I/O in a repr. "held" means held by a thread of this process.
        owners = self._local_owners()
        if owners:
            owner, count = owners[0]
            state = f"held owner={owner!r} count={count}"
        else:
            state = "not held here"
        return (
            f"<{self._label} name={self._name!r} namespace={self._namespace!r} "
            f"{state} at {id(self):#x}>"
        )
