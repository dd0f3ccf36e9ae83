"""Acquire, release and extend, written once without I/O (generators of :mod:`.steps`).

Acquire: a re-entry (the owner already holds a lock, through any object) is one call
that adds a level. A fresh acquire asks the acquire script; granted, it returns (unless
the answer came after the lease it granted may have ended: then it gives the grant back
and asks again). Not granted, the script has queued it (the queue orders waiters: first
come, first served), and it waits for a wake-up hint or the script's "ask again" time,
whichever is first, and asks again; each ask renews its place. It gives up at its
deadline: its place goes (``leave``), and if it was at the head, the next waiter is woken.
A script grants only to the caller that sent it, so nothing is ever granted to a waiter
that is gone.

Every call says what it expects to find (the owner's count before it), so a call sent
again after a lost reply is recognised: applied already (the reply says so, status 2),
applied now, or refused. That is what lets :func:`.steps.call` send calls again after a
broken link, a server restart or a failover, within the caller's deadline: the caller is
not told about a failure whose outcome can be known. A release of the last level sent
again finds nothing to release either way (released by an earlier send, or lost before):
an earlier send that may have run is taken to have released it; when every earlier send
surely did not run (refused by the server, or no connection: :func:`.steps.refused`), the
hold was lost before, and the release says so.

A hold's lease is counted from the send of the call that granted it (the first send, if
it was sent again), so this process never believes a lease longer than Redis keeps it.
"""

from __future__ import annotations

import logging
from typing import Any, Generator, List, Optional, Tuple

from .. import errors
from . import metrics, wakeups
from .clock import monotonic
from .holds import GONE as HOLD_GONE
from .holds import HELD as HOLD_HELD
from .holds import LOST as HOLD_LOST
from .holds import Hold
from .renewal import renewer_for
from .scripts import DONE, LOST, MISMATCH, NOT_SENT, OVER, UPGRADE, Reply
from .steps import Enlist, Interrupted, Listen, NoTurn, Pause, Read, Run, call, transient

__all__ = ["RELEASE_PATIENCE", "acquire", "books", "extend", "release", "release_permits",
           "repair"]

log = logging.getLogger(__name__)

Steps = Generator[Any, Any, Any]

#: s a release sends its call again after a broken link (within the hold's lease).
RELEASE_PATIENCE = 5.0


def _record(p: Any, owner: str, hold: Hold, reply: Reply, sent: float) -> None:
    """A grant (``reply``) of a call sent at ``sent``: into the hold and the object's books."""
    if hold.count <= 0 or not hold.alive:
        hold.granted_now(sent, p._ttl, reply.b or None)
        hold.tokens = reply.tokens or ((reply.b,) if reply.b else None)
        hold.count = 1
    else:
        hold.count += 1
        hold.ttl = max(hold.ttl, p._ttl)
        hold.renewed(sent, p._ttl)
    p._took(owner, hold)
    hold.renew_call = p._spec.renew(p, owner, round(hold.ttl * 1000))
    if p._auto_renew:
        renewer_for(p._backend, p._aio).add(hold)


def _acquire_call(p: Any, owner: str, expect: int, entry_ms: int) -> Any:
    """The acquire call; on a Quorum, with what gives its grant back."""
    c = p._spec.acquire(p, owner, expect, entry_ms)
    if not p._backend.queues:
        c.undo = p._spec.release(p, owner, expect + 1)
        c.ttl_ms = p._ttl_ms
    return c


def _refused(p: Any, reply: Reply) -> BaseException:
    if reply.status == UPGRADE:
        return errors.UpgradeError(
            f"{p._label}({p._shown}): this thread holds the read side and asks for the write "
            "side: an upgrade would deadlock with another reader doing the same; release the "
            "read side first", name=p._name)
    if reply.status == MISMATCH:
        stored = "BoundedSemaphore" if reply.b == 1 else "Semaphore"
        mine = "BoundedSemaphore" if p._spec.bounded else "Semaphore"
        return ValueError(
            f"{p._describe()}: Redis holds this name as a {stored} with initial value "
            f"{reply.a}, but this object is a {mine} with initial value {p._spec.value}; "
            "nothing was changed")
    if reply.status == OVER:
        return ValueError(f"{p._label}({p._shown}): Semaphore released too many times")
    return errors.RLocksError(f"{p._label}({p._shown}): unexpected reply {reply}", name=p._name)


