"""``rlocks.Semaphore`` and ``rlocks.BoundedSemaphore``: ``threading``'s semaphores across
processes and hosts.

One Redis hash per semaphore (layout in ``_engine/lua/sem_lib.lua``): the value, the
initial value and kind, and the permits each owner holds under its own lease.

Whose permits
-------------
A permit is accounted to the *thread* (asyncio: the task) that took it, in Redis and in
the local books, each thread's under its own lease. So a loss (a lease that ended during a
stall, ``rlocks release --force``) is found per thread: by that thread's renewal, by its
release, or by its next grant, which then sees fewer permits in Redis than it was granted
before plus the new one. A grant never lands in a record whose earlier permits are gone,
and one thread's fresh permit is never taken to cover another thread's lost one. (One
record per process could not tell "my permit" from "a permit of this process": a loss
followed by another thread's grant looked like no loss at all.)

``threading.Semaphore`` lets any thread release a permit another thread took, and so does
this: a release gives back the caller's own permits first, then permits other threads of
this process took through this object (the thread whose permit was released holds one
fewer). Only what is left after that is a release of nobody's permit: threading's counter
model, which a Semaphore allows (its value grows) and a BoundedSemaphore refuses with
ValueError whenever it would put more than ``value`` permits in circulation (free plus held
by live owners, in any process), so a process that holds nothing cannot release another
process's permit and let a third caller in while the holder still works.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

from ._engine.checks import shown
from ._engine.constructors import public_init
from ._engine.primitive import ENTRY_LEASE, Options, PermitSpec, Primitive
from ._engine.state import PrimitiveState, statistics
from ._engine.surface import PermitSurface

__all__ = ["Semaphore", "BoundedSemaphore"]

# Lua numbers are doubles: counts above 2**53 would silently lose precision.
_COUNT_MAX = 2**53 - 1


def _count(value: object, what: str, label: str) -> int:
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{label}: {what} must be an int, not {type(value).__name__}") from None
    if number > _COUNT_MAX:
        raise ValueError(f"{label}: {what} must be at most 2**53 - 1, got {number}")
    return number


class SemaphoreCore(Primitive):
    """What both surfaces of a semaphore share: its value and kind."""

    __slots__ = ()

    _label = "rlocks.Semaphore"
    _bounded = False
    _quorum_refusal = (
        "a semaphore cannot run on a quorum: majorities of per-master counts do not bound "
        "the total (3 masters allowing 2 each grant 3 holders on {A,B}, {B,C} and {A,C})"
    )

    @public_init
    def __init__(
        self,
        name: str,
        value: int = 1,
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
        label = f"{self._label}({shown(name)})"
        value = _count(value, "value", label)
        if value < 0:
            raise ValueError(f"{label}: semaphore initial value must be >= 0, got {value}")
        self._configure(name, Options.of(locals()), "sem", PermitSpec(value, self._bounded))

    @property
    def value(self) -> int:
        """The initial value this object was built with (no I/O)."""
        return int(self._spec.value)

    def __repr__(self) -> str:
        held = sum(n for _, n in self._mine.values())
        return (f"<{self._label} name={self._shown} namespace={self._namespace!r} "
                f"value={self.value} held here={held} at {id(self):#x}>")


class Semaphore(SemaphoreCore, PermitSurface):
    """A counting semaphore shared by every process that uses the same name and Redis.

    ``Semaphore(name, value=1, *, client=None, ttl=30.0, auto_renew=True,
    namespace="rlocks", on_lost=None, replicas=0, replica_wait=1.0, fair=True,
    entry_lease=2.0)``

    Like ``threading.Semaphore``: ``acquire()`` takes a permit, waiting while none is
    free; ``release(n)`` gives ``n`` back, and any thread may release: its own permits
    first, then permits other threads of this process took through this object, and
    the rest add to the free count (an unbounded semaphore's value grows past its initial
    value exactly as ``threading``'s does; a process holding nothing may release too).

    Each permit is accounted to the thread that took it, under that thread's lease:
    while this process lives and keeps a reference to the semaphore, the lease is renewed
    about every ``ttl / 3``; when the process dies the permits come back to the pool at
    most ``ttl`` after the last renewal (a BoundedSemaphore never goes above its initial
    value, recovery included). A lost permit (lease ended during a stall, ``rlocks
    release --force``) is reported to the thread that took it (``on_lost``, then
    LockLostError from its next ``release()`` or ``acquire()``), never hidden by a
    later grant to another thread.

    The initial ``value`` (and whether the semaphore is bounded) is stored in Redis by the
    first operation that leaves state there. Every later operation, from any process,
    checks its own ``value`` and kind against the stored ones and raises ValueError naming
    both when they differ, changing nothing. A semaphore at rest (nobody holds a permit and
    the free count equals the initial value) leaves no key in Redis, so the next user's
    value then defines it afresh.

    Waiters are served first come, first served across processes (``fair=True``, the
    default): a release wakes as many of the oldest waiters as it frees permits for, and
    each takes its permit with its own acquire. ``fair=False`` lets a free permit go to
    whoever asks first for up to 100 ms after a release woke the waiters it can serve.
    Every process using the name must pass the same ``fair``. ``entry_lease`` (default
    2 s) bounds how long a waiting thread that dies delays the others, as for
    :class:`rlocks.RLock`.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    def statistics(self) -> PrimitiveState:
        """Holders, permits, free count and waiters, read from Redis now (a frozen
        dataclass, the same the ``rlocks`` command line prints)."""
        return statistics(self)


class BoundedSemaphore(Semaphore):
    """A :class:`Semaphore` that never has more than its initial value in circulation.

    Permits free plus permits held by live owners, in every process, never exceed
    ``value``, whatever ``release()`` calls are made: a release gives back permits this
    process holds (the calling thread's, then other threads'), and one that would add a
    permit nobody holds raises ValueError ("Semaphore released too many times") and
    changes nothing, locally or in Redis. In one process that is exactly
    ``threading.BoundedSemaphore``'s rule; across processes it means a process holding
    nothing cannot release another process's permit. Permits recovered from a dead
    process are capped at the initial value too. Redis remembers the kind: a Semaphore
    and a BoundedSemaphore cannot share a name.
    """

    __slots__ = ()

    _label = "rlocks.BoundedSemaphore"
    _bounded = True
