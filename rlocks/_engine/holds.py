"""What this process knows of its holds: one state machine per hold, in one place.

Redis is the only record of who holds what. A :class:`Hold` is what this process learned
from the replies of its own calls about one owner's hold of one primitive (one side of
an RWLock): its count, its fencing token, until when its lease surely lasts, and its
state:

- ``held``: granted, and not known to be gone;
- ``releasing``: a release of its last level is on its way: a renewal that finds the
  hold gone meanwhile proves nothing (the release may have taken it first), so the
  renewer's finding waits for the release's answer, which decides;
- ``gone``: released;
- ``lost``: gone from Redis while this process still held it. Reported once: a WARNING,
  the ``rlocks.lost`` metric, each holding object's ``on_lost``; every later re-entry or
  release of it raises :class:`~rlocks.errors.LockLostError`.

Only :meth:`Hold.lose` decides that a hold is lost; the renewer and the dialogues report
what they saw to it. A fresh grant is evidence too: Redis granting one owner of this
process a hold that excludes another owner's, which is held and not on its way out, no
longer had that other hold (its lease ended, or a failover lost it), so that one is lost
(:meth:`Hold.granted_now`).

Two objects of one name are one primitive: a hold is shared, in :func:`hold_for`'s
registry, by every object (of this process) through which its owner took levels, and each
object counts the levels it took (it gives back only those). The registry keeps holds
weakly and the objects keep them strongly, so a hold whose every holding object was
garbage-collected goes too: its renewal stops, and a WARNING says so (its lease ends in
Redis by itself).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import metrics

__all__ = ["GONE", "HELD", "LOST", "RELEASING", "Hold", "held_here", "hold_for", "live", "peek"]

log = logging.getLogger(__name__)

HELD, RELEASING, GONE, LOST = "held", "releasing", "gone", "lost"

_mutex = threading.Lock()
_holds: "weakref.WeakValueDictionary[Tuple[Any, ...], Hold]" = weakref.WeakValueDictionary()
# (backend address, key) -> the holds of that primitive granted since they were last seen
# gone: what a fresh grant is checked against (see granted_now).
_granted: "Dict[Tuple[Any, ...], weakref.WeakSet[Hold]]" = {}


class Hold:
    """One owner's hold of one primitive (side), as this process knows it."""

    __slots__ = ("ident", "label", "owner", "count", "token", "tokens", "ttl", "lease_end",
                 "due", "_state", "pending", "granted", "renew_call", "objects", "reason",
                 "alive_cell", "watchers", "event", "__weakref__")

    def __init__(self, ident: Tuple[Any, ...], label: str, owner: str) -> None:
        self.ident = ident
        self.label = label
        self.owner = owner
        self.count = 0
        self.token: Optional[int] = None
        self.tokens: Optional[Tuple[Optional[int], ...]] = None
        self.ttl = 0.0  # s, the longest ttl it was granted with
        self.lease_end = 0.0  # monotonic: the lease surely lasts until then
        self.due = 0.0  # monotonic: its next renewal
        self._state = GONE
        self.alive_cell = [False]  # what the finaliser reads: held when collected?
        self.pending: Optional[str] = None  # a renewer's finding while releasing
        self.granted = 0.0
        self.renew_call: Any = None  # the Call that renews it (set at its grant)
        self.objects: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.reason = ""
        # Called (no arguments, from whichever thread finds the loss) when this grant is
        # lost: a guard's cancel, the ``lost`` event's set. Reset by each fresh grant.
        self.watchers: Optional[List[Callable[[], object]]] = None
        self.event: Optional[threading.Event] = None

    def __repr__(self) -> str:
        return f"<Hold {self.label} {self.owner} x{self.count} {self.state}>"

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value
        self.alive_cell[0] = value in (HELD, RELEASING)

    @property
    def alive(self) -> bool:
        return self._state in (HELD, RELEASING)

    # -- what the dialogues and the renewer report -----------------------------------------

    def granted_now(self, sent: float, ttl: float, token: Optional[int]) -> None:
        """A fresh grant (count 1), from a call sent at ``sent``. Another owner's hold of
        this process that it excludes (an RLock's, a writer's; a reader's, for a writer)
        and that is held, with no release of its last level on the way, is lost: Redis
        did not have it when it granted this one."""
        self.count, self.state, self.pending = 1, HELD, None
        self.watchers = self.event = None
        self.token = token
        self.ttl = ttl
        self.granted = sent
        self.renewed(sent)
        side = self.ident[2]
        if side == "p":  # permits: whose grant overdrew the value cannot be told
            return
        key = self.ident[:2]
        with _mutex:
            peers = _granted.get(key)
            if peers is None:
                peers = _granted[key] = weakref.WeakSet()
            over = []
            for other in list(peers):
                if other._state not in (HELD, RELEASING) or other.count <= 0:
                    peers.discard(other)
                elif (other.owner != self.owner and other._state == HELD
                      and not (side == "r" and other.ident[2] == "r")):
                    over.append(other)
            peers.add(self)
        for other in over:
            other.lose(f"Redis granted it to {self.owner} of this process meanwhile")

    def renewed(self, sent: float, ttl: Optional[float] = None) -> None:
        """The lease was set to at least ``ttl`` (default: the hold's) by a call sent at
        ``sent``."""
        ttl = self.ttl if ttl is None else max(ttl, 0.0)
        self.lease_end = max(self.lease_end, sent + ttl)
        self.due = sent + self.ttl / 3.0

    def found_gone(self, reason: str) -> None:
        """A renewal (or a look) found the hold gone from Redis."""
        with _mutex:
            if self.state == RELEASING:
                self.pending = reason  # the release's answer decides
                return
            if self.state != HELD:
                return
        self.lose(reason)

    def claim_release(self) -> bool:
        """Begin the release of the last level if nobody has (True): two releases (of a
        lock any thread of the process may release) never both send."""
        with _mutex:
            if self.state == HELD and self.count == 1:
                self.state = RELEASING
                return True
            return False

    def begin_release(self) -> None:
        with _mutex:
            if self.state == HELD:
                self.state = RELEASING

    def end_release(self, answered: bool) -> None:
        """The release of the last level is over: ``answered``, it took the hold (or the
        hold was lost, which the caller reports); else it failed and the hold is dropped
        from the books, a loss the renewer found meanwhile reported."""
        with _mutex:
            pending, self.pending = self.pending, None
            if self.state == RELEASING:
                self.state = GONE
                self._ungranted()
        if pending is not None and not answered:
            self._report(pending)

    def cancel_release(self) -> None:
        """A release of the last level was refused (nothing given back): held again,
        and a loss the renewer found meanwhile is reported."""
        with _mutex:
            pending, self.pending = self.pending, None
            if self.state == RELEASING:
                self.state = HELD
        if pending is not None:
            self.lose(pending)

    def lose(self, reason: str) -> bool:
        """Mark the hold lost and report it, once. False if it was not alive."""
        with _mutex:
            if self.state not in (HELD, RELEASING):
                return False
            self.state = LOST
            self._ungranted()
        self._report(reason)
        return True

    def _ungranted(self) -> None:
        """(Under ``_mutex``.) Out of ``_granted``, and its key with the last hold."""
        key = self.ident[:2]
        peers = _granted.get(key)
        if peers is not None:
            peers.discard(self)
            if not peers:
                del _granted[key]

    def _report(self, reason: str) -> None:
        self.reason = reason
        log.warning("%s lost by %s: %s", self.label, self.owner, reason)
        objects = list(self.objects)
        if objects:
            metrics.lost(objects[0], self.granted)
        with _mutex:
            watchers, self.watchers = self.watchers, None
        for watcher in watchers or ():
            try:
                watcher()
            except Exception:  # noqa: BLE001 - one watcher's failure stops no other
                log.exception("a watcher of %s's loss raised", self.label)
        for obj in objects:
            obj._hold_lost(self)

    # -- who is told at once when this grant is lost -----------------------------------------

    def watch(self, watcher: Callable[[], object]) -> bool:
        """Call ``watcher()`` when this grant is found lost (once, from the thread that
        finds it). False, and not kept, if it is not alive now: the caller acts itself."""
        with _mutex:
            if self._state not in (HELD, RELEASING):
                return False
            if self.watchers is None:
                self.watchers = []
            self.watchers.append(watcher)
            return True

    def unwatch(self, watcher: Callable[[], object]) -> None:
        with _mutex:
            if self.watchers is not None and watcher in self.watchers:
                self.watchers.remove(watcher)

    def lost_event(self) -> threading.Event:
        """A ``threading.Event`` set when this grant is lost (set already if it is), the
        same one for every caller until the next fresh grant."""
        with _mutex:
            event = self.event
            if event is None:
                event = self.event = threading.Event()
                if self._state in (HELD, RELEASING):
                    if self.watchers is None:
                        self.watchers = []
                    self.watchers.append(event.set)
                elif self._state == LOST:
                    event.set()
            return event

    def any_object(self) -> Any:
        """One of the objects that hold levels of it (None: none is left)."""
        for obj in self.objects:
            return obj
        return None


