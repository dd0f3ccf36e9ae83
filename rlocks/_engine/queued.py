"""Acquire through the server-side queue: the wait written once, without I/O.

Why a generator
---------------
A blocking acquire is a dialogue: try, queue, wait for the hub, re-check, leave. Written
as a generator that *yields* what it needs (:class:`Op`: run this script call, wait on
this waiter's event, wait for the subscription) and receives the result, the dialogue
exists once; the threading driver (``Primitive._drive``) and the asyncio driver
(``AsyncPrimitive._adrive``) are a dozen lines each and only decide *how* to block. A
change to the wait policy is one edit, and the two surfaces cannot drift.

The dialogue (docs/design/handover.md, "Client side")
------------------------------------------------------
1. A caller with no local waiter ahead of it tries once (``queue = 0``): the uncontended
   acquire stays one round trip and subscribes to nothing. A holder re-entering (or a
   writer taking the read side) always goes this way: the script grants it at once.
2. Refused, it registers in the process's hub (one local FIFO per primitive: only its
   head talks to Redis, so the process has one queue entry), waits until the channel is
   subscribed (so its grant line cannot be published unseen), and asks with ``queue = 1``
   (a head whose sibling was just handed an exclusive hold asks only once that hold's
   release begins, or ``wakehub.DEFER_LIMIT`` later: ``WakeHub.unregister``):
   granted, or QUEUED. Queued, the entry is renewed by the renewer (item ``e``) and the
   head waits for the hub at most until the re-check hint (``aux``), the entry lease or
   the deadline.
3. The hub's ``g <waiter>`` line (or the releasing thread of this process, from its
   release reply) marks the waiter GRANTED. A head that listens (``WakeHub.listen``: one
   per hub, decided at its first queueing call, ``queue = 2``) reads its entry's lines
   itself from a list in Redis (``LISTEN``: BLPOP) instead: no pub/sub hop, no thread
   switch; the list only holds lines of the entry's current place. A lock's waiter
   records the hold with no round trip when the grant is surely this wait's and its
   short lease has most of ``entry_lease`` left (``_short_lease_end``): the renewer's
   first renewal of the hold, due ``renewal.ADOPT_AFTER`` (0.1 s) later (or at the
   renewer's next planned wake-up within a third of the short lease), adopts it and
   extends it to ``ttl``; so do the owner's own release or re-entry, whichever comes
   first. Otherwise
   (a semaphore, an old wait, ``replicas=``) it adopts the grant itself before returning.
   ``w`` (``fair=False``), or no line in time, makes it ask again: that re-check renews
   the entry and answers ADOPTED for a grant whose line was missed (recorded once).
4. Deadline, cancel or interrupt: under the hub mutex the waiter either finds itself
   granted (the grant won: returned, or given back when unwinding) or becomes LEAVING
   (a late line is ignored) and calls ``leave``; PASSED means a grant that raced the
   time-out was given back and passed on.

A lost reply (broken link) is ridden through as before (:class:`.waiting.WaitPlan`):
after an attempt whose reply may have been lost, the primitive's check (a renewal of the
owner's hold) says whether it was granted.

Deadlock detection (:mod:`.deadlock`): a waiter of a primitive with a ``deadlock_timeout``
wakes up once it has waited that long (and every ``deadlock_timeout`` after), records its
wait-for edge and walks the graph (``READ`` ops); the victim of a confirmed cycle leaves as
at a deadline and raises. The edge is deleted before the acquire returns or raises. A wait
shorter than ``deadlock_timeout`` makes none of these round trips.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Generator, List, Optional, Tuple

from . import deadlock, identity, metrics, wakehub
from .clock import monotonic
from .scripts import ADOPTED, BUSY, GRANTED, PASSED, Call, Reply, new_op, unsent
from .waiting import LINK_ERRORS, SILENT, WaitPlan, link_lost
from .wakehub import RECONNECT_BACKOFF, Waiter, WakeHub, serial

if TYPE_CHECKING:  # pragma: no cover
    from .primitive import Primitive

__all__ = ["CALL", "LISTEN", "READ", "SUBSCRIBE", "WAIT", "Op", "Steps", "acquire_steps"]

log = logging.getLogger(__name__)

CALL, WAIT, LISTEN, SUBSCRIBE, READ = "call", "wait", "listen", "subscribe", "read"

#: The least short lease (s) a hand-over grant must have left to be kept without its
#: adoption round trip: the renewer's margin for its first renewal, which adopts it.
RENEW_SLACK = 1.0


class Op:
    """One thing the dialogue needs from its driver.

    ``CALL``: run ``call``; the result is its :class:`Reply`. A driver whose round trip
    was cut short by an interrupt or a cancel after the command was sent stores the
    script's answer, when it can still read it, in ``late`` before raising. ``WAIT``:
    wait on ``waiter``'s event at most ``timeout`` s (the result is ignored).
    ``LISTEN``: the same for a waiter that reads its wake-up lines itself: unless its
    event is set, pop at most one element of its entry's list (the channel's name),
    waiting at most ``timeout`` s, and hand it to ``hub`` (``WakeHub.heard``); a broken
    link ends the step early, its error (one of ``LINK_ERRORS``) the result.
    ``SUBSCRIBE``: wait at most ``timeout`` s for ``waiter``'s channel to be confirmed.
    ``READ``: run the one Redis ``command`` (the deadlock detector's reads and its edge;
    idempotent, routed by its one key); the result is the raw reply. A ``READ`` waits its
    turn among the hub's other reads (``WakeHub.reads``), at most ``READ_TURN``, unless
    ``turn`` is false: the deletion of an edge whose wait ended, which must not be skipped
    (a left edge says its owner still waits, and could be confirmed into a false cycle).
    """

    __slots__ = (
        "kind", "call", "waiter", "timeout", "late", "sent", "command", "opid", "hub", "turn",
    )

    def __init__(
        self,
        kind: str,
        call: Optional[Call] = None,
        waiter: Optional[Waiter] = None,
        timeout: float = 0.0,
        command: Tuple[Any, ...] = (),
        hub: Optional[WakeHub] = None,
        turn: bool = True,
    ) -> None:
        self.kind = kind
        self.hub = hub  # LISTEN: the hub whose table the popped lines go to
        self.turn = turn  # READ: wait for the hub's read turn (False: the edge's deletion)
        self.command = command
        self.call = call
        self.waiter = waiter
        self.timeout = timeout
        self.late: Optional[Reply] = None
        # The op id a CALL is sent with (None: a fresh one per send): the dialogue's
        # clean-up can then ask the op record whether a call that lost its reply ran.
        self.opid: Optional[str] = None
        # Drawn before the call is sent: its reply's wake lines may only grant waiters
        # registered before this (see WakeHub.deliver).
        self.sent = serial()

    def set_late(self, reply: Reply) -> None:
        self.late = reply


#: Suffix of the op stream of a caller's calls that may grant (see ``_call``).
GRANT_STREAM = "/g"

#: What ``acquire_steps`` is: yields :class:`Op`, receives results, returns the outcome.
Steps = Generator[Op, Any, bool]


class _AcquireState:
    """The dialogue's own state, visible to its clean-up."""

    __slots__ = (
        "op", "waiter", "queued", "entry", "entry_id", "detector", "basis", "began", "listening",
        "silent",
    )

    def __init__(self) -> None:
        #: (when it was sent, monotonic; the token it reported) of this waiter's last
        #: acquire answered QUEUED: a grant made after that call has a larger token, and
        #: its short lease ends no sooner than ``entry_lease`` after the send.
        self.basis: Optional[Tuple[float, int]] = None
        self.detector: Optional[deadlock.Detector] = None
        self.op: Optional[Op] = None  # the acquire call in flight, if any
        self.waiter: Optional[Waiter] = None
        self.queued = False  # an entry of this waiter may be in the queue
        self.entry: Any = None  # the renewer's lease of the queue entry
        self.entry_id = ""  # the queue entry's id: the hub's (WakeHub.entry)
        self.began = False  # metrics count this acquire as waiting (see _waits)
        #: The waiter reads its lines from the entry's list (WakeHub.listen); decided at
        #: its first queueing call and kept for the whole wait (None: not decided yet),
        #: since a switch could leave a published line of its place unaccounted for.
        self.listening: Optional[bool] = None
        #: Its last BLPOP ran out a socket timeout (the server stopped answering).
        self.silent = False


