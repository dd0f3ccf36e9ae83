"""``rlocks.Event``: ``threading.Event`` across processes and hosts."""

from __future__ import annotations

from typing import Any, Optional

from ._engine import metrics
from ._engine.constructors import public_init
from ._engine.event import ENTRY_LEASE, EventCore
from ._engine.steps import drive

__all__ = ["Event"]


class Event(EventCore):
    """A flag shared by every process that uses the same Redis, namespace and name.

    ``Event(name, *, client=None, namespace="rlocks", entry_lease=2.0)``: ``client`` a
    ``redis.Redis`` or ``redis.cluster.RedisCluster`` (``None``: ``RLOCKS_URL``, else
    ``redis://localhost:6379/0``; a Quorum is refused: ValueError); ``entry_lease``
    (seconds, >= 0.01) is how long a waiter's entry in Redis lives between its looks, so
    a waiter whose process died is forgotten within it. Every ``Event`` of the same name
    and namespace, in any process, is the same Event. Construction does no I/O; bad
    arguments are a TypeError / ValueError naming the Event.

    ``set``, ``clear``, ``is_set`` and ``wait`` behave as ``threading.Event``'s, for the
    threads of every process: a ``wait`` anywhere returns True as soon as any process
    sets the Event (a set that comes while the wait starts is never missed, and a set
    followed at once by a ``clear`` still wakes every waiter it found).

    Lifetime: a set Event is a key without expiry until ``clear()`` (which deletes it);
    a clear Event nobody waits on has no key. A Redis that restarts without persistence
    (or fails over before replicating) forgets a set, as it forgets a lock's holds.
    """

    __slots__ = ()

    _label = "rlocks.Event"

    @public_init
    def __init__(self, name: str, *, client: Any = None, namespace: str = "rlocks",
                 entry_lease: float = ENTRY_LEASE) -> None:
        self._configure(name, client, namespace, entry_lease)

    # -- threading.Event ------------------------------------------------------------------

    def is_set(self) -> bool:
        """Whether the Event is set now, by any process (one read of Redis; its errors
        propagate)."""
        return bool(drive(self._is_set()))

    def set(self) -> None:
        """Set the Event: every thread waiting on it, in any process, wakes and returns
        True; later waits return at once until ``clear()``. One round trip (nothing
        changes if it is set already); sent again after a broken link for up to 5 s,
        then the Redis error propagates.

        In Redis: the flag's hash is made (no expiry), each waiter's entry is marked
        told, and each waiter's process gets a wake-up hint."""
        drive(self._set())

    def clear(self) -> None:
        """Clear the Event: later waits block until the next ``set()``. Waiters a
        ``set()`` already told still return True. One round trip (sent again after a
        broken link for up to 5 s).

        In Redis: the flag's hash is deleted; so are entries of dead waiters, so a cleared
        Event nobody waits on leaves no key."""
        drive(self._clear())

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the Event is set (by any process) or ``timeout`` seconds passed
        (``None``: no limit; 0 or negative: just look, one read). Returns True if it was
        set, or a ``set()`` came while this thread waited (even if a ``clear()`` followed
        before it woke), else False: as ``threading.Event.wait``.

        A bad ``timeout`` is a TypeError, a ValueError (NaN) or an OverflowError (above
        ``threading.TIMEOUT_MAX``), before any I/O. Blocks through a Redis outage until
        the time-out (then False). A wait that reaches Redis no more for longer than
        ``entry_lease`` (its process frozen, the link cut) may miss a set that was cleared
        again before it looked.

        In Redis: an entry in the Event's waiters while it waits (renewed every third of
        ``entry_lease``), removed when it returns. Three round trips when it waits and is
        woken: register, look again, leave.
        """
        seconds = self._seconds(timeout)
        if seconds == 0:  # (a look: no wait to count)
            return bool(drive(self._wait(self._owner(), seconds)))
        with metrics.waits(self):
            return bool(drive(self._wait(self._owner(), seconds)))
