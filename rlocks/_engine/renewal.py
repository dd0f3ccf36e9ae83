"""Lease renewal: one daemon thread per connection pool keeps the process's holds alive.

Why one thread (per pool)
-------------------------
A hold's lease is the PEXPIRE of its key (or, for multi-owner primitives, a per-owner
deadline the scripts keep); if the process dies, nobody renews it and it ends by itself.
While the process lives, a hold must not end under a holder that is still working, so
its lease is renewed about every ``ttl / 3``. Doing that with a thread or a round trip per
lock does not scale to thousands of holds; here one thread owns a table of leases, wakes
when the earliest is due, and renews every lease due soon in one pipeline (one round trip
for the whole batch).

There is one such renewer per connection pool in use, which for most programs is one per
process. Not one for all pools: a renewal blocks for as long as its pool takes to answer
(socket timeouts, a client's own retries), and one unreachable or slow Redis must not
delay the renewal of holds on another until their leases run out.

Weak references
---------------
A lease refers to its primitive weakly. A held lock that the program dropped (no
reference left) is no longer renewed and its hold expires at the end of its lease,
instead of being kept alive forever by the renewer.

Lifetime
--------
A renewer's thread exits once it has had no lease for ``IDLE_EXIT`` seconds, and the
registry refers to pools weakly: a renewer is forgotten with its pool and its thread
ends once idle, so a program that makes many short-lived clients does not keep a renewer
(or anything of their pools) per client. Renewals go through ``clients.io_client``:
bounded round trips that redis-py never re-sends, whatever the client's own settings.

Lost holds
----------
A renewal that finds the owner's hold gone (expired during a stall, deleted by
``release --force``) reports it lost to the primitive. A renewal that cannot reach Redis
is retried about every second; once the last successful renewal is older than the lease,
the hold cannot be trusted any more and is reported lost as well.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, ClassVar, Dict, Generator, List, Optional, Sequence, Tuple

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from . import metrics
from .clients import io_client, pool_of
from .clock import monotonic
from .dialogue import drive, stopped
from .quorum import Quorum, drift_allowance
from .scripts import Arg, Replication, Reply, Script, decode

__all__ = [
    "UNREACHABLE", "Item", "Lease", "Renewable", "Renewer", "Steps", "lease_count",
    "renewer_for", "send_steps",
]

log = logging.getLogger(__name__)

RETRY = 1.0  # s between renewal attempts while Redis cannot be reached
IDLE_EXIT = 30.0  # s without leases after which the renewer thread exits
# A hand-over grant kept unadopted is renewed (and so adopted) this soon: a short section
# (the contended case) ends first and costs no renewal, while a process must stall for
# most of the grant's short lease, and start within this, to lose the hold.
ADOPT_AFTER = 0.1
EARLY = 0.25  # a lease due within this fraction of its period joins the current batch


#: What a renewal round trip may raise when Redis could not be reached this time: a failed
#: renewal, not a bug. RedisClusterException (no slot map, every node unreachable) is not a
#: RedisError, nor is an OSError from a socket that redis-py did not wrap (asyncio's
#: connections let some through); both mean the same here. One policy for both renewers.
UNREACHABLE = (RedisError, RedisClusterException, OSError)

#: A renewal dialogue: yields ``None`` to send the pipeline of its items (and receives the
#: list of replies) or a :class:`Script` to load; returns the replies. Written once, without
#: I/O, for the threading driver (``Renewer._drive``) and the asyncio one.
Steps = Generator[Optional[Script], Any, List[Any]]


def send_steps(items: List["Item"]) -> Steps:
    """One renewal pipeline, with its scripts loaded again if the server lost its script
    cache (a restart, SCRIPT FLUSH): yields what to send, returns the replies."""
    results: List[Any] = yield None
    if any(isinstance(r, NoScriptError) for r in results):
        for script in {s.sha: s for _, _, s in items}.values():  # noqa: UP028 - the driver sends a reply
            yield script
        results = yield None
    return results


class Renewable:
    """What the renewer needs of what it renews: this layer's interface, which
    ``primitive.Primitive`` implements, so renewal knows nothing else of a primitive.
    A lease refers to its Renewable weakly (see "Weak references")."""

    __slots__ = ()

    #: The replication WAIT its writes ask for, if any (one WAIT ends a batch).
    _replication: Replication
    #: The renew script (loaded again after NOSCRIPT).
    _renew_script: ClassVar[Script]

    def _describe(self) -> str:
        """How log lines name it."""
        raise NotImplementedError

    def _renewal_client(self) -> Any:
        """The client (or :class:`.quorum.Quorum`) its renewals go through, asked by its
        renewer when they are due (one pipeline a pool). No I/O."""
        raise NotImplementedError

    def _renewal_arguments(self, lease: "Lease") -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of one renewal of ``lease`` (a hold, or a queue entry)."""
        raise NotImplementedError

    def _renewed(self, lease: "Lease", reply: Reply) -> bool:
        """Whether ``reply`` kept ``lease`` alive."""
        raise NotImplementedError

    def _hold_lost(self, owner: str, reason: str, lease: Optional["Lease"] = None) -> None:
        """The renewer found ``owner``'s hold gone (or could not renew it in time)."""
        raise NotImplementedError


