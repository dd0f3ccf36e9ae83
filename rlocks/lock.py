"""``rlocks.Lock``: ``threading.Lock`` across processes and hosts."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ._engine import checks, dialogues, identity
from ._engine.constructors import public_init, public_method
from ._engine.nonreentrant import ProcessOwned
from ._engine.primitive import ENTRY_LEASE, LockSpec, Options
from ._engine.state import PrimitiveState, statistics
from ._engine.steps import drive
from ._engine.surface import LockSurface, _repair

__all__ = ["Lock"]

_SPEC = LockSpec("rlock", "x", "lock")  # an RLock's scripts, under its own key kind


class Lock(ProcessOwned, LockSurface):
    """A lock that is not reentrant, shared by every process that uses the same name and
    Redis: ``threading.Lock`` across processes.

    ``Lock(name, *, client=None, ttl=30.0, auto_renew=True, namespace="rlocks",
    on_lost=None, replicas=0, replica_wait=1.0, fair=True, entry_lease=2.0)``: the
    keywords mean what they mean for :class:`rlocks.RLock`.

    As with ``threading.Lock``, a second ``acquire`` by the thread that holds it waits (or
    returns False with ``blocking=False`` or at its ``timeout``) until some thread
    releases it, and any thread *of the holding process* may release it. A process that
    does not hold it cannot release it: ``release()`` there raises RuntimeError
    (:class:`~rlocks.errors.NotOwnedError`) without I/O, as ``threading.Lock.release`` of
    an unlocked lock does (a process can only vouch for its own hold). Lease, renewal,
    the waiting queue, ``fair``, fencing tokens, ``on_lost``, ``extend``, ``check()`` and
    ``lost`` are the RLock's. There is no deadlock detection: a wait on a Lock is no proof
    of a cycle, since another thread may release it.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.Lock"

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
        entry_lease: float = ENTRY_LEASE,
    ) -> None:
        self._configure(name, Options.of(locals()), "lock", _SPEC)

    def _caller(self) -> str:
        return identity.thread_owner()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, waiting while anyone holds it, this thread included.

        Blocks while the lock is held when ``blocking`` is true, for at most ``timeout``
        seconds unless it is -1 (for ever). Returns True once held, False if it could not
        be had in time. Raises what ``threading.Lock.acquire`` raises for bad arguments,
        before any I/O; LockLostError if this object's hold was lost and is not released
        yet; a redis-py error only when Redis stayed unreachable until the deadline.
        """
        wait = checks.lock_wait(blocking, timeout, self._label, self._name)
        return self._acquire(self._asker(), 1, wait)

    acquire = public_method(acquire)
    __enter__ = acquire

    def release(self) -> None:
        """Release the lock, from any thread of the process that holds it.

        Raises RuntimeError (:class:`~rlocks.errors.NotOwnedError`) if this process holds
        it through no object of this name, without I/O; LockLostError if the hold had
        ended in Redis (whoever holds it now is not touched).
        """
        owner = self._releasing()
        obj = self._hold_object(owner)
        before = dialogues.books(obj, [owner])
        try:
            drive(dialogues.release(obj, owner))
        except BaseException as exc:
            _repair(obj, before, exc, False)
            raise

    def locked(self) -> bool:
        """Whether any owner, anywhere, holds the lock now (one round trip)."""
        return bool(self._backend.read(("EXISTS", self._keys.hash)))

    def statistics(self) -> PrimitiveState:
        """Holders, leases and waiters, read from Redis now (as :meth:`rlocks.RLock.statistics`)."""
        return statistics(self)

    # threading.Condition(lock) protocol: a Lock has no levels to save.
    def _release_save(self) -> Any:
        self.release()

    def _acquire_restore(self, state: Any) -> None:
        self.acquire()