def _give_back(p: Any, owner: str, hold: Hold, count: int) -> Steps:
    """Undo a grant this caller will not keep (interrupted, short of its replicas, or
    answered too late): the owner held ``count`` with it. Best effort: a failure leaves
    it to end with its lease. Returns whether Redis answered."""
    try:
        if p._spec.kind == "sem":
            c = p._spec.release_permits(p, owner, 1, ((owner, count, 1),))
        else:
            c = p._spec.release(p, owner, count)
        reply = yield Run(p._backend, c)
        wakeups.wake_local(p._keys.hash, reply.woken)
    except BaseException:  # noqa: BLE001 - interrupted again, or no link: its lease ends it
        return False
    return True


def _settle(p: Any, owner: str, hold: Hold, reply: Optional[Reply], expect: int) -> Steps:
    """An acquire interrupted while its call was on its way: give back what it was
    granted (``reply``; None: not known, so read the owner's count)."""
    if reply is not None:
        if reply.ok:
            yield from _give_back(p, owner, hold, expect + 1)
        return
    try:
        found = yield Read(p._backend, ("HGET", p._keys.hash, p._spec.field(owner)))
    except BaseException:  # noqa: BLE001 - no link: any grant ends with its lease
        return
    if found is not None and int(found) == expect + 1:
        yield from _give_back(p, owner, hold, expect + 1)


def acquire(p: Any, owner: str, wait: Optional[float],
            keepalive: Optional[Tuple[Any, float]] = None) -> Steps:
    """Acquire for ``owner``; ``wait``: seconds (None: for ever, 0: just try). Returns
    whether it was granted. ``keepalive``: (a call, a period): sent at least that often
    while it waits (a Condition's notified entry, renewed while its lock is taken back)."""
    hold = p._hold(owner)
    if hold.count > 0 and hold.state == HOLD_LOST:
        raise p._lost_error(hold, "acquired again")
    if hold.count > 0 and p._spec.kind != "sem":
        return (yield from _reenter(p, owner, hold))
    return (yield from _wait_for_grant(p, owner, hold, wait, keepalive))


def _replicated(p: Any, owner: str, hold: Hold, reply: Reply, expect: int) -> Steps:
    """A grant (first or re-entry) short of the replicas asked for is given back and
    raised: a failover could lose it (a lost re-entry level would let the outer release
    free the lock early)."""
    if 0 <= reply.replicas < p._replication[0]:
        yield from _give_back(p, owner, hold, expect + 1)
        raise errors.ReplicationError(
            f"{p._label}({p._shown}): granted, but only {reply.replicas} of "
            f"{p._replication[0]} replicas acknowledged it within "
            f"{p._replication[1]} ms; it was given back", name=p._name,
            acknowledged=reply.replicas, required=p._replication[0])


def _reenter(p: Any, owner: str, hold: Hold) -> Steps:
    expect = hold.count
    sent = monotonic()
    try:
        reply = yield from call(p._backend, _acquire_call(p, owner, expect, 0), hold.lease_end)
    except Interrupted as interrupt:
        yield from _settle(p, owner, hold, interrupt.reply, expect)
        raise interrupt.cause from None
    if reply.ok:
        yield from _replicated(p, owner, hold, reply, expect)
        _record(p, owner, hold, reply, sent)
        return True
    if reply.status == LOST:
        hold.lose("it was gone from Redis at re-entry")
        raise p._lost_error(hold, "acquired again")
    raise _refused(p, reply)