def acquire_steps(
    prim: "Primitive", owner: str, count: int, wait: Optional[float], hub: Optional[WakeHub]
) -> Steps:
    """Acquire ``count`` holds of ``prim`` for ``owner``, waiting ``wait`` s (``None``:
    forever; 0: a single try, then ``hub`` is ``None``). Returns whether it was granted.

    Raises what the primitive raises for a refusal (lost re-entry, upgrade), and Redis
    errors; on any exception (an interrupt or a cancel included) what was granted but
    not recorded is given back and a queued entry leaves, before the exception goes on.
    """
    st = _AcquireState()
    first = monotonic()
    holder: Optional[str] = None  # see WakeHub.unregister
    try:
        granted = yield from _acquire(prim, owner, count, wait, hub, st)
        if granted and prim._defers_next():
            holder = owner
        if st.waiter is not None:
            prim._log_wait(owner, first, granted)
    except GeneratorExit:
        raise
    except BaseException as exc:
        yield from _abandon(prim, owner, count, hub, st, exc)
        raise
    else:
        if st.detector is not None and st.detector.seq is not None:
            try:
                yield from _drop_edge(st.detector)
            except BaseException:
                if granted:
                    # Interrupted after the grant was recorded: the caller will never
                    # release it, so give it back (as an unrecorded interrupted grant is).
                    prim._record_release(owner, count)
                    try:
                        yield Op(CALL, prim._release_call(owner, count))
                    except BaseException:  # noqa: BLE001 - the first one propagates
                        log.debug("%s: grant of %s left to its lease", prim._describe(), owner)
                raise
        return granted
    finally:
        if st.entry is not None:
            prim._renewer().cancel(st.entry)
        if st.waiter is not None and hub is not None:
            # (also when it never listened: a sibling's release may have made it the
            # listener for the queueing it carried; see WakeHub.carry_begin)
            hub.unlisten(st.waiter)
            hub.unregister(st.waiter, holder)


