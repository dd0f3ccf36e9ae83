"""The distributed Condition: waiter entries in Redis, notifications that survive lost
messages and dead waiters.

Shape
-----
A Condition belongs to one lock (an RLock, or an RWLock's write side) and keeps two
sorted sets next to the lock's hash, in its hash tag (one cluster slot): the *queue*
(entry -> arrival number) and the *leases* (entry -> end of the entry's lease, server
ms). See ``lua/cond_lib.lua`` for the states an entry goes through. Every process that
builds a Condition on the same lock name uses the same two keys, so ``notify`` reaches
waiters everywhere, oldest first.

``wait`` runs, like ``threading.Condition.wait``: join the queue while still holding the
lock (so a notify made after the lock is let go cannot miss the entry), give up every
level of the lock (``_release_save``), wait, take the levels back
(``_acquire_restore``), end the notified entry (``cond_done``). Five round trips when
the notification is prompt.

Why the entry is the notification
---------------------------------
``notify`` removes the oldest entries from the queue in one script, and publishes a
wake-up on each waiter's own channel. The message only makes the waiter look sooner: a
waiter looks at its entry (``cond_check``) when woken *and* at the end of each wait slice
(a third of the lease), so a lost message (a subscriber reconnecting) delays a wake-up by
one slice at most, never loses it. Each look also renews the entry's lease.

Why leases
----------
A waiter whose process died leaves an entry nobody renews. Every script first drops the
entries whose lease ended; an entry already notified but never used gives its
notification to the oldest live waiter instead. A live waiter renews every ``ttl / 3``,
so its entry never expires; a notification spent on a waiter that died just before is
passed on within one ``ttl`` (when any live waiter next looks, or any notify runs).

A notified entry is only *used* once its waiter holds the lock again: the look that
finds it notified keeps it while the waiter takes the lock back (the lock's renewer
renews it meanwhile, as a hold: :class:`_KeptEntry`), and ``cond_done`` ends it then. So
a waiter that dies after its look, while it waits for the lock, leaves the notification
to the next waiter like any dead waiter, and a take-back that lasts (the notifier's
section goes on) keeps it. A ``cond_done`` that cannot reach Redis is left to the lock's
renewer, which sends it again until the entry's lease ends (:class:`_EndingEntry`). Only
an outage that outlasts that lease (renewals that cannot reach Redis for a whole ``ttl``)
lets the notification go to the next waiter as well: a spurious wake-up there, never a
lost one.

Time-outs and errors
--------------------
A waiter whose time is up leaves with ``cond_leave``, which also tells whether a notify
took its entry meanwhile: then ``wait`` returns True (it consumed that notification,
which therefore is not lost, and is kept until the lock is back, as after a look), else
False. A waiter interrupted by an exception, while waiting or while taking the lock back,
leaves with the notification passed on, as it will not act on it. A waiter that finds its
entry gone (it stalled longer than its lease) returns True: it cannot know whether it
missed a notify, and a spurious wake-up is allowed by the Condition protocol (callers
re-check their predicate; ``wait_for`` does).

The waiting itself is written once (:func:`_wait_steps`, a generator of "check",
"leave", "sleep" steps) and driven by :meth:`ConditionCore._drive` (threads) and
:meth:`ConditionCore._adrive` (asyncio).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import os
from typing import (
    Any,
    Callable,
    ClassVar,
    Coroutine,
    Dict,
    Generator,
    Iterator,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from ..errors import NotOwnedError
from . import checks
from .aio import _wait_event, async_hub_for, cancel_requests, raise_absorbed_cancel
from .clients import encoding_of, io_client
from .clock import monotonic
from .dialogue import adrive, drive
from .keys import escape
from .primitive import Primitive
from .quorum import Quorum
from .renewal import Lease, Renewable
from .scripts import Call, Reply, Script, arun, load
from .waiting import LINK_ERRORS, backoff, hub_for, link_lost, take_back_pauses, transient
from .wakehub import DEGRADED_POLL, SUBSCRIBE_WAIT, Waiter, WakeHub

__all__ = ["ConditionCore", "wait_for_steps"]

log = logging.getLogger(__name__)

_ENTER = load("cond_enter", prelude="cond_lib")
_CHECK = load("cond_check", prelude="cond_lib")
_LEAVE = load("cond_leave", prelude="cond_lib")
_DONE = load("cond_done", prelude="cond_lib")
_NOTIFY = load("cond_notify", prelude="cond_lib")

# Entry ids are "<owner>/<serial>": unique per wait, even for one owner's successive waits.
_serials = itertools.count(1)

# The steps _wait_steps asks its driver for (a float means: sleep that long on the event).
_CHECK_STEP = "check"
_LEAVE_STEP = "leave"
Step = Union[str, float]
T = TypeVar("T")
R = TypeVar("R")


class _Plan:
    """One wait's deadline and slices, without I/O."""

    __slots__ = ("deadline", "slice")

    def __init__(self, timeout: Optional[float], lease_ms: int) -> None:
        self.deadline = None if timeout is None else monotonic() + timeout
        # Looking (and renewing) three times per lease keeps a live entry from expiring.
        self.slice = lease_ms / 3000.0

    def expired(self) -> bool:
        return self.deadline is not None and monotonic() >= self.deadline

    def subscribe_bound(self) -> float:
        if self.deadline is None:
            return SUBSCRIBE_WAIT
        return max(0.0, min(SUBSCRIBE_WAIT, self.deadline - monotonic()))

    def pause(self, subscribed: bool) -> float:
        # Without a confirmed subscription no message can come: look more often.
        pause = self.slice if subscribed else min(self.slice, DEGRADED_POLL)
        if self.deadline is not None:
            pause = min(pause, self.deadline - monotonic())
        return max(0.0, pause)


