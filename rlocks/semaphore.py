"""``rlocks.Semaphore`` and ``rlocks.BoundedSemaphore``: ``threading``'s semaphores across
processes and hosts.

One Redis hash per semaphore (layout in ``_engine/lua/queue_lib.lua``): the free count, the
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
from typing import Any, Callable, Dict, Generator, List, Optional, Sequence, Tuple

from redis.exceptions import ResponseError

from ._engine import checks, metrics
from ._engine.clock import monotonic
from ._engine.constructors import public_init
from ._engine.dialogue import drive
from ._engine.primitive import ENTRY_LEASE, Options, Primitive, SyncPrimitive
from ._engine.scripts import OVER, Arg, Call, Reply, foreign, load_queued, new_op
from ._engine.state import PrimitiveState
from ._engine.wakehub import serial
from .errors import LockLostError, RLocksError

__all__ = ["Semaphore", "BoundedSemaphore"]

# Lua numbers are doubles: counts above 2**53 would silently lose precision.
_COUNT_MAX = 2**53 - 1
_MISMATCH = "RLOCKS_SEM_MISMATCH"


def _count(value: object, what: str, label: str) -> int:
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{label}: {what} must be an int, not {type(value).__name__}") from None
    if number > _COUNT_MAX:
        raise ValueError(f"{label}: {what} must be at most 2**53 - 1, got {number}")
    return number


#: A release's round trips (see ``_SemaphoreCore._release_steps``): yields (call, op id),
#: is sent each reply.
ReleaseSteps = Generator[Tuple[Call, str], Reply, None]


class _Release:
    """One release in progress (no I/O): what goes back to the pool, whose permits."""

    __slots__ = ("owner", "give", "takes", "ended", "call")

    def __init__(self, owner: str, n: int) -> None:
        self.owner = owner  # who called release()
        self.give = n  # permits to add to the free count
        # (owner, permits) taken off owners' records: the caller's first, then others'
        self.takes: List[Tuple[str, int]] = []
        # owner -> grant time, for holds this release ends: their duration is recorded
        # when the release is over, as a refusal restores them (see _SemaphoreCore._ended)
        self.ended: Dict[str, float] = {}
        self.call: Optional[Call] = None


class _SemaphoreCore(Primitive):
    """What a semaphore is, without I/O: hash layout, scripts, arguments, reply handling.

    Shared by :class:`Semaphore` and ``rlocks.asyncio.Semaphore``, which add their
    surfaces and say who the owner is (the thread, or the task).
    """

    __slots__ = ("_value",)

    _label = "rlocks.Semaphore"
    _kind = "sem"
    _bounded = 0
    _acquire_script = load_queued("sem_acquire")
    _release_script = load_queued("sem_release")
    _renew_script = load_queued("sem_renew")
    _leave_script = load_queued("sem_leave")
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
        label = f"{self._label}({name!r})"
        value = _count(value, "value", label)
        if value < 0:
            raise ValueError(f"{label}: semaphore initial value must be >= 0, got {value}")
        self._configure(name, Options.of(locals()))
        self._value = value

    @property
    def value(self) -> int:
        """The initial value this object was built with (no I/O)."""
        return self._value

    # -- script arguments (see the headers of the sem_*.lua files) -----------------------

    def _kind_context(self) -> Tuple[Arg, ...]:
        return (self._value, self._bounded)

    def _acquire_arguments(
        self, owner: str, count: int, reentry: bool, entry: Optional[str], listen: bool = False
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        # Permits are counted, not nested: holding some already changes nothing here.
        # The taking thread (task) owns the permits and is the waiter named in wake-ups.
        args = (owner, owner, self._entry_id(entry), self._ttl_ms, count,
                self._queue_flag(entry, listen))
        return self._keys.queued(), (*self._context(), *args)

    def _leave_arguments(
        self, owner: str, entry: str, ask: Optional[Tuple[str, str, int]] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        # (the next waiter is also the owner its permits go to, as in acquire)
        args: Tuple[Arg, ...] = (owner, owner, entry, "")
        if ask is not None:
            args = (owner, owner, entry, ask[0], ask[2])
        return self._keys.queued(), (*self._context(), *args)

    def _queues_locally(self, owner: str) -> bool:
        # Permits are not re-entered: an owner holding some waits for more like anyone
        # else, behind this process's earlier waiters (one queue entry per wake-up hub);
        # with fair=False it tries first, as any other barger does.
        return self._fair

    def _release_arguments(
        self, owner: str, count: int
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        # The owner's own permits, as the owner's: what the engine gives back of a grant
        # it does not keep. (release() may also give back other threads' permits, or
        # nobody's: see _release_step.)
        return self._release_pairs(count, ((owner, count),))

    def _release_pairs(
        self, give: int, takes: Sequence[Tuple[str, int]]
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        """KEYS and ARGV of sem_release.lua: ``give`` permits back, ``takes`` the (owner,
        count) pairs they come off."""
        return self._keys.queued(), (*self._context(), give, *(p for t in takes for p in t))

    def _renew_arguments(
        self, owner: str, lease_ms: Optional[int] = None
    ) -> Tuple[Sequence[str], Sequence[Arg]]:
        call = self._items_call(self._renew_items(owner), lease_ms)
        return call.keys, call.args

    def _lost_reply_check(self, owner: str) -> Optional[Call]:
        # An owner may already hold permits when it waits for more (acquire is counted,
        # not nested), and the renew script answers its total: a lost grant could only be
        # told apart by comparing counts, which the engine does not do yet. So a waiter
        # does not retry after a lost reply (see docs/operations.md).
        return None

    def _begin_permit_release(self, owner: str, n: int) -> Optional["_Release"]:
        """The I/O-free start of a release by ``owner``: the first call to make, or None
        when nothing needs to be sent (every permit it gives back was lost already).

        Raises TypeError/ValueError for a bad ``n`` and LockLostError when the caller's
        own permits are known lost (they come off the local books), all before any I/O.
        """
        label = self._describe()
        n = _count(n, "n", label)
        if n < 1:
            raise ValueError(f"{label}: n must be one or more")
        release = _Release(owner, n)
        # Permits come off the local books before the I/O, so the local count never
        # exceeds Redis's and the renewer never sees a permit Redis lacks unless it
        # really was lost.
        own, lost = self._release_locally(owner, n, release.ended)
        if lost:
            raise self._lost_error()
        if own:
            release.takes.append((owner, own))
        left = n - own
        if left:
            # threading lets any thread release another's permit: take them from other
            # threads of this process, live ones first (a fork child's copy still lists
            # its parent's threads: they are not this process's, see _holds_here).
            # Permits already known lost are back in the pool: releasing one sends
            # nothing (the loss was reported when it was found, to the thread that took
            # it).
            holds = self._holds_here()
            others = [o for o, h in holds if o != owner and not h.lost]
            others += [o for o, h in holds if o != owner and h.lost]
            for other in others:
                taken, was_lost = self._release_locally(other, left, release.ended)
                left -= taken
                if was_lost:
                    release.give -= taken
                elif taken:
                    release.takes.append((other, taken))
                if not left:
                    break
        return self._release_step(release)

    def _release_step(self, release: "_Release") -> Optional["_Release"]:
        """``release`` with its next call built; None when there is nothing to send."""
        if release.give < 1:
            return None
        takes = tuple(release.takes)
        give = release.give
        release.call = self._prepared(
            ("release", give, takes),
            self._release_script,
            lambda: self._release_pairs(give, takes),
        )
        return release

    def _grant_refusal(self, owner: str, count: int, reply: Reply) -> Optional[BaseException]:
        """Also refuse a grant that landed after this owner's earlier permits were lost.

        Redis counts the owner's permits after the grant; fewer than the local books plus
        this grant means the earlier ones are gone (lease ended, key deleted) and were
        re-created from nothing by this grant. Keeping it would hide that loss behind a
        live record, so the new permit goes back and the loss is reported to the owner.
        """
        refusal = super()._grant_refusal(owner, count, reply)
        if refusal is not None or not reply.granted:
            return refusal
        hold = self._holds.get(owner)
        known_lost = hold is not None and hold.lost
        if known_lost or reply.holds < self._held_by_all_objects(owner) + count:
            if not known_lost:
                self._hold_lost(owner, "its permits were gone when it was granted another")
            err = LockLostError(
                f"{self._describe()}: this owner's earlier permits were lost (lease ended or "
                "key removed), so the permit just granted was given back; release the lost "
                "ones first",
                name=self._name,
            )
            err.lock = self  # type: ignore[attr-defined]  # as _lost_error(): for __exit__
            return err
        return None

    _hold_proves_grant = False

    def _release_failed(
        self, step: Optional["_Release"], op: str, exc: BaseException
    ) -> None:
        """The call ``op`` (its op id) of release ``step`` failed with ``exc``, not a
        refusal: after a Redis error, mark the permits it was taking off each owner's
        record (the caller's, and other threads' it released) for that owner's next
        acquire to settle: they may still be in Redis. No I/O."""
        if step is None or not isinstance(exc, Exception) or foreign(exc):
            return
        for owner, count in step.takes:
            self._unsettle(owner, count, op)

    def _checks_hand_over(self, owner: str) -> bool:
        # The lost-permit check compares the owner's count on the server with its books:
        # only an owner with permits on the books (or known lost) can fail it.
        if super()._checks_hand_over(owner):
            return True
        hold = self._holds.get(owner)
        return (hold is not None and hold.lost) or self._held_by_all_objects(owner) > 0

    def _release_refused(self, release: "_Release", since: float, exc: ResponseError) -> Exception:
        # Redis refused with an error reply and changed nothing: the permits are theirs.
        self._unreserve(release, since)
        return self._translate(exc)

    def _finish_permit_release(
        self, release: "_Release", since: float, reply: Reply
    ) -> Optional["_Release"]:
        """The I/O-free end of one release call: None when done, or the release to send
        again; refusals and the caller's own losses become exceptions."""
        if reply.granted:
            return None
        if reply.status == OVER:
            self._unreserve(release, since)
            raise ValueError(f"{self._describe()}: Semaphore released too many times")
        index = reply.value - 1
        if not 0 <= index < len(release.takes):
            raise RLocksError(f"{self._describe()}: unexpected release reply {reply}")
        lost_owner, count = release.takes.pop(index)
        granted = release.ended.pop(lost_owner, None)
        if granted is not None:  # its duration ended at the loss, not at this release
            metrics.hold_ended(self, granted, "lost")
        # Nothing was changed: the other permits listed are still held by their owners.
        self._report_permits_lost(lost_owner)
        if lost_owner == release.owner:
            self._unreserve(release, since)
            raise self._lost_error()
        # Another thread's permit that this caller released was gone already, back in
        # the pool by its lease's end: that loss is its owner's news; release the rest.
        release.give -= count
        return self._release_step(release)

    def _report_permits_lost(self, owner: str) -> None:
        reason = "its permits were gone at release"
        if self._held(owner) > 0:
            self._hold_lost(owner, reason)  # its other permits are gone too: one record
        else:
            # Every local permit came off the books before the call, so _hold_lost would
            # find nothing to mark: report the loss here, as a renewal would have.
            self._report_lost(owner, reason)

    # -- local bookkeeping of permits ----------------------------------------------------

    def _unreserve(self, release: "_Release", since: float) -> None:
        # Redis refused the release and changed nothing: those permits are held again,
        # each hold as the one it was (granted when it was), not a new one.
        for owner, count in release.takes:
            self._record_grant(owner, count, since)
            granted = release.ended.pop(owner, None)
            hold = self._holds.get(owner)
            if granted is not None and hold is not None:
                hold.granted = granted

    def _release_steps(self, begun: Optional["_Release"], stream: str) -> ReleaseSteps:
        """The round trips of a release that :meth:`_begin_permit_release` began, written once
        for both drivers (see :mod:`._engine.dialogue`): yields each ``(call, op id)``
        (the op id drawn on ``stream``) and is sent its reply.

        Raises what the script's error reply means (the permits stay the owners', see
        :meth:`_release_refused`) and LockLostError; after any other failure the permits
        it was taking are left for each owner's next acquire to settle
        (:meth:`_release_failed`), then the exception goes on.
        """
        step = begun
        op = ""
        try:
            while step is not None and step.call is not None:
                since = monotonic()
                sent = serial()
                op = new_op(stream)
                try:
                    reply = yield step.call, op
                except ResponseError as exc:
                    raise self._release_refused(step, since, exc) from None
                # On any other error (connection...) the reserved permits stay dropped
                # locally, as RLock's release does: renewal stops and their lease runs out.
                step = self._finish_permit_release(step, since, reply)
                self._deliver(reply, sent)
        except (RLocksError, ValueError, TypeError):
            raise  # refused or lost: decided above, the books are as they should be
        except BaseException as exc:
            self._release_failed(step, op, exc)
            raise

    def _ended(self, release: Optional["_Release"]) -> None:
        """The release is over (done, or failed without a refusal): the holds it ended
        locally have ended; record their durations once."""
        if release is None:
            return
        ended, release.ended = release.ended, {}
        for granted in ended.values():
            metrics.hold_ended(self, granted, "released")

    def _translate(self, exc: ResponseError) -> Exception:
        text = str(exc)
        if not text.startswith(_MISMATCH):
            return exc
        try:
            stored_value, stored_bounded = (int(part) for part in text.split()[1:3])
        except ValueError:
            return exc
        stored_kind = "BoundedSemaphore" if stored_bounded == 1 else "Semaphore"
        mine = "BoundedSemaphore" if self._bounded else "Semaphore"
        return ValueError(
            f"{self._describe()}: Redis holds this name as a {stored_kind} with initial "
            f"value {stored_value}, but this object is a {mine} with initial value "
            f"{self._value}; nothing was changed"
        )

    # -- introspection -------------------------------------------------------------------

    def __repr__(self) -> str:
        # Local truth only: no I/O in a repr (the free count lives in Redis).
        held = sum(count for _owner, count in self._local_owners())
        return (
            f"<{self._label} name={self._name!r} namespace={self._namespace!r} "
            f"value={self._value} held here={held} at {id(self):#x}>"
        )