def _call(st: _AcquireState, call: Call) -> Op:
    """A call that may grant (acquire, its re-check, an adoption), with its own op id.

    Its stream is the caller's with ``/g`` added (``lua/op_lib.lua`` keeps one record, the
    last operation, per stream): the caller's releases and other operations then never
    overwrite the record that ``_settle`` reads for a call that lost its reply.
    """
    st.op = Op(CALL, call)
    st.op.opid = new_op(identity.op_stream() + GRANT_STREAM)
    return st.op


def _waits(prim: "Primitive", st: _AcquireState, since: float) -> None:
    """The acquire called at ``since`` waits from now on (it was refused once, or is about
    to sleep or subscribe): the metrics count it as waiting, once. An acquire granted by
    its first call never waits, whichever call that was."""
    if not st.began:
        st.began = True
        metrics.wait_began(prim, since)


def _acquire(
    prim: "Primitive",
    owner: str,
    count: int,
    wait: Optional[float],
    hub: Optional[WakeHub],
    st: _AcquireState,
) -> Steps:
    prim._check_acquire(owner)
    failed = prim._pop_unsettled(owner)
    if failed:
        yield from _settle(prim, owner, failed)
    if prim._adopt_first(owner):
        yield _call(st, prim._adopt_call(owner))
        st.op = None
    reentry = prim._held(owner) > 0
    first = monotonic()
    deadline = None if wait is None else first + wait
    # (a hub per process, pool and event loop: its waiters queue as its one entry)
    channel = "" if hub is None else prim._channel(hub)
    direct = hub is None or not prim._queues_locally(owner)
    # While this process's channel is subscribed (its waiters used it within LINGER), the
    # first call is already the queueing one, made as a registered waiter: it grants at
    # once whatever a single try would, so the try would only add a round trip and a
    # script run to every contended acquire. Otherwise a single try comes first: an
    # entry made before the subscription is confirmed could miss its grant line.
    confirmed = not direct and hub.is_confirmed(channel)  # type: ignore[union-attr]
    # Skipping its try, the thread still owes the primitive one call whatever its deadline:
    # a free primitive must not be refused for a timeout that ran out while it registered.
    owed = confirmed and not hub.has_waiters(channel)  # type: ignore[union-attr]
    if direct or (not confirmed and hub.try_first(channel, owner)):  # type: ignore[union-attr]
        since = monotonic()
        try:
            reply = yield _call(st, prim._acquire_call(owner, count, reentry, None))
        finally:
            if not direct:
                hub.tried(channel, owner)  # type: ignore[union-attr]
        st.op = None
        if hub is None or reply.status != BUSY:
            return (yield from _granted(prim, owner, count, reply, since, st))
        if deadline is not None and monotonic() >= deadline:
            return False
        _waits(prim, st, first)
    assert hub is not None
    plan = WaitPlan(deadline)
    waiter = st.waiter = hub.register(channel, owner)
    waiter.ask = (prim._renew_items(owner)[0], count)
    waiter.lease_ms = prim._entry_ms
    entry_s = prim._entry_ms / 1000.0
    st.entry_id = hub.entry
    det = st.detector = prim._detector(owner, first, hub.entry)
    while True:
        if hub.claim(waiter):
            carried = hub.take_carry(waiter)
            if carried is not None and st.basis is None:
                # Granted by the very release that queued it (nobody else waited): that
                # queueing's answer tells that the grant is this wait's (_short_lease_end).
                st.basis = (carried[0], carried[1].token)
            if (yield from _handed(prim, owner, count, st)):
                return True
            # Revoked before this process could adopt it: queue again (at the tail).
            hub.rewait(waiter)
        now = monotonic()
        if det is not None and now >= det.due and (deadline is None or now < deadline):
            # (Not once the deadline passed: the time-out goes first, bounded as before.)
            _waits(prim, st, first)
            error = yield from _detect(prim, det)
            if error is not None:
                # The victim: unless a grant won the race (then no cycle is left), leave
                # as at a deadline (acquire_steps' clean-up calls leave) and raise.
                if hub.claim(waiter, leaving=True) and (
                    yield from _handed(prim, owner, count, st)
                ):
                    return True
                raise error
            continue  # the check took time: look at the hub and the deadline again
        if not hub.is_head(waiter):
            pause = plan.idle()
            if pause is None:
                # Under the hub mutex: either a leaving head named it in the process's
                # entry before this (then it leaves the queue in its turn, passing the
                # entry on), or the head will not name it.
                if hub.claim(waiter, leaving=True):
                    return (yield from _handed(prim, owner, count, st))
                if not waiter.named:
                    return False  # never asked Redis: nothing to leave
                st.queued = True
                break
            if det is not None:
                pause = det.pause(pause)
            put_off = hub.deferred(waiter)
            if put_off is not None:
                pause = min(pause, put_off + 0.001)
            elif prim._defers_next() and hub.next_in_line(waiter):
                # The head may be granted at any moment and keep this waiter back for its
                # hold (WakeHub.unregister) without waking it: it looks again within
                # DEFER_LIMIT, so it queues by then even if that hold ends unseen here
                # (lost, never released) or lasts long.
                pause = min(pause, wakehub.defer_poll())
            _waits(prim, st, first)
            if hub.rest(waiter):
                yield Op(WAIT, waiter=waiter, timeout=pause)
            continue
        if deadline is not None and not owed and monotonic() >= deadline:
            break
        if not waiter.subscribed:
            _waits(prim, st, first)
            yield Op(SUBSCRIBE, waiter=waiter, timeout=plan.subscribe_bound())
        waiter.event.clear()
        # A sibling's release queued it already, reading its lines from the list (see
        # WakeHub.carry_begin): that queueing's answer is this call's.
        carried = None if st.queued else hub.take_carry(waiter)
        if st.listening is None:
            st.listening = hub.listen(waiter)
        if carried is not None and not st.listening:
            # (a head that decided not to listen before: its own call re-points the entry
            # to publish its lines instead)
            carried = None
        if not st.queued:
            # Only an entry made while subscribed is sure to have its grant line read; a
            # listening waiter's lines are never published, so none is to be dropped.
            waiter.counts = not st.listening and hub.is_confirmed(channel)
        if carried is not None:
            since, reply = carried
            st.queued = True
            owed = False
        else:
            try:
                if plan.unsure:
                    check = prim._acquire_check(owner)
                    if check is not None:
                        found = yield _call(st, check)
                        plan.unsure = False
                        if found.items and found.items[0] == 1:
                            hub.claim(waiter, leaving=True)
                            if found.items[1:2] == (1,):  # it adopted a hand-over grant
                                hub.note_grant(waiter)
                            since = monotonic()
                            return (yield from _granted(prim, owner, count, found, since, st))
                since = monotonic()
                owed = False
                st.queued = True  # from the moment it is sent, an entry may exist
                op = _call(st, prim._acquire_call(owner, count, reentry, hub.entry, st.listening))
                reply = yield op
                st.op = None
                st.silent = False
            except LINK_ERRORS as exc:
                pause = plan.failed(exc, prim._acquire_check(owner) is not None)
                if pause is None:
                    raise  # with st.op: the clean-up records the call whose reply was lost
                # Trying again: the check above (plan.unsure) tells a grant that was lost.
                st.op = None
                link_lost(exc)
                _waits(prim, st, first)
                yield Op(WAIT, waiter=waiter, timeout=pause)
                continue
            plan.backoff = RECONNECT_BACKOFF[0]
            hub.deliver(channel, reply.wakes, op.sent)
        if reply.queued:
            st.basis = (since, reply.token)
            # A listening head renews its entry itself: its re-check, at least every
            # third of the entry lease (as the renewer would), renews it. The renewer's
            # call would need a second connection of the pool while the BLPOP holds one.
            if st.entry is None and not st.listening:
                st.entry = prim._renewer().add_entry(prim, hub.entry, entry_s)
            hint = reply.aux / 1000.0 + 0.001 if reply.aux >= 0 else entry_s
            pause = min(hint, entry_s / 3 if st.listening else entry_s)
            if deadline is not None:
                pause = min(pause, deadline - monotonic())
            if det is not None:
                pause = det.pause(pause)
            _waits(prim, st, first)
            if pause > 0 and st.listening:
                heard = yield Op(LISTEN, waiter=waiter, timeout=pause, hub=hub)
                st.silent = isinstance(heard, SILENT)
            elif pause > 0:
                yield Op(WAIT, waiter=waiter, timeout=pause)
            continue
        # Granted directly, ADOPTED, or refused: the wait is over either way.
        st.queued = False
        if hub.claim(waiter, leaving=True) and not reply.granted:  # pragma: no cover
            log.debug("%s: hub grant beside a refusal", prim._describe())
        if reply.status == ADOPTED:
            # A hand-over whose line the hub has not read yet: it must drop that line.
            # (A direct grant, status 1, published no line: nothing to drop.)
            hub.note_grant(waiter)
        return (yield from _granted(prim, owner, count, reply, since, st))
    # The deadline passed: the grant and the leave race under the hub mutex.
    if hub.claim(waiter, leaving=True) and (yield from _handed(prim, owner, count, st)):
        return True
    if st.silent and not waiter.named:
        # Its BLPOP already waited out a socket timeout of a silent server: the leave
        # would wait out another one. The entry (and any grant that raced) ends with its
        # short lease, as when a leave fails.
        st.queued = False
        log.debug("%s: server silent; the entry ends with its lease", prim._describe())
    if st.queued or waiter.named:
        st.queued = False
        try:
            yield from _leave(prim, owner, hub, waiter, st)
        except LINK_ERRORS:
            # The entry (and any grant that raced) ends with its short lease.
            log.debug("%s: leave failed; the entry ends with its lease", prim._describe())
        finally:
            st.op = None
    return False