def _wait_for_grant(p: Any, owner: str, hold: Hold, wait: Optional[float],
                    keepalive: Optional[Tuple[Any, float]] = None) -> Steps:
    start = kept = monotonic()
    deadline = None if wait is None else start + wait
    backend, spec = p._backend, p._spec
    queues = wait != 0 and backend.queues
    entry_ms = p._entry_ms if queues else 0
    waiter: Any = None
    queued = granted = waited = False
    detector: Any = None
    pause = 0.01
    gate = p._gate() if wait != 0 else None
    broken = False
    try:
        while True:
            # Read afresh: another thread may give back this owner's permits (semaphores).
            expect = hold.count
            sent = monotonic()
            queued = queued or queues  # (set before the call: an interrupt may strike in it)
            try:
                attempt = _acquire_call(p, owner, expect, entry_ms)
                attempt.gate, attempt.until = gate, deadline
                reply = yield from call(backend, attempt, deadline)
            except Interrupted as interrupt:
                yield from _settle(p, owner, hold, interrupt.reply, expect)
                raise interrupt.cause from None
            except NoTurn:
                return False  # its deadline came while others' calls held every turn
            if reply.ok:
                yield from _replicated(p, owner, hold, reply, expect)
                if monotonic() >= sent + p._ttl:
                    # Its answer came after the lease it granted may have ended (counted
                    # from the send): another owner may hold it by now. Given back, and
                    # asked for again.
                    if not (yield from _give_back(p, owner, hold, expect + 1)):
                        broken = True  # (no leave either: its entry ends with its lease)
                    if broken or deadline is not None and monotonic() >= deadline:
                        return False
                    continue
                granted = True
                _record(p, owner, hold, reply, sent)
                if waited:
                    metrics.wait_over(True)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s acquired by %s (count %d) after %.3f s", p._describe(),
                              owner, hold.count, monotonic() - start)
                return True
            if reply.status == LOST:
                if hold.count != expect:
                    continue  # another thread gave some of them back meanwhile: ask again
                hold.lose("its earlier permits were gone from Redis when it asked for more")
                raise p._lost_error(hold, "acquired again")
            if reply.status != 0:
                raise _refused(p, reply)
            now = monotonic()
            if deadline is not None and now >= deadline:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s: %s waited %.3f s, gave up", p._describe(), owner,
                              now - start)
                return False
            if not waited:
                waited = True
                metrics.wait_began(p, start)
            left = None if deadline is None else deadline - now
            if not backend.queues:
                pause = min(pause * 2, 0.2)
                yield Pause(_shorter(pause, left))
                continue
            if waiter is None:
                waiter = yield Enlist(backend, p._keys.wake, p._keys.hash, owner, deadline)
                if waiter.fresh:
                    continue  # its subscriber was not listening: a hint may be lost
            if p._deadlock_timeout is not None and now - start >= p._deadlock_timeout:
                if detector is None:
                    from .deadlock import Detector
                    detector = Detector(p, owner, deadline)
                yield from detector.check()
            if keepalive is not None and now - kept >= keepalive[1]:
                kept = now
                try:
                    yield Run(backend, keepalive[0])
                except BaseException as exc:  # noqa: BLE001 - the link: tried again next time
                    if isinstance(exc, Interrupted):
                        raise exc.cause from None
            timeout = min(reply.a / 1000.0, p._entry_ms / 3000.0)
            if p._deadlock_timeout is not None:
                due = detector.wait.due if detector is not None else start + p._deadlock_timeout
                timeout = min(timeout, max(0.0, due - now))
            yield Listen(waiter, _shorter(timeout, left))
    except BaseException as exc:
        # Redis out of reach: the tidying below would wait a socket timeout each on the
        # same link, past the promised bound (the wait's time plus one socket timeout).
        # Its queue entry and wait-for edge end with their leases instead.
        broken = transient(exc)
        raise
    finally:
        if waiter is not None:
            waiter.close()
        if detector is not None and not broken:
            yield from detector.end()
        if queued and not granted and not broken:
            try:
                reply = yield Run(backend, spec.leave(p, owner))
                wakeups.wake_local(p._keys.hash, reply.woken)
            except BaseException:  # noqa: BLE001 - its place ends with its entry lease
                pass
        if waited and not granted:
            metrics.wait_over(False)


def _shorter(a: float, b: Optional[float]) -> float:
    return max(0.0, a if b is None else min(a, b))


def _unsent(sends: List[bool], reply: Optional[Reply]) -> bool:
    """Whether a call that raised surely never reached Redis: never sent, or sent once and
    interrupted before it went (``scripts.NOT_SENT``)."""
    return not sends or (len(sends) == 1 and reply is not None and reply.status == NOT_SENT)


OUTLIVED = "its release could not reach Redis before its lease ended"