def _wait_steps(plan: _Plan, fresh: bool, subscribed: bool) -> Generator[Step, Any, bool]:
    """The wait after the lock was let go: yields steps, receives their results, returns
    whether the waiter was notified.

    ``"check"``: run cond_check (after clearing the waiter's event), send its Reply.
    ``"leave"``: run cond_leave (the notification kept), send its Reply.
    Either sends, instead, the link error its call met (one that waiting may cure: the
    drivers raise any other error).
    A float: sleep on the waiter's event at most that long, send whether the
    subscription is confirmed now. ``fresh``: the subscription is new, so a notify
    published before it took effect may have been missed: look once at the start.

    A broken link (Redis restarting) is ridden through until the deadline, as a lock's
    waiter does: the look is tried again after a growing pause. The entry's lease may end
    meanwhile; the look then finds it gone (a spurious wake-up), and a notification it
    had was passed on, never lost.
    """
    look = fresh
    pauses: Optional[Iterator[float]] = None  # while looks meet a broken link
    while True:
        retry: Optional[float] = None
        if look and not plan.expired():
            reply: Reply | BaseException = yield _CHECK_STEP
            if isinstance(reply, BaseException):
                link_lost(reply)
                pauses = pauses or backoff()
                retry = next(pauses)
            elif not reply.busy:
                # Notified, or gone (stalled past the lease: a spurious wake-up).
                return True
            else:
                pauses = None
        if plan.expired():
            reply = yield _LEAVE_STEP
            if isinstance(reply, BaseException):
                # Not known whether it was notified: its entry is left to its lease,
                # whose end passes a notification on it to the next waiter.
                link_lost(reply)
                return False
            return reply.granted  # notified while the time ran out: it keeps the news
        pause = plan.pause(subscribed)
        subscribed = yield pause if retry is None else min(pause, retry)
        look = True


