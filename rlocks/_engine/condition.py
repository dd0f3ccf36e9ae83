"""The distributed Condition: waiters in Redis, notifications that survive lost wake-ups
and dead waiters.

A Condition belongs to one lock (an RLock, or an RWLock's write side) and keeps its
waiters in one sorted set next to the lock's hash (``lua/cond_lib.lua``): every process
that builds a Condition on a lock of that name (and condition ``name``) uses the same set,
so ``notify`` reaches waiters everywhere, oldest first.

``wait`` does what ``threading.Condition.wait`` does: join the set while still holding
the lock (a notify made once the lock is let go cannot miss the entry), give up the
lock's levels, wait, take them back, end its entry. ``notify`` marks the oldest entries
notified in one script and sends each waiter's process a wake-up hint; the mark is the
notification, so a lost hint costs a delay (a waiter looks at its entry at least every
third of the lock's ``ttl``, renewing its lease), never a lost notification. An entry
whose lease ends (its process died) is dropped by the next script, and a notification it
had goes to the next waiter. A notified entry stays until its waiter has the lock back,
so a waiter that dies while taking the lock back passes its notification on as well (a
take-back longer than the ``ttl`` does too: a spurious wake-up for the next waiter, which
the Condition protocol allows; never a lost one).

The wait is one dialogue (:func:`wait`) for both drivers.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Generator, Optional, Tuple, TypeVar

from ..errors import NotOwnedError
from . import checks, dialogues, wakeups
from .clients import encoding_of
from .clock import monotonic
from .dialogues import acquire_restore, check_restorable, release_save
from .scripts import Call, load
from .steps import Enlist, Interrupted, Listen, call, transient

__all__ = ["ConditionCore", "wait_for_steps"]

T = TypeVar("T")
Steps = Generator[Any, Any, Any]

_ENTER = load("cond_enter", "cond_lib")
_CHECK = load("cond_check", "cond_lib")
_NOTIFY = load("cond_notify", "cond_lib")
_LEAVE = load("cond_leave", "cond_lib")


class ConditionCore:
    """What both Condition surfaces share: the lock, the key, the checks, the dialogues."""

    __slots__ = ("_lock", "_name", "_key", "__weakref__")

    _lock: Any

    _label = "rlocks.Condition"
    _accepts: Tuple[type, ...] = ()
    _accepted = ""

    def __init__(self, lock: Any, name: Optional[str] = None) -> None:
        accepted = isinstance(lock, self._accepts)  # (not narrowing lock's type: Any)
        if not accepted:
            raise TypeError(
                f"{self._label}: lock must be {self._accepted}, not {type(lock).__name__}")
        if not lock._backend.queues:
            raise ValueError(
                f"{self._label}: the lock {lock._describe()} runs on a Quorum, and a "
                "Condition keeps its waiters on one server (a quorum of queues is not "
                "built): use a lock on a single server or a Redis Cluster")
        if name is not None:
            label = f"{self._label}({lock._shown})"
            name = checks.check_name(name, label)
            if lock._client is not None:
                checks.check_wire_names({"name": name}, [encoding_of(lock._client)], label)
        self._lock = lock
        self._name: Optional[str] = name
        self._key = lock._keys.condition("" if name is None else name)

    @property
    def lock(self) -> Any:
        """The lock this condition was built on."""
        return self._lock

    @property
    def name(self) -> Optional[str]:
        """The condition's name among its lock's conditions (``None``: the default one)."""
        return self._name

    def __repr__(self) -> str:
        named = "" if self._name is None else f" name={checks.shown(self._name)}"
        return f"<{self._label}{named} of {self._lock!r}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cannot pickle or copy {self._label!r} object: its lock's holds "
                        "belong to this process; build another Condition on a lock of the "
                        "same name instead")

    def _describe(self) -> str:
        return f"{self._label}({self._lock._name!r})"

    def _check_owned(self, what: str) -> None:
        if not self._lock._is_owned():
            raise NotOwnedError(f"cannot {what} on un-acquired lock ({self._describe()})",
                                name=self._lock._name)

    def _call(self, script: Any, owner: str, *more: Any) -> Call:
        return Call(script, (self._key,), (owner, self._lock._keys.wake, *more))

    def _notify_count(self, n: object) -> int:
        self._check_owned("notify")
        try:
            count = operator.index(n)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"{self._describe()}: n must be an int, not {type(n).__name__}") from None
        if count < 0:
            raise ValueError(f"{self._describe()}: n must be >= 0, got {count}")
        return count

    def _notify(self, n: int) -> Steps:
        """Notify ``n`` waiters (-1: all); nothing for 0."""
        if n == 0:
            return None
        lock = self._lock
        reply = yield from call(lock._backend, self._call(_NOTIFY, "", max(n, 0)), None)
        wakeups.wake_local(self._key, reply.woken)
        return None

    def _leave(self, owner: str, mode: str) -> Steps:
        """``cond_leave`` (``mode``: '1' pass a notification on, '0' it was used, '2' leave
        unless notified), sent again after a broken link for a while; its reply (None: no
        answer, the entry then ends with its lease)."""
        lock = self._lock
        try:
            return (yield from call(lock._backend, self._call(_LEAVE, owner, mode),
                                    monotonic() + dialogues.RELEASE_PATIENCE))
        except BaseException as exc:  # noqa: BLE001 - best effort
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            return None

    def _wait(self, timeout: object) -> Steps:
        """The wait dialogue; returns whether it was notified (or its entry was gone).

        Every way out passes on a notification the waiter will not use and leaves the
        lock held (as threading's wait), but for an interrupt while it takes the lock
        back (then the notification goes on, and the lock is not held)."""
        self._check_owned("wait")
        lock = self._lock
        owner = lock._owner()
        seconds = checks.semaphore_wait(True, timeout, self._label, lock._name)
        check_restorable(lock, owner)  # before any I/O: it changes nothing
        deadline = None if seconds is None else monotonic() + seconds
        backend, lease = lock._backend, lock._ttl_ms
        try:
            yield from call(backend, self._call(_ENTER, owner, lease), None)
        except Interrupted as interrupt:
            if interrupt.reply is not None:  # it joined: it leaves
                yield from self._leave(owner, "1")
            raise interrupt.cause from None
        try:
            state = yield from release_save(lock, owner)
        except BaseException as exc:
            yield from self._leave(owner, "1")  # (a lost lock, or an interrupt: it goes)
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            raise
        notified = used = False
        waiter: Any = None
        try:
            waiter = yield Enlist(backend, lock._keys.wake, self._key, owner, deadline)
            while True:
                reply = yield from call(backend, self._call(_CHECK, owner, lease), deadline)
                if reply.status != 0:
                    # 1: notified. -1: its entry is gone (it stalled past its lease): it
                    # cannot know whether it missed a notify, so a spurious wake-up.
                    notified, used = True, reply.status == 1
                    break
                now = monotonic()
                if deadline is not None and now >= deadline:
                    # Out of time: it leaves, unless a notify took its entry just now (it
                    # then uses that notification, kept until it has the lock back).
                    left = yield from self._leave(owner, "2")
                    notified = used = left is not None and left.status == 1
                    break
                pause = lease / 3000.0
                yield Listen(waiter, pause if deadline is None else min(pause, deadline - now))
        except BaseException as exc:
            # Interrupted (or Redis unreachable past the deadline): leave, passing on a
            # notification it had, then take the lock back, as threading's wait does.
            yield from self._leave(owner, "1")
            yield from acquire_restore(lock, owner, state)
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            if transient(exc) and deadline is not None and monotonic() >= deadline:
                return False  # its time ran out while Redis was away: a time-out
            raise
        finally:
            if waiter is not None:
                waiter.close()
        # Its notified entry is renewed while it waits for the lock (a notifier may hold
        # it longer than the entry's lease), and used only once the lock is back.
        keep = (self._call(_CHECK, owner, lease), lease / 3000.0) if used else None
        try:
            yield from acquire_restore(lock, owner, state, keep)
        except BaseException:
            if used:
                yield from self._leave(owner, "1")  # it will not act on it: it goes on
            raise
        if used:
            yield from self._leave(owner, "0")
        return notified


def wait_for_steps(predicate: Callable[[], T], timeout: Optional[float]
                   ) -> Generator[Optional[float], None, T]:
    """``threading.Condition.wait_for``'s loop: yields each ``wait`` timeout to make, and
    returns the predicate's last value (true, or whatever it was when time ran out)."""
    endtime: Optional[float] = None
    waittime = timeout
    result = predicate()
    while not result:
        if waittime is not None:
            if endtime is None:
                endtime = monotonic() + waittime
            else:
                waittime = endtime - monotonic()
                if waittime <= 0:
                    break
        yield waittime
        result = predicate()
    return result