def _outlived(exc: BaseException, reply: Optional[Reply], hold: Hold) -> bool:
    """Whether a last release that failed on the link, unanswered, did so once the hold's
    lease had ended as far as this process knows (no renewal confirmed it longer): no
    call can release it any more and whoever asks next may be granted it (a failover may
    have lost it before), so its holder is told it was lost rather than of the link's
    error (which would leave the loss untold: no renewal follows a dropped hold)."""
    return (reply is None and not isinstance(exc, Interrupted) and transient(exc)
            and monotonic() >= hold.lease_end)


def _drop(p: Any, owner: str, hold: Hold, n: int = 1) -> None:
    hold.count -= n
    p._gave(owner, n)


def release(p: Any, owner: str) -> Steps:
    """Give back one level the owner took through this object (RLock, RWLock side).

    Sent again after a broken link for up to :data:`RELEASE_PATIENCE` (within the lease);
    with no answer by then, the level is dropped from the books and the error raised: the
    lease ends the hold in Redis. Interrupted before anything was sent, nothing changes."""
    if p._levels(owner) == 0:
        raise p._not_owned()
    hold = p._hold(owner)
    if hold.state == HOLD_LOST:
        _drop(p, owner, hold)
        raise p._lost_error(hold)
    expect = hold.count
    last = expect == 1
    if last and not hold.claim_release():
        # Another thread's release of it is on its way (a Lock any thread may release):
        # as threading's second release, this one finds the lock not held.
        raise p._not_owned()
    sends: List[bool] = []
    until = min(hold.lease_end, monotonic() + RELEASE_PATIENCE)
    try:
        reply = yield from call(p._backend, p._spec.release(p, owner, expect), until, sends)
    except BaseException as exc:
        reply = exc.reply if isinstance(exc, Interrupted) else None
        if _unsent(sends, reply):  # nothing reached Redis: still held
            if last:
                hold.cancel_release()
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            raise
        if reply is not None and reply.status == LOST:
            hold.lose("it was gone from Redis at release")
        elif last and _outlived(exc, reply, hold):
            hold.lose(OUTLIVED)
            _drop(p, owner, hold)
            raise p._lost_error(hold) from exc
        elif last:
            hold.end_release(answered=reply is not None)
        _drop(p, owner, hold)  # (after the report: on_lost goes to its holding objects)
        if isinstance(exc, Interrupted):
            raise exc.cause from None
        raise
    if reply.status == LOST and last and any(sends[:-1]):
        reply = Reply(DONE)  # sent again: an earlier send released it (see the docstring)
    if reply.status == LOST:
        hold.lose("it was gone from Redis at release")
        _drop(p, owner, hold)
        raise p._lost_error(hold)
    if not reply.ok:
        if last:
            hold.cancel_release()
        raise _refused(p, reply)
    _drop(p, owner, hold)
    if last:
        hold.end_release(answered=True)
        metrics.hold_ended(p, hold.granted, "released")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s released by %s (count 0)", p._describe(), owner)
    wakeups.wake_local(p._keys.hash, reply.woken)
    return None