def _leave(
    prim: "Primitive", owner: str, hub: WakeHub, waiter: Waiter, st: _AcquireState
) -> Generator[Op, Any, None]:
    """Take ``waiter`` out of the server's queue in one step (time-out, cancel, error).

    The process keeps its place: the entry is re-pointed to the next local waiter, which
    then leaves in its turn should it stop waiting before asking. If that waiter stopped
    waiting while the leave was in flight, the entry leaves (or is passed on) in its
    name. Raises Redis errors.
    """
    gone, leaving = owner, waiter
    while True:
        nxt = hub.successor(waiter)
        ask = None if nxt is None else (nxt.id, *nxt.ask)
        op = _call(st, prim._leave_call(gone, hub.entry, ask))
        reply = yield op
        st.op = None
        hub.deliver(waiter.channel.name, reply.wakes, op.sent)
        if reply.status == PASSED:
            # the grant's line, when the hub reads it, must not grant a later wait
            hub.note_grant(leaving)
        # (with nxt named, value 0 says the re-pointed entry was granted to it at once:
        # its line says so)
        if nxt is None or reply.status != GRANTED or hub.take_over(nxt):
            return
        # nxt stopped waiting before it was named: the entry, or the grant it was just
        # made, names nobody who waits (a grant left so would hold everyone off for its
        # short lease: bug hunt).
        gone, leaving = nxt.id, nxt


