"""The distributed Barrier: ``threading.Barrier`` for parties in any process.

The state lives in one hash per barrier and a sorted set of party leases next to it
(``lua/barrier_lib.lua``): how many parties pass together, the generation filling, how
many arrived in it, whether it is broken, and one field per party that arrived, holding
its state (waiting, running the action, queued behind an action) or its outcome (passed
with index i, broken). An outcome stays until the party's lease ends or it arrives
again, so every script is safe to send again: a wait's calls carry the wait's id, and a
re-sent arrival that counted answers what became of it instead of arriving twice.

A wait (:meth:`BarrierCore._wait`) registers for wake-up hints, arrives (one script:
index = arrived so far; the last arriver passes the generation in the same script, or is
told to run the action and then sends ``barrier_pass``), then looks at its field when
hinted and at least every third of its ``entry_lease``; each look renews its lease. A
party that stops looking (its process died) is found by the next script any party
sends: a waiting party whose lease ended breaks the barrier, so the others raise
BrokenBarrierError within about ``entry_lease`` instead of hanging. The action's runner
has a lease of its own for as long as the action may take (:func:`action_ms`).

A party that gives up breaks the barrier, as in ``threading``: its time-out ran out
(not while an action runs: that generation is as good as passed), it was interrupted or
its task cancelled, or its action raised. The asyncio twin runs the same dialogue, so a
cancelled wait breaks the barrier as a time-out does (``asyncio.Barrier`` instead takes
the party out of the count, which can hand two parties one index).

Lifetime: while a generation fills or the barrier is broken, its keys live
:data:`KEEP` after the last change (so a party that died waiting still breaks it for the
next to come); once idle, they end with the last outcome's lease (an outcome, collected
or not, is kept that long for a re-sent call), or go at once when none is left.
``reset()`` removes them at once when every party has collected its outcome.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Generator, NamedTuple, Optional

from ..errors import BrokenBarrierError, RLocksError
from . import checks, wakeups
from .backends import backend_for
from .clients import checked_client, default_client, encoding_of
from .clock import monotonic
from .dialogues import RELEASE_PATIENCE
from .keys import PrimitiveKeys, keys_for
from .scripts import GRANTED, LOST, MISMATCH, WAIT, Call, Reply, load
from .steps import Enlist, Interrupted, Listen, call, transient

__all__ = ["ACTION_LEASE", "KEEP", "BarrierCore", "Turn", "action_ms"]

Steps = Generator[Any, Any, Any]

#: s: how long a barrier that is filling or broken keeps its keys after its last change.
KEEP = 86400.0
#: s: how long an action may run, when no time-out applies, before waiting parties
#: count its runner dead and break the barrier.
ACTION_LEASE = 60.0

_ARRIVE = load("barrier_arrive", "barrier_lib")
_LOOK = load("barrier_look", "barrier_lib")
_PASS = load("barrier_pass", "barrier_lib")
_BREAK = load("barrier_break", "barrier_lib")
_ABORT = load("barrier_abort", "barrier_lib")
_RESET = load("barrier_reset", "barrier_lib")
_PEEK = load("barrier_peek", "barrier_lib")

# A wait's id, unique in the process (with the owner id, unique everywhere).
_calls = itertools.count(1)


class Turn(NamedTuple):
    """A wait's arrival: its arrival index, and whether it must run the action (then
    :meth:`BarrierCore._finish` with ``call``)."""

    arrival: int
    act: bool
    owner: str
    call: str


def action_ms(timeout: Optional[float], entry_ms: int) -> int:
    """The lease of an action's runner, ms: the wait's time-out if one applies (at least
    the entry lease), else :data:`ACTION_LEASE`."""
    if timeout is None:
        return round(ACTION_LEASE * 1000)
    return max(entry_ms, min(round(timeout * 1000), 2**62 // 1000))


class BarrierCore:
    """What both Barrier surfaces share: settings, keys, checks and the dialogues."""

    __slots__ = ("_name", "_namespace", "_client", "_backend", "_keys", "_parties",
                 "_action", "_timeout", "_entry_ms", "__weakref__")

    _label = "rlocks.Barrier"
    _aio = False

    def __init__(self, name: str, parties: int, action: Optional[Any], timeout: Optional[float],
                 client: Any, namespace: str, entry_lease: float) -> None:
        label = self._label
        self._name = checks.check_name(name, label)
        where = f"{label}({checks.shown(name)})"
        if isinstance(parties, bool):
            raise TypeError(f"{where}: parties must be an int, not bool")
        try:
            count = operator.index(parties)
        except TypeError:
            raise TypeError(
                f"{where}: parties must be an int, not {type(parties).__name__}") from None
        if count < 1:
            raise ValueError(f"{where}: parties must be >= 1, got {count}")
        if action is not None and not callable(action):
            raise TypeError(f"{where}: action must be callable or None, "
                            f"not {type(action).__name__}")
        self._timeout = checks.semaphore_wait(True, timeout, label, name)
        self._namespace = checks.check_namespace(namespace, label, name)
        self._entry_ms = checks.entry_lease(entry_lease, label, name)
        self._parties = count
        self._action = action
        self._client = self._resolve_client(client, where)
        if self._client is not None:
            checks.check_wire_names({"name": self._name, "namespace": self._namespace},
                                    [encoding_of(self._client)], where)
        self._keys: PrimitiveKeys = keys_for(self._namespace, "barrier", self._name)
        self._backend: Any = self._backend_of(self._client)

    # -- construction ---------------------------------------------------------------------

    def _resolve_client(self, client: Any, where: str) -> Any:
        if client is None:
            return None if self._aio else default_client()
        if hasattr(client, "masters") and hasattr(client, "queues"):
            raise ValueError(f"{where}: client is a Quorum, but a Barrier keeps its parties "
                             "on one server: use a single server or a Redis Cluster")
        return checked_client(client, where, self._aio)

    def _backend_of(self, client: Any) -> Any:
        return backend_for(client)

    # -- read-only facts ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The barrier's name, as given."""
        return self._name

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def client(self) -> Any:
        """The client this barrier talks to."""
        return self._client

    @property
    def parties(self) -> int:
        """The number of parties that pass together (local: no I/O)."""
        return self._parties

    @property
    def timeout(self) -> Optional[float]:
        """The default time-out of :meth:`wait`, in seconds (``None``: no limit)."""
        return self._timeout

    @property
    def action(self) -> Optional[Any]:
        """The callable the last party of each generation runs (``None``: none)."""
        return self._action

    def __repr__(self) -> str:
        return (f"<{self._label} {checks.shown(self._name)} parties={self._parties} "
                f"namespace={checks.shown(self._namespace)}>")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cannot pickle or copy {self._describe()}: build a Barrier of the "
                        "same name (and parties) in the other process instead")

    def _describe(self) -> str:
        return f"{self._label}({checks.shown(self._name)})"

    # -- arguments --------------------------------------------------------------------------

    def _wait_seconds(self, timeout: object) -> Optional[float]:
        """``wait``'s time-out in seconds (``None``: none): the barrier's own for None."""
        if timeout is None:
            return self._timeout
        return checks.semaphore_wait(True, timeout, self._label, self._name)

    def _call(self, script: Any, owner: str, *more: Any) -> Call:
        k = self._keys
        return Call(script, (k.hash, k.leases),
                    (owner, k.wake, self._parties, round(KEEP * 1000), *more))

    # -- replies ----------------------------------------------------------------------------

    def _broken(self, why: str) -> BrokenBarrierError:
        return BrokenBarrierError(f"{self._describe()} {why}", name=self._name)

    def _mismatch(self, theirs: int) -> ValueError:
        return ValueError(
            f"{self._describe()}: this object has parties={self._parties}, but the barrier "
            f"in Redis has parties={theirs}: every process must pass the same parties")

    def _outcome(self, reply: Reply, owner: str, call_id: str,
                 timed_out: Optional[float] = None) -> Turn:
        """The Turn of a final reply; raises BrokenBarrierError / ValueError.
        ``timed_out``: the wait's time-out, when it ran out (it broke the barrier)."""
        if reply.status == GRANTED:
            return Turn(reply.a, reply.b == 1, owner, call_id)
        if reply.status == LOST:
            if timed_out is not None and reply.a == 0:
                raise self._broken(f"is broken: this wait timed out after {timed_out:g} s "
                                   "and broke it (as threading's does)")
            if reply.a == 1:
                raise self._broken(
                    "is broken for this party: its entry is gone, as its lease ended "
                    "before it looked again (a stall longer than entry_lease, or Redis "
                    "unreachable that long), so the others counted it gone")
            raise self._broken("is broken (abort(), reset(), a party that timed out, was "
                               "cancelled or died, or an action that raised)")
        if reply.status == MISMATCH:
            raise self._mismatch(reply.a)
        raise RLocksError(f"{self._describe()}: unexpected reply {reply!r}", name=self._name)

    # -- dialogues --------------------------------------------------------------------------

    def _wait(self, owner: str, seconds: Optional[float]) -> Steps:
        """Arrive and wait until the generation passes; returns the :class:`Turn`.

        Raises BrokenBarrierError when the barrier is or becomes broken, or its time-out
        (``seconds``, counted from the arrival) runs out, which breaks it; ValueError for
        another parties count. Interrupted (a cancellation): it breaks the barrier if it
        arrived, then re-raises."""
        backend, keys = self._backend, self._keys
        call_id = str(next(_calls))
        entry = self._entry_ms
        arrive = self._call(_ARRIVE, owner, call_id, entry, 1 if self._action else 0,
                            action_ms(seconds, entry))
        look = self._call(_LOOK, owner, call_id, entry)
        pause = entry / 3000.0
        until = None if seconds is None else monotonic() + seconds
        waiter = yield Enlist(backend, keys.wake, keys.hash, owner, until)
        deadline: Optional[float] = None
        timed_out: Optional[float] = None
        try:
            try:
                while True:
                    # Re-sent for at most a lease: after that its outcome may be gone,
                    # and a re-send could count as a second arrival.
                    window = monotonic() + entry / 1000.0
                    reply = yield from call(backend, arrive, window)
                    if not (reply.status == WAIT and reply.a < 0):
                        break
                    # Queued behind a running action: arrive when it ended (a hint).
                    yield Listen(waiter, pause)
                wakeups.wake_local(keys.hash, reply.woken)
                # (threading's time-out counts from the arrival too)
                deadline = None if seconds is None else monotonic() + seconds
                while reply.status == WAIT:
                    now = monotonic()
                    if deadline is not None and now >= deadline:
                        reply = yield from call(backend, self._call(_BREAK, owner, call_id, "t"),
                                                now + RELEASE_PATIENCE)
                        if reply.status != WAIT:
                            timed_out = seconds  # (it broke the barrier)
                        deadline = None  # (still waiting: an action runs; it is given time)
                    else:
                        yield Listen(waiter,
                                     pause if deadline is None else min(pause, deadline - now))
                        reply = yield from call(backend, look, deadline)
                    wakeups.wake_local(keys.hash, reply.woken)  # (a dead party broke it)
            except BaseException as exc:
                # Gone while it may have arrived (a no-op for a wait that never did).
                yield from self._leave(owner, call_id)
                if isinstance(exc, Interrupted):
                    raise exc.cause from None
                if transient(exc) and deadline is not None and monotonic() >= deadline:
                    raise self._broken("timed out while Redis was unreachable") from exc
                raise
        finally:
            waiter.close()
        return self._outcome(reply, owner, call_id, timed_out)

    def _finish(self, turn: Turn, ok: bool) -> Steps:
        """After the action (``ok``: it returned): pass the generation, returning the
        index, or break the barrier (the caller then re-raises the action's error).
        BrokenBarrierError if the barrier broke while the action ran."""
        if not ok:
            yield from self._leave(turn.owner, turn.call)
            return turn.arrival
        try:
            reply = yield from call(self._backend, self._call(_PASS, turn.owner, turn.call),
                                    monotonic() + RELEASE_PATIENCE)
        except BaseException as exc:
            yield from self._leave(turn.owner, turn.call)
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            raise
        wakeups.wake_local(self._keys.hash, reply.woken)
        return self._outcome(reply, turn.owner, turn.call).arrival

    def _leave(self, owner: str, call_id: str) -> Steps:
        """``barrier_break`` 'x', sent again for a while after a broken link; best
        effort: unanswered, the party's lease ending breaks the barrier instead."""
        try:
            reply = yield from call(self._backend, self._call(_BREAK, owner, call_id, "x"),
                                    monotonic() + RELEASE_PATIENCE)
            wakeups.wake_local(self._keys.hash, reply.woken)
        except BaseException as exc:  # noqa: BLE001 - best effort
            if isinstance(exc, Interrupted):
                raise exc.cause from None

    def _simple(self, script: Any, owner: str) -> Steps:
        """One call of ``script`` (abort, reset, peek), sent again after a broken link
        for up to ``RELEASE_PATIENCE`` (then the Redis error); its reply."""
        try:
            reply = yield from call(self._backend, self._call(script, owner),
                                    monotonic() + RELEASE_PATIENCE)
        except Interrupted as interrupt:
            raise interrupt.cause from None  # (each is whole or nothing: no undo)
        if reply.status == MISMATCH:
            raise self._mismatch(reply.a)
        wakeups.wake_local(self._keys.hash, reply.woken)
        return reply

    def _abort(self, owner: str) -> Steps:
        """Break the barrier; every waiting party raises BrokenBarrierError."""
        yield from self._simple(_ABORT, owner)

    def _reset(self, owner: str) -> Steps:
        """Back to the empty, unbroken state; waiting parties raise BrokenBarrierError."""
        yield from self._simple(_RESET, owner)

    def _peek(self, owner: str) -> Steps:
        """``(n_waiting, broken)``, as Redis has them now."""
        reply = yield from self._simple(_PEEK, owner)
        return reply.a, reply.b == 1