def wait_for_steps(
    predicate: Callable[[], T], timeout: Optional[float]
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


class _KeptEntry(Renewable):
    """A notified entry kept while its waiter takes the lock back, renewed by the lock's
    renewer as a hold is (``cond_check`` renews it and answers 1): a take-back that
    outlasts the lock's ``ttl`` (the notifier's section goes on, or others are ahead for
    the lock) must not let the entry's lease end, or ``prune`` would give its
    notification to a second waiter while this one still uses it."""

    __slots__ = ("_cond", "_entry", "_label", "_name", "_namespace", "__weakref__")

    _replication = None
    _renew_script = _CHECK

    def __init__(self, cond: "ConditionCore", entry: str) -> None:
        self._cond = cond
        self._entry = entry
        # (what metrics name a renewal by: a Condition's, of its lock's name)
        self._label = cond._label
        self._name = cond._lock._name
        self._namespace = cond._lock._namespace

    def _describe(self) -> str:
        return f"{self._cond._describe()} entry {self._entry}"

    def _renewal_client(self) -> Any:
        return self._cond._lock._renewal_client()

    def _renewal_arguments(self, lease: Lease) -> Tuple[Sequence[str], Sequence[Any]]:
        call = self._cond._look(self._entry)
        return call.keys, call.args

    def _renewed(self, lease: Lease, reply: Reply) -> bool:
        return not reply.not_owner

    def _hold_lost(self, owner: str, reason: str, lease: Optional[Lease] = None) -> None:
        # Its lease ended (a renewal came too late, or Redis was out of reach that long):
        # the notification went to the next waiter, and this one still returns True.
        log.debug("%s: kept entry ended before the lock was back: %s", self._describe(), reason)


class _EndingEntry(_KeptEntry):
    """A notified entry whose waiter holds the lock again but whose ``cond_done`` failed
    (Redis out of reach for a moment): the lock's renewer sends ``cond_done`` in its
    place, tried again every ``ADOPT_AFTER`` while the entry's lease lasts, so a short
    outage does not let the lease end and ``prune`` give the notification to a second
    waiter. ``_ENDING`` keeps it alive until then (a renewer refers to what it renews
    weakly, and its waiter has returned)."""

    __slots__ = ()

    _renew_script = _DONE

    def _renewal_arguments(self, lease: Lease) -> Tuple[Sequence[str], Sequence[Any]]:
        call = self._cond._done(self._entry)
        return call.keys, call.args

    def _renewed(self, lease: Lease, reply: Reply) -> bool:
        return False  # ended (or gone already): nothing more to send, see _hold_lost

    def _hold_lost(self, owner: str, reason: str, lease: Optional[Lease] = None) -> None:
        # (called once either way: after its cond_done ran, or when the lease is over)
        _ENDING.pop(self, None)
        log.debug("%s: ending it is over: %s", self._describe(), reason)


#: Entries whose ``cond_done`` the renewer sends (see :class:`_EndingEntry`), each with
#: the end of its lease (monotonic): one still there after that (its renewer was an
#: event loop's task, and the loop ended) is dropped by the next ``_end_later``.
_ENDING: Dict[_EndingEntry, float] = {}


def _forget_endings() -> None:
    """In a fork child: the parent's ending entries are the parent's renewer's to send."""
    _ENDING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_endings)