def _reads(reads: deadlock.Reads) -> Generator[Op, Any, Any]:
    """Run a :mod:`.deadlock` step: each command it yields as a ``READ`` op."""
    reply: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            command = reads.send(reply) if error is None else reads.throw(error)
        except StopIteration as stop:
            return stop.value
        reply = error = None
        try:
            reply = yield Op(READ, command=command)
        except Exception as exc:  # noqa: BLE001 - the step may recover (NOSCRIPT)
            error = exc


def _detect(prim: "Primitive", det: deadlock.Detector) -> Generator[Op, Any, Any]:
    """One deadlock check: the error to raise, or ``None``. A Redis failure is no finding:
    the wait goes on and the next check comes ``deadlock_timeout`` later."""
    try:
        return (yield from _reads(deadlock.check(det)))
    except Exception as exc:  # noqa: BLE001 - an interrupt or cancel goes on (BaseException)
        det.due = monotonic() + det.timeout
        log.debug("%s: deadlock check failed: %r", prim._describe(), exc)
        return None


def _drop_edge(det: deadlock.Detector) -> Generator[Op, Any, None]:
    """Delete the wait's edge; only a Redis failure leaves it to its lease (it takes no
    read turn: see Op)."""
    try:
        yield Op(READ, command=deadlock.drop_edge(det), turn=False)
    except Exception as exc:  # noqa: BLE001
        log.debug("deadlock edge of %s left to its lease: %r", det.owner, exc)