def release_permits(p: Any, owner: str, n: int) -> Steps:
    """Give ``n`` permits back (a semaphore): the owner's own taken through this object
    first, then other owners' of this process taken through it; the rest are nobody's.

    Other owners' permits come off their books before the call (their own acquires read
    their count afresh), and go back on if the release is refused."""
    taking: List[Tuple[str, Hold, int]] = []
    left = n
    for who in [owner] + [o for o in list(p._mine) if o != owner]:
        levels = p._levels(who)
        if left <= 0 or levels <= 0:
            continue
        take = min(left, levels)
        taking.append((who, p._hold(who), take))
        left -= take
    if taking and taking[0][0] == owner and taking[0][1].state == HOLD_LOST:
        who, hold, take = taking[0]
        _drop(p, who, hold, take)
        raise p._lost_error(hold)
    taking = [t for t in taking if t[1].state != HOLD_LOST]  # others': back in the pool
    triples = tuple((who, hold.count, take) for who, hold, take in taking)
    others = [t for t in taking if t[0] != owner]
    mine = [t for t in taking if t[0] == owner]
    for who, hold, take in others:
        _drop(p, who, hold, take)
    for _, hold, take in mine:
        if hold.count == take:
            hold.begin_release()
    until = min([h.lease_end for _, h, _ in mine] + [monotonic() + RELEASE_PATIENCE])
    sends: List[bool] = []
    try:
        reply = yield from call(p._backend, p._spec.release_permits(p, owner, n, triples),
                                until, sends)
    except BaseException as exc:
        reply = exc.reply if isinstance(exc, Interrupted) else None
        if _unsent(sends, reply):
            # nothing reached Redis: all stays as it was
            for who, hold, take in others:
                p._took(who, hold, take)
                hold.count += take
            for _, hold, _ in mine:
                hold.cancel_release()
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            raise
        if reply is not None and reply.status == LOST and 0 < reply.a <= len(taking):
            # (interrupted, its answer learned after: the permits it names were gone)
            taking[reply.a - 1][1].lose("its permits were gone from Redis at release")
        outlived = None
        for who, hold, take in mine:  # else no answer: off the books, its lease ends it
            if hold.count <= take:
                if _outlived(exc, reply, hold):
                    hold.lose(OUTLIVED)
                    outlived = hold
                else:
                    hold.end_release(answered=reply is not None)
            _drop(p, who, hold, take)
        if outlived is not None:
            raise p._lost_error(outlived) from exc
        if isinstance(exc, Interrupted):
            raise exc.cause from None
        raise
    if (reply.status == LOST and reply.a == 1 and mine and any(sends[:-1])
            and mine[0][1].count == mine[0][2]):
        reply = Reply(DONE)  # sent again, its last permits: an earlier send released them
    if reply.ok:
        for who, hold, take in mine:
            _drop(p, who, hold, take)
        for _, hold, _ in taking:
            if hold.count <= 0:
                hold.end_release(answered=True)
                metrics.hold_ended(p, hold.granted, "released")
        wakeups.wake_local(p._keys.hash, reply.woken)
        return None
    for who, hold, take in others:  # nothing was given back: theirs again
        p._took(who, hold, take)
        hold.count += take
    if reply.status == LOST:
        who, hold, take = taking[reply.a - 1]
        if who == owner:
            hold.lose("its permits were gone from Redis at release")
            _drop(p, who, hold, take)
            raise p._lost_error(hold)
        # Another thread's permits ended meanwhile: they are back in the pool already, so
        # this release has given those back; that thread's hold is lost (it is told).
        # The rest is released again without them.
        for _, own, _ in mine:
            own.cancel_release()
        hold.lose("its permits were gone from Redis when another thread released them")
        _drop(p, who, hold, take)
        if n - take <= 0:
            return None
        return (yield from release_permits(p, owner, n - take))
    for _, hold, _ in mine:
        hold.cancel_release()  # refused: nothing was given back
    raise _refused(p, reply)


def extend(p: Any, owner: str, ttl_ms: int) -> Steps:
    """Make the owner's hold last at least ``ttl_ms`` more (never shortened)."""
    hold = p._hold(owner)
    if hold.count <= 0 or p._levels(owner) <= 0:
        raise p._not_owned("extend")
    if hold.state == HOLD_LOST:
        raise p._lost_error(hold, "extended")
    sent = monotonic()
    try:
        reply = yield from call(p._backend, p._spec.renew(p, owner, ttl_ms), hold.lease_end)
    except Interrupted as interrupt:
        raise interrupt.cause from None
    if reply.ok:
        hold.renewed(sent, ttl_ms / 1000.0)
        if p._auto_renew:
            renewer_for(p._backend, p._aio).add(hold)  # its renewal time moved
        return None
    if reply.status == LOST:
        hold.lose("it was gone from Redis when extended")
        raise p._lost_error(hold, "extended")
    raise _refused(p, reply)



def release_save(p: Any, owner: str) -> Steps:
    """``threading``'s ``_release_save``: give back every level ``owner`` took through ``p``
    (and through the lock ``p`` names in ``_held_with``: a writer's read side); returns
    what :func:`acquire_restore` takes back. RuntimeError, changing nothing, when the owner
    also holds the lock through another object of its name (only that object could give
    its levels back). Interrupted part way, it takes back what it gave up, then raises
    (a loss found on the way is raised as it is: there is nothing to take back)."""
    count = p._levels(owner)
    if count == 0:
        raise p._not_owned()
    inner = p._held_with()
    check_restorable(p, owner)
    inner_count = inner._levels(owner) if inner is not None else 0
    try:
        for lock, levels in ((inner, inner_count), (p, count)):
            for _ in range(levels):
                yield from release(lock, owner)
    except errors.LockLostError:
        raise
    except BaseException:
        for lock, levels in ((p, count), (inner, inner_count)):
            if lock is not None:
                for _ in range(levels - lock._levels(owner)):
                    yield from acquire(lock, owner, None)
        raise
    return count, owner, inner_count