class ConditionCore:
    """The Condition surface shared by ``rlocks.Condition`` and its asyncio twin.

    Subclasses name the locks they accept (``_accepts``) and add the public methods.
    """

    __slots__ = ("_lock", "_name", "_keys", "_prefix", "__weakref__")

    _label: ClassVar[str] = "rlocks.Condition"
    #: The lock classes a Condition accepts, and how to name them in a TypeError.
    _accepts: ClassVar[Tuple[type, ...]] = ()
    _accepted: ClassVar[str] = ""

    def __init__(self, lock: Any, name: Optional[str] = None) -> None:
        if not isinstance(lock, self._accepts):
            raise TypeError(
                f"{self._label}: lock must be {self._accepted}, not {type(lock).__name__}"
            )
        assert isinstance(lock, Primitive)
        if isinstance(lock.client, Quorum):
            raise ValueError(
                f"{self._label}: the lock {lock._describe()} runs on a Quorum, and a "
                "Condition keeps its waiters on one server (a quorum of queues is not "
                "built): use a lock on a single server or a Redis Cluster"
            )
        if name is not None:
            label = f"{self._label}({lock._name!r})"
            name = checks.check_name(name, label)
            # (the lock's name and namespace were checked so when it was made)
            checks.check_wire_names({"name": name}, [encoding_of(lock.client)], label)
        self._lock: Any = lock
        self._name = name
        # Next to the lock's hash, so in its hash tag (one cluster slot with the lock).
        # "q" and "l" keep every name's two keys apart from every other name's.
        base = f"{lock._keys.hash}:cond"
        suffix = "" if name is None else ":" + escape(name)
        self._keys = (f"{base}:q{suffix}", f"{base}:l{suffix}")
        # One channel per waiting owner, shared by the lock's conditions: an owner waits
        # on one condition at a time, and a stray message only costs one extra look.
        self._prefix = f"{base}:wake:"

    @property
    def lock(self) -> Any:
        """The lock this condition was built on."""
        return self._lock

    @property
    def name(self) -> Optional[str]:
        """The condition's name among its lock's conditions (``None``: the default one)."""
        return self._name

    def __repr__(self) -> str:
        # Local truth only (no I/O): the lock's own repr says who holds it here.
        named = "" if self._name is None else f" name={self._name!r}"
        return f"<{self._label}{named} of {self._lock!r}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            f"cannot pickle or copy {self._label!r} object: its lock's holds belong to "
            "this process; build another Condition on a lock of the same name instead"
        )

    # -- I/O-free halves ---------------------------------------------------------------

    def _describe(self) -> str:
        return f"{self._label}({self._lock._name!r})"

    def _check_owned(self, what: str) -> None:
        """NotOwnedError (a RuntimeError, as threading raises) unless the caller holds the
        lock; local knowledge, no I/O."""
        if not self._lock._is_owned():
            raise NotOwnedError(
                f"cannot {what} on un-acquired lock ({self._describe()})",
                name=self._lock._name,
            )

    def _begin_wait(self, timeout: object, owner: str) -> Tuple[_Plan, str, str]:
        """Check a wait: (plan, entry id, channel). Raises before any I/O."""
        self._check_owned("wait")
        seconds = checks.semaphore_wait(True, timeout, self._label, self._lock._name)
        plan = _Plan(seconds, self._lock._ttl_ms)
        return plan, f"{owner}/{next(_serials)}", self._prefix + owner

    def _notify_count(self, n: int) -> int:
        """``notify``'s ``n`` as the script's count; raises before any I/O."""
        self._check_owned("notify")
        try:
            count = operator.index(n)
        except TypeError:
            raise TypeError(
                f"{self._describe()}: n must be an int, not {type(n).__name__}"
            ) from None
        if count < 0:
            raise ValueError(f"{self._describe()}: n must be >= 0, got {count}")
        return count

    def _call(self, script: Script, *args: str | int) -> Call:
        # Every cond_* script ends its ARGV with the channel prefix and PUBLISH/SPUBLISH.
        return Call(script, self._keys, (*args, self._prefix, self._lock._publish))

    def _enter(self, entry: str) -> Call:
        return self._call(_ENTER, entry, self._lock._ttl_ms)

    def _look(self, entry: str) -> Call:
        return self._call(_CHECK, entry, self._lock._ttl_ms)

    def _leave(self, entry: str, pass_on: bool) -> Call:
        return self._call(_LEAVE, entry, 1 if pass_on else 0, self._lock._ttl_ms)

    def _done(self, entry: str) -> Call:
        return self._call(_DONE, entry)

    def _notify(self, count: int) -> Call:
        return self._call(_NOTIFY, count)

    # -- the threading driver ----------------------------------------------------------

    def _wait(self, timeout: object) -> bool:
        owner = self._lock._owner()
        plan, entry, channel = self._begin_wait(timeout, owner)
        lock = self._lock
        client = lock._client
        hub = hub_for(client, lock._namespace)
        waiter = hub.register(channel)
        try:
            fresh = not waiter.subscribed
            try:
                self._enter(entry)(client)
                saved = lock._release_save()
            except BaseException:
                # The entry may be queued (a reply lost, an interrupt): take it out.
                self._leave_quietly(client, entry)
                raise
            try:
                notified = self._drive(client, hub, waiter, plan, entry, fresh)
            except BaseException:
                lock._acquire_restore(saved)
                raise
            kept = _KeptEntry(self, entry) if notified else None
            renewer = lock._renewer()
            lease = renewer.add(kept, entry, lock._ttl, monotonic()) if kept else None
            try:
                lock._acquire_restore(saved)
            except BaseException:
                if notified:
                    # It raises instead of acting on its notification: pass it on (its
                    # entry was kept NOTIFIED until now for this).
                    self._leave_quietly(client, entry)
                raise
            else:
                if lease is not None:
                    self._end_quietly(client, entry, lease.expires)
            finally:
                if lease is not None:
                    renewer.cancel(lease)
            return notified
        finally:
            hub.unregister(waiter)

    def _drive(
        self, client: Any, hub: WakeHub, waiter: Waiter, plan: _Plan, entry: str, fresh: bool
    ) -> bool:
        """The threading driver of :func:`_wait_steps`; leaves the queue on any error."""

        def perform(step: Step) -> Any:
            if step == _CHECK_STEP:
                waiter.event.clear()  # a wake-up during the look causes one more look
                return _unless_link_lost(self._look(entry), client)
            if step == _LEAVE_STEP:
                return _unless_link_lost(self._leave(entry, False), client)
            assert isinstance(step, float)
            waiter.event.wait(step)
            return waiter.subscribed

        try:
            subscribed = waiter.subscribed or hub.wait_subscribed(
                waiter, plan.subscribe_bound()
            )
            return bool(drive(_wait_steps(plan, fresh, subscribed), perform))
        except BaseException:
            self._leave_quietly(client, entry)
            raise

    def _leave_quietly(self, client: Any, entry: str) -> None:
        """Leave after an error, passing on a notification the entry had; if that fails
        too, the entry ends with its lease (and a notification on it is passed on then).
        """
        try:
            self._leave(entry, True)(client)
        except Exception:  # noqa: BLE001 - the first error is what propagates
            pass

    def _end_quietly(self, client: Any, entry: str, until: float) -> None:
        """End a notified entry once the lock is held again (``cond_done``). If that
        fails (Redis out of reach), the lock's renewer sends it until the entry's lease
        ends (``until``, monotonic; :meth:`_end_later`); only an outage that outlasts the
        lease lets the notification go to the next waiter then: a spurious wake-up there,
        never a lost one. The wait returns True either way."""
        try:
            self._done(entry)(client)
        except Exception:  # noqa: BLE001 - see the docstring
            self._end_later(entry, until)

    def _end_later(self, entry: str, until: float) -> None:
        """Leave ``cond_done`` of ``entry`` to the lock's renewer (see
        :class:`_EndingEntry`), tried until ``until`` (monotonic). No I/O."""
        log.debug("%s: cond_done of %s left to the renewer", self._describe(), entry,
                  exc_info=True)
        now = monotonic()
        for over in [e for e, end in _ENDING.items() if end < now]:
            _ENDING.pop(over, None)
        ending = _EndingEntry(self, entry)
        _ENDING[ending] = until
        self._lock._renewer().add(ending, entry, self._lock._ttl, now, short=until)

    # -- the asyncio driver ------------------------------------------------------------

    async def _await(self, call: Call) -> Reply:
        """``call`` awaited. A cancellation that arrives while redis.asyncio reads the
        answer can be absorbed by it (the command completes and returns normally, or
        fails with its TimeoutError, the task's ``cancelling()`` count up by one): it is
        raised here instead (``aio.raise_absorbed_cancel``), or a cancelled waiter would
        go on waiting for its notification."""
        before = cancel_requests()
        client = io_client(self._lock._aclient())
        try:
            reply = await arun(client, call.script, call.keys, call.args)
        except Exception:
            # (a cancel turned into a TimeoutError: a link error the wait would ride out)
            raise_absorbed_cancel(before)
            raise
        raise_absorbed_cancel(before)
        return reply

    async def _await_wait(self, timeout: object) -> bool:
        owner = self._lock._owner()
        plan, entry, channel = self._begin_wait(timeout, owner)
        lock = self._lock
        hub = async_hub_for(lock._aclient(), lock._namespace)
        waiter = hub.register(channel)
        try:
            fresh = not waiter.subscribed
            # Joining and letting go of the lock run to their end even if the task is
            # cancelled meanwhile: a half-done release would leave the lock's state
            # unknown. The cancellation is raised once the entry left and the lock is
            # held again, as asyncio.Condition.wait does.
            saved, cancelled = await _to_the_end(self._ajoin(entry, owner))
            if cancelled is not None:
                await self._aleave_quietly(entry)
                await _aacquire_restore(lock, owner, saved)
                raise cancelled
            try:
                notified = await self._adrive(hub, waiter, plan, entry, fresh)
            except BaseException:
                await _aacquire_restore(lock, owner, saved)
                raise
            kept = _KeptEntry(self, entry) if notified else None
            renewer = lock._renewer()
            lease = renewer.add(kept, entry, lock._ttl, monotonic()) if kept else None
            try:
                await _aacquire_restore(lock, owner, saved)
            except BaseException:
                if lease is not None:
                    renewer.cancel(lease)
                if notified:
                    # Cancelled (or failed) while taking the lock back after its
                    # notification: the task raises instead of returning True, so the
                    # notification goes to the next waiter, as asyncio.Condition.wait
                    # does since Python 3.13 (gh-112202). The entry was kept NOTIFIED
                    # until now for this.
                    await asyncio.shield(self._aleave_quietly(entry))
                raise
            if lease is not None:
                try:
                    _, cancelled = await _to_the_end(self._aend_quietly(entry, lease.expires))
                finally:
                    renewer.cancel(lease)
                if cancelled is not None:
                    # Cancelled as the notification was used: the task raises, so it
                    # goes on to the next waiter all the same (held: notify is allowed).
                    try:
                        await asyncio.shield(self._await(self._notify(1)))
                    except Exception:  # noqa: BLE001 - the cancel is what propagates
                        pass  # (then lost: Redis unreachable as the task was cancelled)
                    raise cancelled
            return notified
        finally:
            hub.unregister(waiter)

    async def _ajoin(self, entry: str, owner: str) -> Tuple[int, int]:
        """Queue ``entry``, then give up every level of the lock; what restores them."""
        try:
            await self._await(self._enter(entry))
            return await _arelease_save(self._lock, owner)
        except BaseException:
            await self._aleave_quietly(entry)
            raise

    async def _adrive(
        self, hub: Any, waiter: Waiter, plan: _Plan, entry: str, fresh: bool
    ) -> bool:
        """The asyncio driver of :func:`_wait_steps`; leaves the queue on any error."""

        async def perform(step: Step) -> Any:
            try:
                if step == _CHECK_STEP:
                    waiter.event.clear()
                    return await self._await(self._look(entry))
                if step == _LEAVE_STEP:
                    return await self._await(self._leave(entry, False))
            except LINK_ERRORS as exc:
                if not transient(exc):
                    raise
                return exc  # (see _wait_steps)
            assert isinstance(step, float)
            await _wait_event(waiter.event, step)
            return waiter.subscribed

        try:
            subscribed = waiter.subscribed or await hub.await_subscribed(
                waiter, plan.subscribe_bound()
            )
            return bool(await adrive(_wait_steps(plan, fresh, subscribed), perform))
        except BaseException:
            await asyncio.shield(self._aleave_quietly(entry))
            raise

    async def _aleave_quietly(self, entry: str) -> None:
        try:
            await self._await(self._leave(entry, True))
        except Exception:  # noqa: BLE001 - see _leave_quietly
            pass

    async def _aend_quietly(self, entry: str, until: float) -> None:
        """:meth:`_end_quietly`, awaited."""
        try:
            await self._await(self._done(entry))
        except Exception:  # noqa: BLE001 - see _end_quietly
            self._end_later(entry, until)