def _granted(
    prim: "Primitive", owner: str, count: int, reply: Reply, since: float, st: _AcquireState
) -> Steps:
    """End of an answered acquire: record a grant (or give back one that cannot be
    kept), raise a refusal, or False for busy."""
    refusal = prim._grant_refusal(owner, count, reply) if reply.granted else None
    if refusal is not None:
        yield _call(st, prim._release_call(owner, count))
        st.op = None
        raise refusal
    return prim._finish_acquire(owner, count, reply, since)
    yield  # pragma: no cover - makes this a generator


def _settle(
    prim: "Primitive", owner: str, failed: List[Tuple[int, str, bool]]
) -> Generator[Op, Any, None]:
    """Before ``owner``'s acquire, give back the levels its calls that failed on a Redis
    error left in Redis: ``failed`` lists each (levels, op id, grant).

    A release (grant False) whose op record is there ran (nothing to do); otherwise its
    levels are still there unless their lease ended. A grant (an acquire, its re-check or
    an adoption) left levels only if its record is there with a grant's status (1 or 2;
    one that did not run left at most a hand-over grant, whose marker takes it back when
    its short lease ends). Either way at most the levels beyond the process's books are
    given back. One or two reads per call, one more call only if something is left. A
    failure raises (Redis is what the acquire needs too) and leaves what is not settled
    to the next acquire."""
    ops_key = prim._keys.queued()[7]
    left = list(failed)
    try:
        while left:
            count, op, grant = left[0]
            seq, _, stream = op[1:].partition(":")
            record = yield Op(READ, command=("HGET", ops_key, stream))
            if isinstance(record, bytes):
                record = record.decode("ascii", "replace")
            fields = [] if record is None else str(record).split(" ")
            ran = fields[:1] == [seq]
            # A release left levels if it did not run; a grant if it ran and granted (a
            # QUEUED answer is recorded too, status 3: nothing was granted).
            stayed = (ran and fields[2:3] in (["1"], ["2"])) if grant else not ran
            if stayed:
                held = yield Op(READ, command=("HGET", prim._keys.hash, prim._hold_field(owner)))
                excess = 0 if held is None else min(
                    count, int(held) - prim._held_by_all_objects(owner)
                )
                if excess > 0:
                    yield Op(CALL, prim._release_call(owner, excess))
                    log.debug("%s: %d level(s) of %s a failed call left given back",
                              prim._describe(), excess, owner)
            left.pop(0)
    except BaseException:
        for count, op, grant in left:
            prim._unsettle(owner, count, op, grant)
        raise