def check_restorable(p: Any, owner: str) -> None:
    """RuntimeError (no I/O) when ``owner`` holds ``p`` (or its ``_held_with`` lock) also
    through another object of its name: a Condition wait could not give those back."""
    for lock in (p, p._held_with()):
        if lock is not None and lock._hold(owner).count > lock._levels(owner):
            raise RuntimeError(
                f"{lock._describe()}: this thread also holds the lock through another object "
                "of its name, whose levels a Condition wait on this one cannot give back; "
                "wait on a Condition of an object that holds every level")


def acquire_restore(p: Any, owner: str, state: Tuple[int, str, int],
                    keepalive: Optional[Tuple[Any, float]] = None) -> Steps:
    """Take back, blocking as long as it takes, what :func:`release_save` gave up: never a
    deadlock's victim (it must return holding, as ``threading.Condition.wait`` does).
    ``keepalive``: as for :func:`acquire`."""
    count, _, inner_count = state
    inner = p._held_with()
    for lock, levels in ((p, count), (inner, inner_count)):
        if lock is None or not levels:
            continue
        lock._restoring.add(owner)
        try:
            for _ in range(levels):
                yield from acquire(lock, owner, None, keepalive)
        finally:
            lock._restoring.discard(owner)
            metrics.wait_closed()


# -- after an interrupt -------------------------------------------------------------------

Books = List[Tuple[str, Hold, int, int]]


def books(p: Any, owners: List[str]) -> Books:
    """What the books say of ``owners`` now (each: its hold, the hold's count, the levels
    it took through ``p``), for :func:`repair` should the operation be interrupted."""
    holds = [(o, p._hold(o)) for o in owners]
    return [(o, hold, hold.count, p._levels(o)) for o, hold in holds]


def repair(p: Any, before: Books, acquiring: bool) -> Steps:
    """Make Redis and the books agree after an exception from outside rlocks and Redis
    (a signal handler's: Ctrl-C, an alarm) escaped an acquire or a release of ``p`` at an
    unknown point: in the middle of a call or of the bookkeeping after it.

    An acquire ends as if it had not happened: a level Redis granted is given back, the
    owner leaves the queue, the books are as ``before``. A release ends as Redis says:
    given back or not, the books follow (and the hold is held, or gone; never left
    releasing). Redis is read after the interrupted call has surely run or surely not
    (``scripts._fence``), so what it says is final. Unreachable Redis: the books are put
    back as ``before`` for an acquire (a grant ends with its lease), and a release is
    taken as done (its hold ends with its lease)."""
    backend, spec = p._backend, p._spec
    for owner, hold, count, levels in before:
        try:
            found = yield Read(backend, ("HGET", p._keys.hash, spec.field(owner)))
            now = int(found or 0)
        except BaseException:  # noqa: BLE001 - no link (or interrupted again)
            now = count if acquiring else max(0, count - 1)
        if acquiring:
            if now > count:
                yield from _give_back(p, owner, hold, now)
            if backend.queues:
                try:
                    reply = yield Run(backend, spec.leave(p, owner))
                    wakeups.wake_local(p._keys.hash, reply.woken)
                except BaseException:  # noqa: BLE001 - its entry ends with its lease
                    pass
            _set_books(p, owner, hold, count, levels)
            if now < count:
                hold.lose("it was gone from Redis when an interrupted acquire looked")
        else:
            _set_books(p, owner, hold, now, max(0, levels + now - count))


def _set_books(p: Any, owner: str, hold: Hold, count: int, levels: int) -> None:
    """The hold has ``count`` levels in all, ``levels`` of them taken through ``p``."""
    hold.count = count
    if levels > 0:
        p._mine[owner] = (hold, levels)
        hold.objects.add(p)
    else:
        p._mine.pop(owner, None)
        hold.objects.discard(p)
    hold.pending = None
    if hold.state == HOLD_LOST:
        return
    hold.state = HOLD_HELD if count > 0 else HOLD_GONE
    if count > 0 and p._auto_renew and hold.renew_call is not None:
        renewer_for(p._backend, p._aio).add(hold)