def hold_for(ident: Tuple[Any, ...], label: str, owner: str) -> Hold:
    """The hold ``ident`` (backend address, key, side, owner): the live one every object of
    that primitive shares, or a new one (not yet held)."""
    with _mutex:
        hold = _holds.get(ident)
        # A hold released (gone) is used again; a lost one is kept for the objects that
        # still owe its release, and a new one made once they have.
        if hold is None or hold.state == LOST and hold.count <= 0:
            hold = Hold(ident, label, owner)
            _holds[ident] = hold
            weakref.finalize(hold, _collected, label, owner, hold.alive_cell)
        return hold


def live() -> List[Hold]:
    """Every hold of this process that is held (no I/O)."""
    with _mutex:
        return [h for h in _holds.values() if h.alive and h.count > 0]


def held_here(where: Tuple[Any, ...], owners: str) -> List[Hold]:
    """The holds of the primitive (side) ``where`` (backend address, key, side) with
    levels taken, whose owners start with ``owners`` (no I/O)."""
    with _mutex:
        return [hold for ident, hold in _holds.items()
                if ident[:3] == where and hold.count > 0 and hold.owner.startswith(owners)]


def peek(ident: Tuple[Any, ...]) -> Optional[Hold]:
    """The hold ``ident`` if this process has one (no new one is made)."""
    with _mutex:
        return _holds.get(ident)


def _collected(label: str, owner: str, alive: List[bool]) -> None:
    if alive[0]:
        message = (f"{label} held by {owner}: every lock object that held it was "
                   "garbage-collected; its lease is no longer renewed and ends by itself")
        log.warning("%s", message)
        warnings.warn(message, ResourceWarning, stacklevel=2)


def _forget_after_fork() -> None:
    """In a fork child: every hold is the parent's (the child's owner ids are new, and
    the parent's threads are not here to release). Forget them without I/O, here and in
    each object that took levels of them; Redis keeps them, for the parent."""
    global _mutex
    _mutex = threading.Lock()  # a parent thread may have held it at the fork
    for hold in list(_holds.values()):
        for obj in list(hold.objects):
            obj._at_fork_reinit()
        hold.objects = weakref.WeakSet()
        hold._state, hold.alive_cell[0] = GONE, False  # (no "collected while held" warning)
    _holds.clear()
    _granted.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