def _handed(prim: "Primitive", owner: str, count: int, st: _AcquireState) -> Steps:
    """Adopt and record a hand-over grant the hub (or a release reply) announced: one
    round trip (False: the grant's short lease had ended and it was revoked, so there is
    nothing to record), an acquire re-check instead when the grant must pass the checks
    a direct grant passes (``_checks_hand_over``).

    The hold's lease, as the renewer counts it, starts with the call that adopts the
    grant (or now, for a grant kept on its short lease), never with the acquire: after a
    wait longer than a third of ``ttl`` the renewer would find it due at once (a renewal
    racing the holder's release then reported a false loss: bug hunt), and after one
    longer than ``ttl`` its end already past (one failed renewal, a loss).

    Raises what ``_granted`` raises for a grant that cannot be kept (given back first).
    """
    st.queued = False  # the grant took the entry out of the queue
    since = monotonic()
    if prim._checks_hand_over(owner):
        # The hand-over was made by the releaser's script, which WAITed for nobody and
        # could not know this owner's books. Its re-check (acquire, queue = 1) answers
        # ADOPTED with the owner's count on the server, adding nothing, and goes with
        # WAIT as a direct acquire does: ``_granted`` then applies the same refusals.
        op = _call(st, prim._acquire_call(owner, count, False, st.entry_id))
        reply = yield op
        st.op = None
        prim._deliver(reply, op.sent)
        if reply.queued:
            # Revoked meanwhile (not adopted within the entry lease): queued again.
            st.queued = True
            return False
        return (yield from _granted(prim, owner, count, reply, since, st))
    # the fencing token came with the grant line (or the release reply that named it)
    token = st.waiter.token if st.waiter is not None else 0
    short = _short_lease_end(prim, st, token)
    if short is not None:
        # Recorded with no round trip: the grant is this wait's and has most of its short
        # lease left, and the renewer's first renewal of the hold adopts it well before
        # that lease ends (a stall past it is then a lost hold, reported as any other).
        prim._record_grant(owner, count, since, token=token, unadopted=short)
        return True
    # Adopted here, before acquire returns True: the grant lives only the entry lease
    # until adopted, and a process stalled that long after the wake-up (CI saw one under
    # load) would otherwise return True for a grant already revoked and handed on. The
    # adoption extends the hold to the full ttl, so True means what a direct grant means.
    since = monotonic()
    reply = yield _call(st, prim._adopt_call(owner))
    st.op = None
    if not reply.items or reply.items[0] != 1:
        # Revoked: a revocation takes the holds with it.
        return False
    if reply.items[1] != 1 and not prim._hold_proves_grant:
        # The grant's marker was gone: revoked, or adopted by this waiter's own earlier
        # call. A lock's waiter held nothing before, so its hold is the grant's; a
        # semaphore owner may hold permits through another object (on another client,
        # which this one cannot know of), so only the marker proves the grant.
        return False
    prim._record_grant(owner, count, since, token=token)
    return True