class Lease:
    """One owner's hold on one primitive, as the renewer sees it."""

    __slots__ = ("ref", "owner", "ttl", "period", "due", "expires", "kind")

    def __init__(
        self, primitive: "Renewable", owner: str, ttl: float, since: float, kind: str = "h"
    ) -> None:
        self.ref: "weakref.ReferenceType[Renewable]" = weakref.ref(primitive)
        self.owner = owner
        #: "h": a hold; "e": a queue entry (``owner`` is then the hub's entry id)
        self.kind = kind
        self.ttl = ttl
        self.period = ttl / 3.0
        self.due = since + self.period
        # Our own, conservative idea of when the server lets the hold go: measured from
        # before the command that set the lease was sent.
        self.expires = since + ttl


#: One renewal in a batch: the lease, its (live) primitive, the primitive's renew script.
Item = Tuple[Lease, "Renewable", Script]


class Renewer:
    """The lease renewer of one connection pool. Use :func:`renewer_for` to get it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._wakeup = threading.Condition(self._mutex)
        self._leases: Dict[int, Lease] = {}
        self._next_wake = float("inf")
        self._runner: Optional[Any] = None  # the running loop (thread, or asyncio task)
        # When a lease was last added: the idle time counts from there. A lease added
        # and cancelled while the loop slept leaves no trace in the table, and the loop
        # would otherwise exit on waking as if idle all along (and be restarted at once).
        self._added = monotonic()

    def add(
        self,
        primitive: "Renewable",
        owner: str,
        ttl: float,
        since: float,
        short: Optional[float] = None,
    ) -> Lease:
        """Start renewing ``owner``'s hold on ``primitive``, granted at ``since``.

        ``short``: the hold is a hand-over grant still on its short lease, which ends no
        sooner than this (monotonic); its first renewal (which also adopts it on the
        server) is due ``ADOPT_AFTER`` s from now (or within a third of what is left, if
        sooner), not a third of ``ttl`` from now; it may come as late as that third.

        No I/O. Wakes the renewer's loop only if its next planned wake-up is too late.
        """
        lease = Lease(primitive, owner, ttl, since)
        latest = lease.due
        if short is not None:
            now = monotonic()
            lease.expires = min(lease.expires, short)
            third = max(short - now, 0.0) / 3.0
            delay = min(ADOPT_AFTER, third)
            lease.due = now + delay
            # Until that first renewal its period is the delay, so it only joins a batch
            # just before it is due (EARLY is a fraction of the period); renewals reset it.
            lease.period = delay
            # A loop that wakes within the third anyway renews it then: waking the loop
            # now would take the GIL from the thread that was just handed the lock.
            latest = now + third
        with self._mutex:
            self._leases[id(lease)] = lease
            self._added = monotonic()
            if stopped(self._runner):
                self._start_locked()
            elif latest < self._next_wake:
                self._notify_locked()
        return lease

    def add_entry(self, primitive: "Renewable", token: str, lease: float) -> Lease:
        """Start renewing this process's queue entry on ``primitive`` (lease ``lease`` s,
        renewed every third of it); cancel it when the wait ends."""
        entry = Lease(primitive, token, lease, monotonic(), kind="e")
        with self._mutex:
            self._leases[id(entry)] = entry
            self._added = monotonic()
            if stopped(self._runner):
                self._start_locked()
            elif entry.due < self._next_wake:
                self._notify_locked()
        return entry

    def _start_locked(self) -> None:
        """Start the renewer's loop (a daemon thread here); called under the mutex."""
        self._runner = threading.Thread(target=self._run, name="rlocks-renewer", daemon=True)
        self._runner.start()

    def _notify_locked(self) -> None:
        """Wake the loop early: a new lease is due before it planned to wake."""
        self._wakeup.notify()

    def cancel(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (released or lost). Idempotent, no I/O."""
        with self._mutex:
            self._leases.pop(id(lease), None)

    def cancel_others(self, primitive: "Renewable", owner: str, keep: Optional[Lease]) -> None:
        """Stop renewing every lease of ``owner`` on ``primitive`` but ``keep``: one an
        interrupted acquire started and never attached to the hold. No I/O; scans the
        table (only after an interrupt)."""
        with self._mutex:
            for key, lease in list(self._leases.items()):
                if lease.owner == owner and lease is not keep and lease.ref() is primitive:
                    del self._leases[key]

    def __len__(self) -> int:
        return len(self._leases)

    # -- the renewer thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            for client, items in self._groups(batch):
                try:
                    self._renew_on(client, items)
                except Exception as exc:  # noqa: BLE001 - the renewer must outlive any one failure
                    self._unexpected([(lease, primitive) for lease, primitive, _ in items], exc)

    def _next_batch(self) -> Optional[List[Lease]]:
        """Block until some leases are due; return them (``None``: thread should exit)."""
        with self._mutex:
            idle_since: Optional[float] = None
            while True:
                due, pause, idle_since = self._schedule_locked(monotonic(), idle_since)
                if due or pause is None:
                    return due or None
                self._wakeup.wait(pause)

    def _schedule_locked(
        self, now: float, idle_since: Optional[float]
    ) -> Tuple[List[Lease], Optional[float], Optional[float]]:
        """The renewer loop's decision, for the threading and asyncio drivers (no I/O):
        (leases to renew now, else how long to sleep, ``None``: exit; since when it has
        had no lease). An exit forgets the running loop, so the next lease starts one."""
        due, next_due = self._due_locked(now)
        if due:
            self._next_wake = float("inf")
            return due, 0.0, None
        if self._leases:
            self._next_wake = next_due
            return [], next_due - now, None
        idle_since = now if idle_since is None else max(idle_since, self._added)
        if now - idle_since >= IDLE_EXIT:
            self._runner = None
            return [], None, idle_since
        self._next_wake = now + IDLE_EXIT
        return [], IDLE_EXIT, idle_since

    def _due_locked(self, now: float) -> Tuple[List[Lease], float]:
        """Leases to renew now (due soon: batched with the due ones), and the next due time."""
        due: List[Lease] = []
        next_due = float("inf")
        for lease in self._leases.values():
            if lease.due <= now + EARLY * lease.period:
                due.append(lease)
            elif lease.due < next_due:
                next_due = lease.due
        return due, next_due

    def _groups(self, batch: List[Lease]) -> List[Tuple[Any, List[Item]]]:
        """Live leases of ``batch`` by connection pool: one pipeline each (no I/O). A
        lease whose client cannot be had is a failed renewal of its own (``_unexpected``)."""
        groups: Dict[int, Tuple[Any, List[Item]]] = {}
        for lease in batch:
            primitive = lease.ref()
            if primitive is None:
                # Nobody can release it any more: let the lease run out on the server.
                self.cancel(lease)
                continue
            try:
                client = primitive._renewal_client()
            except Exception as exc:  # noqa: BLE001 - that lease's failure, not the batch's
                self._unexpected([(lease, primitive)], exc)
                continue
            group = groups.setdefault(id(pool_of(client)), (client, []))
            script = primitive._renew_script
            group[1].append((lease, primitive, script))
        return list(groups.values())

    def _renew_on(self, client: Any, items: List[Item]) -> None:
        if isinstance(client, Quorum):
            self._renew_quorum(client, items)
            return
        self._drive(client, items, self._renew_steps(items))

    def _renew_steps(self, items: List[Item]) -> Steps:
        """The renewal of ``items`` on one server, for either driver (see :data:`Steps`):
        send, then extend the leases or report the holds lost. A round trip that fails
        with one of :data:`UNREACHABLE` is a failed renewal of each item (retried; the
        hold is lost once its lease is over), never a reason to stop the renewer."""
        sent = monotonic()
        try:
            results = yield from send_steps(items)
        except UNREACHABLE as exc:
            results = [exc] * len(items)
        self._apply(items, results, sent)
        return results

    def _send(self, client: Any, items: List[Item]) -> List[Any]:
        """One renewal pipeline on one server, its script cache reloaded if it was lost."""
        return self._drive(client, items, send_steps(items))

    def _drive(self, client: Any, items: List[Item], steps: Steps) -> List[Any]:
        """The threading driver of a renewal dialogue on ``client``: block as it asks
        (``None``: the renewal pipeline; a script: load it)."""
        client = io_client(client)

        def perform(script: Optional[Script]) -> Any:
            if script is None:
                return self._pipeline(client, items)
            return client.script_load(script.source)

        return drive(steps, perform)

    def _renew_quorum(self, quorum: Quorum, items: List[Item]) -> None:
        """Renew ``items`` on every master of ``quorum`` at once (see :mod:`.quorum`).

        A lease lives on while a majority renewed it; it is lost when more than a
        minority answered that the hold is gone there; otherwise (masters unreachable)
        the renewal is retried until the lease's own end, as on one server.
        """
        sent = monotonic()
        self._apply_quorum(quorum, items, quorum.map(lambda m: self._send(m, items)), sent)

    def _apply_quorum(
        self, quorum: Quorum, items: List[Item], per_master: List[Any], sent: float
    ) -> None:
        """Act on each master's renewal replies (a list, or the Exception that failed the
        whole pipeline), sent at ``sent`` (no I/O): see :meth:`_renew_quorum`."""
        refusable = len(quorum.masters) - quorum.majority
        for n, (lease, primitive, script) in enumerate(items):
            renewed = refused = 0
            error: Optional[Exception] = None
            for results in per_master:
                result = results if isinstance(results, Exception) else results[n]
                if isinstance(result, Exception):
                    error = error or result
                elif primitive._renewed(lease, decode(result, script.name)):
                    renewed += 1
                else:
                    refused += 1
            if renewed >= quorum.majority:
                # The validity window of a renewal is measured as an acquire's is.
                lease.expires = sent + lease.ttl - drift_allowance(lease.ttl)
                lease.period = lease.ttl / 3.0
                lease.due = sent + lease.period
            elif refused > refusable:
                self.cancel(lease)
                primitive._hold_lost(
                    lease.owner,
                    f"only {renewed} of {len(quorum.masters)} masters still had it",
                    lease,
                )
            else:
                if error is not None and not isinstance(error, UNREACHABLE):
                    # (a master's call returns any Exception as its result: a bug too)
                    self._log_unexpected([(lease, primitive)], error)
                self._failed(lease, primitive, error or RuntimeError("no majority answered"))

    def _apply(self, items: List[Item], results: List[Any], sent: float) -> None:
        """Act on a batch's replies (no I/O): extend leases, report lost holds."""
        if len(results) == len(items) + 1:  # the batch ended with a WAIT
            acks = results.pop()
            for _, primitive, _ in items:
                wanted = primitive._replication
                if wanted is not None and (isinstance(acks, Exception) or acks < wanted[0]):
                    log.warning(
                        "renewal of %s acknowledged by %s of %d replicas",
                        primitive._describe(), acks, wanted[0],
                    )
        if log.isEnabledFor(logging.DEBUG):
            names = ", ".join(primitive._describe() for _, primitive, _ in items[:3])
            more = f" and {len(items) - 3} more" if len(items) > 3 else ""
            log.debug("renewed %d lease(s) in one round trip: %s%s", len(items), names, more)
        for (lease, primitive, script), result in zip(items, results):
            if isinstance(result, Exception):
                self._failed(lease, primitive, result)
                continue
            reply = decode(result, script.name)
            if primitive._renewed(lease, reply):
                lease.expires = sent + lease.ttl
                lease.period = lease.ttl / 3.0
                lease.due = sent + lease.period
                metrics.renewed(primitive)
            else:
                self.cancel(lease)
                primitive._hold_lost(lease.owner, "its lease was gone when renewal came", lease)

    @staticmethod
    def _pipeline(client: Any, items: List[Item]) -> List[Any]:
        results: List[Any] = Renewer._queue(client, items).execute(raise_on_error=False)
        return results

    @staticmethod
    def _queue(client: Any, items: List[Item]) -> Any:
        """A pipeline on ``client`` with one renewal per item, not yet sent.

        If any primitive asks for replicas, one WAIT for the largest demand ends the
        batch (it covers every write before it on the connection); its reply is the last.
        """
        pipe = client.pipeline(transaction=False)
        for lease, primitive, script in items:
            keys, args = primitive._renewal_arguments(lease)
            # execute_command, not pipe.evalsha: redis-py's cluster pipeline refuses the
            # evalsha method but routes a plain EVALSHA command by its keys' slot.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        replication = Renewer._replication_for(items)
        if replication is not None:
            pipe.execute_command("WAIT", *replication)
        return pipe

    @staticmethod
    def _replication_for(items: List[Item]) -> Optional[Tuple[int, int]]:
        waits = [p._replication for _, p, _ in items if p._replication is not None]
        if not waits:
            return None
        return max(w[0] for w in waits), max(w[1] for w in waits)

    def _unexpected(
        self, leases: Sequence[Tuple[Lease, Optional["Renewable"]]], error: Exception
    ) -> None:
        """A renewal that raised what its dialogue does not expect (a bug, not Redis out of
        reach), for either driver: logged with its traceback, and each lease treated as a
        failed renewal, retried later (not at once, in a hot loop) and reported lost once
        its lease is over. The renewer goes on: its other holds must not lapse with it."""
        self._log_unexpected(leases, error)
        for lease, primitive in leases:
            if primitive is not None:
                self._failed(lease, primitive, error)

    @staticmethod
    def _log_unexpected(
        leases: Sequence[Tuple[Lease, Optional["Renewable"]]], error: Exception
    ) -> None:
        named = [p._describe() for _, p in leases if p is not None]
        log.error(
            "lease renewal failed unexpectedly (%d lease(s): %s%s)",
            len(leases), ", ".join(named[:3]), ", ..." if len(named) > 3 else "",
            exc_info=error,
        )

    def _failed(self, lease: Lease, primitive: "Renewable", error: Exception) -> None:
        now = monotonic()
        if now >= lease.expires:
            self.cancel(lease)
            why = "could not reach Redis" if isinstance(error, UNREACHABLE) else "failed"
            primitive._hold_lost(lease.owner, f"renewal {why} ({error!r})", lease)
        else:
            log.debug("renewal of %r failed, retrying: %s", primitive, error)
            lease.due = now + min(RETRY, lease.period)


# Keyed by the pool itself, weakly: the registry keeps no pool alive and forgets a
# renewer with its pool (a pool's id may be reused by a later pool, the pool may not).
# The renewer refers to no pool; its thread winds down on its own (see "Lifetime").
_renewers: "weakref.WeakKeyDictionary[Any, Renewer]" = weakref.WeakKeyDictionary()
_renewers_mutex = threading.Lock()


def _reset_after_fork() -> None:
    # A child holds nothing (its owner ids are new), so it must not renew the parent's
    # holds: start with no renewers (their threads do not exist in the child anyway).
    global _renewers_mutex
    _renewers.clear()
    _renewers_mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def renewer_for(client: Any) -> Renewer:
    """The renewer of ``client``'s connection pool (created on first use; see "Lifetime")."""
    key = pool_of(client)
    found = _renewers.get(key)
    if found is None:
        with _renewers_mutex:
            found = _renewers.get(key)
            if found is None:
                found = _renewers[key] = Renewer()
    return found


def lease_count() -> int:
    """How many leases this process's renewers hold (0 in a fresh fork child)."""
    return sum(len(r) for r in list(_renewers.values()))