def _ignore(reply: Reply) -> None:
    """An interrupted release's answer: nothing to do with it (see Semaphore.release)."""


class Semaphore(_SemaphoreCore, SyncPrimitive):
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
    default): a release hands its permits over, in the same script, to the oldest
    waiters they cover, and a waiter that wants more than is free blocks those behind it.
    ``fair=False`` lets a free permit go to whoever asks first; a release still wakes
    only as many waiting processes as it frees permits for, and grants them at the first
    release after their patience (100 ms) ends. Every process using the name must pass the
    same ``fair``. ``entry_lease`` (default 2 s) bounds how long a waiting process that
    dies delays the others, as for :class:`rlocks.RLock`.

    Construction validates arguments and does no I/O.
    """

    __slots__ = ()

    _label = "rlocks.Semaphore"

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Take one permit for the calling thread, waiting while none is free.

        Waits forever with ``timeout=None``, at most ``timeout`` seconds otherwise, not at
        all with ``blocking=False``. Returns True once a permit is taken, False if none
        could be had in time.

        Raises, before touching Redis, what ``threading.Semaphore.acquire`` raises for bad
        arguments; LockLostError if this thread's permits were lost (lease ended, key
        deleted) and not all released yet, whether that was known before the call or is
        found by this grant (the new permit is then given back); ValueError if Redis holds
        this semaphore with another initial value or kind. Redis errors propagate.

        In Redis: one off the free count, one onto this thread's permits, its lease
        extended to at least ``ttl``.
        """
        wait = checks.semaphore_wait(blocking, timeout, self._label, self._name)
        try:
            return self._acquire(self._owner(), 1, wait)
        except ResponseError as exc:
            raise self._translate(exc) from None

    __enter__ = acquire

    def release(self, n: int = 1) -> None:
        """Give ``n`` permits back and wake up to ``n`` waiters (per waiting process).

        Any thread may release, whether or not it acquired: the calling thread's permits
        come off its record first, then permits other threads of this process took
        through this object (one whose lease already ended is back in the pool: it is not
        given back twice); the rest is a release of nobody's permit, which adds to the
        free count, as in ``threading.Semaphore``, and which a BoundedSemaphore refuses.

        Raises, without changing anything in Redis: ValueError if ``n < 1``, if a
        BoundedSemaphore would then have more than its initial value in circulation,
        free or held ("Semaphore released too many times": so a process holding nothing
        cannot release a BoundedSemaphore), or if Redis holds this semaphore with another
        initial value or kind; TypeError if ``n`` is not an int; LockLostError if the
        calling thread's own permits were lost (lease ended: they are back in the pool
        already; the local count drops).
        """
        owner = self._owner()
        own, everywhere = self._books(owner)
        begun: Optional[_Release] = None
        try:
            begun = self._begin_permit_release(owner, n)
            # The callback has an interrupted read fenced (see scripts.Call).
            drive(self._release_steps(begun, owner),
                  lambda step: step[0](self._client, _ignore, step[1]))
        except (RLocksError, ValueError, TypeError):
            raise  # refused or lost: decided above, the books are as they should be
        except BaseException as exc:
            mine = min(n, own) if isinstance(n, int) else 0
            if foreign(exc) and mine > 0:
                # Interrupted anywhere (a signal handler's exception): finish giving back
                # the caller's own permits, in the books and in Redis (see
                # Primitive._reconcile). Other threads' permits it was releasing are
                # left as the interrupt found them: theirs to find lost or release.
                self._roll_back(owner, (own - mine, everywhere - mine))
                self._reconcile(owner, mine)
            raise
        finally:
            # What a refusal restored is no longer in it: the rest did end here.
            self._ended(begun)

    def owned(self) -> bool:
        """Whether the calling thread holds a permit, as far as it knows (local state, no
        I/O). Permits are accounted to the thread that took them, so this is False in a
        thread that took none (even if it may release another's); False once the
        thread's permits are known lost.
        """
        return self._owns(self._owner())

    def extend(self, ttl: Optional[float] = None) -> None:
        """Make the calling thread's permits last at least ``ttl`` seconds from now (one
        round trip); ``None`` means the semaphore's own ``ttl``.

        For ``auto_renew=False``. Only this thread's lease changes, and it is never
        shortened: a smaller ``ttl`` than what is left keeps what is left. Returns None.

        Raises, without any I/O: TypeError / ValueError for a bad ``ttl``; RuntimeError
        (:class:`~rlocks.errors.NotOwnedError`) if this thread holds no permit;
        LockLostError if its permits are known lost. Raises LockLostError too if Redis
        answers that they are gone (reported lost; ``release()`` is still owed), and
        ValueError if Redis holds this name with another value or kind.
        """
        try:
            self._extend(self._owner(), ttl)
        except ResponseError as exc:
            raise self._translate(exc) from None

    def statistics(self) -> PrimitiveState:
        """Holders, permits, free count and waiting processes, read from Redis now.

        A few read-only round trips; returns a frozen dataclass (the same the ``rlocks``
        command line prints). Redis errors propagate.
        """
        return self._statistics()


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
    _bounded = 1