def _short_lease_end(prim: "Primitive", st: _AcquireState, token: int) -> Optional[float]:
    """When (monotonic) the short lease of the hand-over grant just announced ends at the
    earliest, if it may be kept without the adoption round trip; else None (no I/O).

    Only for a lock's grant (a semaphore's hold does not prove its grant: it adopts) that
    a renewer will adopt, and only when it is sure to be this wait's: its token is above
    the one this waiter's last QUEUED reply reported, so it was made after that call (an
    old line, read late, of a grant since revoked has a smaller one), and its lease,
    ``entry_lease`` from no sooner than that call's send, still has ``RENEW_SLACK`` and two
    thirds of ``entry_lease`` left for the renewer."""
    if st.basis is None or not prim._hold_proves_grant or not prim._auto_renew:
        return None
    sent, seen = st.basis
    if token <= seen:
        return None
    entry_s = prim._entry_ms / 1000.0
    end = sent + entry_s
    if end - monotonic() < max(RENEW_SLACK, entry_s * 2.0 / 3.0):
        return None
    return end


def _abandon(
    prim: "Primitive",
    owner: str,
    count: int,
    hub: Optional[WakeHub],
    st: _AcquireState,
    exc: BaseException,
) -> Generator[Op, Any, None]:
    """Clean up after an exception inside the dialogue; failures are left to leases."""
    failed = st.op
    late = failed.late if failed is not None else None
    st.op = None
    if (failed is not None and failed.opid is not None and isinstance(exc, LINK_ERRORS)
            and not unsent(exc)):
        # The link broke with this call's reply outstanding: the script may have run and
        # granted what the books will never hold (renewed with the owner's other levels
        # or permits, or, for a lock, left to its ttl). Nothing can be asked over a broken
        # link; the owner's next acquire asks the op record first (see _settle).
        prim._unsettle(owner, count, failed.opid, grant=True)
    give_back = late is not None and late.granted and late.status != PASSED
    waiter = st.waiter
    if waiter is not None and hub is not None and hub.claim(waiter, leaving=True):
        give_back = True  # handed over just as the wait ended: nobody recorded it
    try:
        if give_back:
            yield Op(CALL, prim._release_call(owner, count))
            log.debug("%s: grant to %s given back while unwinding", prim._describe(), owner)
        elif (st.queued or (waiter is not None and waiter.named)) and (
            waiter is not None and hub is not None
        ):
            if isinstance(exc, LINK_ERRORS):
                return  # the link is down: the entry ends with its lease
            yield from _leave(prim, owner, hub, waiter, st)
    except BaseException:  # noqa: BLE001 - the first exception is what propagates
        log.debug("%s: clean-up of %s left to leases", prim._describe(), owner)
    det = st.detector
    if det is not None and det.seq is not None and not isinstance(exc, LINK_ERRORS):
        try:
            yield from _drop_edge(det)
        except BaseException:  # noqa: BLE001 - the first exception is what propagates
            log.debug("deadlock edge of %s left to its lease", owner)
