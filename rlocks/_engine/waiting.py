"""Waiting for a primitive: which hub a waiter uses, and a waiter's deadline plan.

The hub itself (one subscriber per connection pool and namespace, its table of waiters)
is :mod:`.wakehub`, and its Redis Cluster transport :mod:`.sharded`.

Why a bounded re-check
----------------------
Messages can be lost (the subscriber reconnected) and holders can crash without
releasing. So a queued waiter never sleeps longer than its reply's re-check hint or its
queue entry's lease (see :mod:`.queued`), and never past its own deadline; a Condition's
waiter whose subscription the hub cannot confirm re-checks every ``DEGRADED_POLL`` seconds.

Lifetime
--------
A hub's reader exits once its table has been empty for ``IDLE_EXIT`` seconds, and the
registry of hubs here refers to them weakly, so an idle hub goes away with its thread (a
waiting thread holds its hub while it waits). The hub holds its client, so nothing else
of a client the program dropped outlives its last waiter by more than ``IDLE_EXIT``.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Iterator, Optional, Tuple

import redis.exceptions

from .clients import is_cluster, pool_of
from .clock import monotonic
from .scripts import unsent
from .sharded import ShardedWakeHub
from .wakehub import RECONNECT_BACKOFF, SUBSCRIBE_WAIT, WakeHub

__all__ = [
    "IDLE_WAIT",
    "LINK_ERRORS",
    "SILENT",
    "WaitPlan",
    "backoff",
    "take_back_pauses",
    "transient",
    "existing_hub",
    "hub_for",
    "link_lost",
]

log = logging.getLogger(__name__)

#: s a waiter behind its process's head sleeps between checks (no deadline). The head's
#: leaving wakes it at once; this only bounds the cost of a wake-up that is missed (CI saw
#: CPython's Semaphore test_acquire_contended stall 30 s once under load, cause not found),
#: at the price of one lock-free check every 2 s per idle waiting thread.
IDLE_WAIT = 2.0


# Weak values (see "Lifetime"): keyed by pool id, which no two live pools share; a hub
# holds its client, so its pool's id cannot be reused while the hub is in the table.
_hubs: "weakref.WeakValueDictionary[Tuple[int, str], WakeHub]" = weakref.WeakValueDictionary()
_hubs_mutex = threading.Lock()


def _reset_after_fork() -> None:
    # The parent's hub threads do not exist in a child and its subscriber socket is shared
    # with the parent: forget them all; the child builds its own on first need.
    global _hubs_mutex
    _hubs.clear()
    _hubs_mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def hub_for(client: Any, namespace: str) -> WakeHub:
    """The process's hub for ``client``'s connection pool and ``namespace``.

    One exists per pool and namespace in use, so share clients between primitives rather
    than making a pool per lock. An idle hub's thread exits and the hub is forgotten
    (see "Lifetime" in the module doc); a later wait makes a new one.
    """
    key = (id(pool_of(client)), namespace)
    hub = _hubs.get(key)
    if hub is None:
        with _hubs_mutex:
            hub = _hubs.get(key)
            if hub is None:
                kind = ShardedWakeHub if is_cluster(client) else WakeHub
                hub = _hubs[key] = kind(client, namespace)
    return hub


def link_lost(error: BaseException) -> None:
    """Log that a waiter lost its link to Redis and will retry (one message, one logger)."""
    log.debug("waiter lost its link to Redis, retrying: %s", error)


def existing_hub(client: Any, namespace: str) -> Optional[WakeHub]:
    """The process's hub for ``client``'s pool and ``namespace`` if one exists (no I/O,
    nothing created): where a release reply's wake lines for local waiters go."""
    return _hubs.get((id(pool_of(client)), namespace))


#: Errors after which a waiter with time left reconnects and waits on: the link broke or
#: timed out (a restarting server answers LOADING, a ConnectionError, until it is ready).
LINK_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
#: The link error of a server that stopped answering (a read ran out its socket timeout),
#: as opposed to one that refused or reset the connection.
SILENT = redis.exceptions.TimeoutError
#: ConnectionErrors that waiting longer does not cure: they are raised at once.
_NOT_TRANSIENT = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


def take_back_pauses(error: BaseException, pauses: Iterator[float]) -> float:
    """After taking a ``Condition``'s lock back failed with ``error``: seconds to pause
    before trying again, or ``error`` raised again when waiting cannot cure it.

    ``Condition.wait`` must return, or raise, holding the lock (the caller's ``with``
    releases it), so a link error there (Redis restarting: refused, then LOADING) is
    ridden through for as long as it lasts, as ``threading.Condition.wait`` always takes
    its lock back. Only a link error is (a refused login, or a reply other than a grant,
    is raised). Retrying the acquire is safe: the engine settles a call whose reply was
    lost before its next one (``Primitive._pop_unsettled``). ``pauses``: from
    :func:`backoff`.
    """
    if not transient(error):
        raise error
    link_lost(error)
    return next(pauses)


def transient(error: BaseException) -> bool:
    """Whether ``error`` is a link error that waiting may cure (Redis restarting or out
    of reach), not a refused login."""
    return isinstance(error, LINK_ERRORS) and not isinstance(error, _NOT_TRANSIENT)


def backoff() -> Iterator[float]:
    """Pauses (s) doubling from the first of ``RECONNECT_BACKOFF`` to its largest."""
    pause, most = RECONNECT_BACKOFF
    while True:
        yield pause
        pause = min(2.0 * pause, most)


class WaitPlan:
    """A waiter's deadline decisions, without I/O (used by :mod:`.queued`'s dialogue).

    ``subscribe_bound()`` bounds the wait for its SUBSCRIBE; ``idle()`` the sleep of a
    waiter behind its process's head.

    Riding through a broken link: when an attempt raises one of :data:`LINK_ERRORS`, the
    driver asks ``failed()`` how long to back off (``None``: raise it). An attempt whose
    command may have reached Redis may have been granted although its reply was lost,
    so the next step is then not another attempt (it would count the grant twice) but
    the primitive's *check* (``unsure`` is set): whether this owner already holds it,
    which is adopted as the grant. A primitive without a check cannot tell, and such an
    error is raised as before.
    """

    __slots__ = ("deadline", "backoff", "unsure")

    def __init__(self, deadline: Optional[float]) -> None:
        self.deadline = deadline
        self.backoff = RECONNECT_BACKOFF[0]
        self.unsure = False  # the last attempt's reply was lost: check before attempting

    def subscribe_bound(self) -> float:
        if self.deadline is None:
            return SUBSCRIBE_WAIT
        return max(0.0, min(SUBSCRIBE_WAIT, self.deadline - monotonic()))

    def failed(self, error: BaseException, checkable: bool) -> Optional[float]:
        """After an attempt or check raised a link error: seconds to back off before the
        next step, ``None`` to raise ``error`` (no time left, or a lost reply that the
        primitive cannot check, or a refused login)."""
        if isinstance(error, _NOT_TRANSIENT):
            return None
        if not unsent(error):
            if not checkable:
                return None
            self.unsure = True
        now = monotonic()
        if self.deadline is not None and now >= self.deadline:
            return None
        pause = self.backoff
        self.backoff = min(self.backoff * 2, RECONNECT_BACKOFF[1])
        if self.deadline is not None:
            pause = min(pause, self.deadline - now)
        return pause

    def idle(self) -> Optional[float]:
        """For a waiter behind the head: sleep until woken or its deadline (``None``: stop)."""
        if self.deadline is None:
            return IDLE_WAIT
        left = self.deadline - monotonic()
        return left if left > 0 else None