def _unless_link_lost(call: Call, client: Any) -> Any:
    """``call``'s reply on ``client``, or the link error it met if waiting may cure it
    (see :func:`_wait_steps`); any other error is raised."""
    try:
        return call(client)
    except LINK_ERRORS as exc:
        if not transient(exc):
            raise
        return exc


# -- the Condition protocol of the asyncio locks (threading's is on ReentrantLock) ----------


async def _to_the_end(work: Coroutine[Any, Any, R]) -> Tuple[R, Optional[BaseException]]:
    """Run ``work`` to its end whatever cancellations arrive meanwhile: (its result, the
    last cancellation or None). ``work``'s own exception propagates."""
    task = asyncio.ensure_future(work)
    cancelled: Optional[BaseException] = None
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError as exc:
            cancelled = exc
            if task.done():  # the cancel came as the work ended: it still counts
                return task.result(), cancelled  # raises what the work raised


async def _arelease_save(lock: Any, owner: str) -> Tuple[int, int]:
    """Give back every level ``owner`` holds of ``lock`` (and of its read side, for a
    write lock whose owner also reads, first); return the counts that restore them.
    The same rules as ``ReentrantLock._release_save`` (RuntimeError for levels held
    through another object of the name, nothing changed)."""
    count = lock._held(owner)
    if count == 0:
        raise NotOwnedError(f"cannot release un-acquired lock {lock._describe()}", name=lock._name)
    inner = getattr(lock, "_read", None)  # an RWLock write side's read side
    lock._check_condition_wait(owner, inner)
    inner_count = inner._held(owner) if inner is not None else 0
    tokens = lock._tokens_held(owner)  # put back after a refusal (see _release_save)
    inner_tokens = inner._tokens_held(owner) if inner is not None else (None, None)
    if inner is not None and inner_count:
        left = await inner._arelease(owner, inner_count)
        if left:
            await inner._aacquire(owner, inner_count, None)  # still held: a re-entry, at once
            inner._put_tokens(owner, inner_tokens)
            raise inner._foreign_levels(owner, left)
    left = await lock._arelease(owner, count)
    if left:
        await lock._aacquire(owner, count, None)
        lock._put_tokens(owner, tokens)
        if inner is not None and inner_count:
            await inner._aacquire(owner, inner_count, None)  # the writer's read: at once
            inner._put_tokens(owner, inner_tokens)
        raise lock._foreign_levels(owner, left)
    return count, inner_count


async def _aacquire_restore(lock: Any, owner: str, saved: Tuple[int, int]) -> None:
    """Take back what :func:`_arelease_save` gave, waiting as long as it takes.

    As ``asyncio.Condition.wait`` does, a cancellation meanwhile does not stop it (the
    caller's ``async with`` must find the lock held); it is re-raised once held. A link
    error (Redis restarting) is ridden through the same way; other errors are raised.
    """
    count, inner_count = saved
    inner = getattr(lock, "_read", None)
    cancelled: Optional[BaseException] = None
    for target, levels in ((lock, count), (inner, inner_count)):
        if target is None or not levels:
            continue
        pauses = backoff()
        # It must end held: never a deadlock's victim, and a link error is ridden through
        # (waiting.take_back_pauses), or wait() would raise without the lock.
        with target._taking_back(owner):
            while True:
                try:
                    await target._aacquire(owner, levels, None)
                    break
                except asyncio.CancelledError as exc:
                    cancelled = exc
                except Exception as exc:  # noqa: BLE001 - raised again unless a link error
                    pause = take_back_pauses(exc, pauses)
                    try:
                        await asyncio.sleep(pause)
                    except asyncio.CancelledError as late:
                        cancelled = late
    if cancelled is not None:
        raise cancelled
