"""The per-process wake-up hub: its table of waiters and its reader on one subscriber.

Why a hub
---------
A release script publishes a wake-up in the same atomic step that frees it, on the
channel of each process it hands the primitive to (``keys.PrimitiveKeys.wake``: the
primitive's prefix and the hub's queue entry id, ``WakeHub.entry``), so no other process
is woken. Waiters must hear it without sleep-polling and without one connection per
waiting thread, so each
process keeps ONE subscriber connection per (connection pool, namespace), owned by one
daemon thread (an asyncio task in ``aio.AsyncWakeHub``), the hub. Threads that wait
register a :class:`Waiter` (an Event) on a channel; the hub subscribes to the channels
that have waiters and, when a wake-up arrives, sets the events of the waiters it names,
in arrival order. One release therefore wakes one thread per process it hands over to,
not every thread (no thundering herd).

Only the hub's reader touches its PubSub object (redis-py's PubSub is not meant to be
shared between threads). A thread that needs a new subscription puts it in the hub's
table and publishes an empty message on the hub's private control channel, which wakes
the reader from its blocking read; the hub then sends SUBSCRIBE. A waiter makes its
second attempt only after the SUBSCRIBE is confirmed, so a release between the attempt
and the subscription cannot be missed. The reader is one I/O-free dialogue
(``WakeHub._reader_steps``) performed by a thread here and by a task in ``aio``. When it
reconnects it wakes every waiter, since messages may have been lost meanwhile.

Lost wake-ups inside the process are prevented by two rules: a waiter clears its event
*before* each attempt (a wake-up that lands during the attempt causes one more attempt),
and a waiter that leaves with an unconsumed wake-up passes it on to the next waiter.

A hub's reader exits once its table has been empty for ``IDLE_EXIT`` seconds (the
registry that finds hubs, and what happens then, is in :mod:`.waiting`). The hub talks to
Redis through ``clients.io_client``: its connections have bounded socket timeouts
whatever the client's own, so a frozen server cannot hold it in a read forever.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, Generator, List, Optional, Tuple

from . import identity
from .clients import CONNECT_TIMEOUT, SOCKET_TIMEOUT, encoding_of, io_client
from .clock import monotonic
from .dialogue import drive, stopped

__all__ = [
    "DEGRADED_POLL",
    "LISTEN_POOL_MIN",
    "READ_TURN",
    "RECONNECT_BACKOFF",
    "SUBSCRIBE_WAIT",
    "HubOp",
    "HubStep",
    "Waiter",
    "WakeHub",
    "defer_poll",
    "listen_timeout",
    "serial",
    "wake_count",
    "wake_line",
]

log = logging.getLogger(__name__)

LINGER = 5.0  # s an unused channel stays subscribed, so repeated contention re-uses it
TICK = 1.0  # s between the hub's housekeeping passes (unsubscribing, idle exit)
IDLE_EXIT = 30.0  # s without any channel after which the hub thread closes and exits
SUBSCRIBE_WAIT = 5.0  # s a waiter waits at most for its SUBSCRIBE to be confirmed
# s a deadlock check's read waits at most for another waiter's (WakeHub.reads): a read
# takes a round trip, and a frozen server must not add one socket timeout per waiter
# ahead to a waiter's acquire
READ_TURN = 0.25
DEGRADED_POLL = 0.25  # s between re-checks while the subscription is not confirmed
RECONNECT_BACKOFF = (0.05, 1.0)  # s, first and largest pause before reconnecting
#: s the next head of a channel waits at most, while a thread of this process keeps an
#: exclusive hold it was granted, before it queues anyway (see ``WakeHub.unregister``).
DEFER_LIMIT = 0.05
#: s, the least pause between two looks of the waiter right behind a head, which looks
#: every DEFER_LIMIT (see ``defer_poll``): a limit of 0 must not make it spin.
DEFER_POLL_FLOOR = 0.001


def defer_poll() -> float:
    """How long the waiter right behind its channel's head sleeps at most between two
    looks (s): DEFER_LIMIT, and never less than DEFER_POLL_FLOOR, so that a limit of 0
    makes it look every millisecond instead of spinning under the GIL (no I/O)."""
    return max(DEFER_LIMIT, DEFER_POLL_FLOOR)


class HubOp(enum.Enum):
    """The steps of the hub's reader dialogue (``WakeHub._reader_steps``), each yielded
    as ``(step, pubsub, argument)``: connect (returns the PubSub); (un)subscribe the
    channel names in the argument; read one message, waiting at most the argument's
    seconds (returns it, or None); pause the argument's seconds; close the PubSub."""

    OPEN = "open"
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"
    READ = "read"
    PAUSE = "pause"
    CLOSE = "close"


HubStep = Tuple[HubOp, Any, Any]


def wake_count(payload: Any) -> Optional[int]:
    """Decode a wake-up message: how many waiters to wake (``None``: all of them)."""
    if isinstance(payload, bytes):
        payload = payload.decode("ascii", "replace")
    if payload == "*":
        return None
    try:
        count = int(payload)
    except (TypeError, ValueError):
        return None  # an unknown message still means "something changed": wake all
    return max(count, 1)


def _text(value: Any, encoding: str = "utf-8") -> str:
    """A channel name as the str it was subscribed with: bytes are decoded with the
    encoding of the client that sent the name (whatever its decode_responses)."""
    return value.decode(encoding, "replace") if isinstance(value, bytes) else str(value)


# Sharded pub/sub messages mean what their plain counterparts mean to the hub.
_PLAIN_KIND = {"smessage": "message", "ssubscribe": "subscribe", "sunsubscribe": "unsubscribe"}


class _Channel:
    """A subscribed (or to-be-subscribed) channel and its waiters, oldest first."""

    __slots__ = ("name", "waiters", "confirmed", "sent", "idle_since", "node", "held")

    def __init__(self, name: str, event_type: Callable[[], Any] = threading.Event) -> None:
        self.name = name
        self.waiters: Deque[Waiter] = deque()
        self.confirmed = event_type()  # SUBSCRIBE acknowledged by the server
        self.sent = False  # SUBSCRIBE sent on the current connection
        self.idle_since: Optional[float] = None
        self.node: Optional[str] = None  # cluster only: the node subscribed on
        #: (owner, until when): a thread of this process was granted an exclusive hold,
        #: and the next head does not queue while it lasts (see WakeHub.unregister).
        self.held: Optional[Tuple[str, float]] = None


#: States of a queued waiter (docs/design/handover.md); changed under the hub mutex.
WAITING, GRANTED, LEAVING = 0, 1, 2

#: ``Waiter.carry`` while a sibling's release that queues the waiter travels.
CARRYING = "carrying"

# Hub numbers, for the hubs' entry ids (``WakeHub.entry``): unique within a process
# token, which a fork child renews.
_hub_numbers = itertools.count(1)

# Registration serials: a release reply's wake lines may only grant waiters registered
# before the release was sent (see WakeHub.deliver).
_serials = itertools.count(1)


def serial() -> int:
    """The next registration serial (thread-safe: ``itertools.count`` is atomic)."""
    return next(_serials)


#: The fewest connections a pool must allow for its waiters to read their own wake-up
#: lines (WakeHub.listen): below it, a BLPOP holding one could make a release in the same
#: process wait for the pool (BlockingConnectionPool) or fail (ConnectionPool).
LISTEN_POOL_MIN = 16


def _roomy(client: Any) -> bool:
    """Whether ``client``'s pool allows :data:`LISTEN_POOL_MIN` connections (a cluster
    client, whose pools are per node and unknown here, counts as roomy). No I/O."""
    pool = getattr(client, "connection_pool", None)
    most = getattr(pool, "max_connections", None)
    return not isinstance(most, int) or most >= LISTEN_POOL_MIN


def listen_timeout(client: Any, timeout: float) -> float:
    """The BLPOP timeout (s) of a waiter's LISTEN step of at most ``timeout`` s through
    ``client``: above 0 (BLPOP's 0 blocks for ever), and at most half the client's socket
    timeout (rlocks' own if unknown), so the read does not time out first. No I/O."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    socket_timeout = (kwargs or {}).get("socket_timeout") or SOCKET_TIMEOUT
    return max(0.001, min(timeout, socket_timeout / 2))


def wake_line(line: str) -> Tuple[str, str, int]:
    """Split a queue script's wake line into (what, waiter id, fencing token or 0):
    ``g <waiter> <token>`` (a semaphore's ``g <waiter>``) or ``w <waiter>``."""
    what, _, rest = line.partition(" ")
    wid, _, token = rest.partition(" ")
    return what, wid, int(token) if token.isdigit() else 0


class Waiter:
    """One waiting thread's (or task's) registration on one channel."""

    __slots__ = (
        "event",
        "channel",
        "id",
        "state",
        "seq",
        "hub_seen",
        "other_seen",
        "counts",
        "token",
        "ask",
        "named",
        "gone",
        "carry",
        "lease_ms",
    )

    def __init__(
        self,
        channel: _Channel,
        event_type: Callable[[], Any] = threading.Event,
        waiter_id: str = "",
    ) -> None:
        self.event = event_type()
        self.channel = channel
        #: The waiter id named in wake lines ("g <id>"): the owner that waits.
        self.id = waiter_id
        self.state = WAITING
        self.seq = serial()
        self.hub_seen = False  # the hub delivered this waiter's grant line
        self.other_seen = False  # a reply (release, ADOPTED, PASSED) told of the grant first
        # Queued only once its channel was confirmed subscribed: then the hub is sure to
        # receive its grant line, and a grant learnt elsewhere must make it drop that line.
        self.counts = False
        #: The fencing token its grant line carried (0: none, or a semaphore's grant).
        self.token = 0
        #: What its acquire asks, (renew item kind, count): what a leaving head names
        #: when it re-points the process's queue entry to this waiter.
        self.ask: Tuple[str, int] = ("", 1)
        #: A leaving head re-pointed the process's entry to it, or a sibling's release
        #: queued it (and ended while it waited: ``claim``): it is in the server's queue
        #: before it asked, so it must leave it if it stops waiting.
        self.named = False
        #: It stopped waiting ungranted before it was named: a leaving head must not
        #: name it (see ``take_over``).
        self.gone = False
        #: A sibling's release queues it (``WakeHub.carry_begin``): CARRYING while that
        #: release travels, then (when it was sent, the queueing's QUEUED reply) until
        #: the waiter takes it (``take_carry``); None otherwise.
        self.carry: Any = None
        #: The entry lease (ms) its primitive queues with: a sibling's release queues it
        #: only with the same one (the lease its grant lives until adopted, which the
        #: waiter counts on).
        self.lease_ms = 0

    @property
    def subscribed(self) -> bool:
        return bool(self.channel.confirmed.is_set())


class WakeHub:
    """The process's subscriber for one (connection pool, namespace). See the module doc."""

    #: Events of waiters and channels: threading's here, asyncio's in the asyncio hub (whose
    #: table is touched only from its event loop's thread, so the same logic serves both).
    _event_type: Callable[[], Any] = threading.Event
    _lock_type: Callable[[], Any] = threading.Lock

    def __init__(self, client: Any, namespace: str) -> None:
        self._client = client
        # Channel names arrive as bytes or str depending on decode_responses: matched as
        # the str subscribed, decoded with the encoding that sent them (not always UTF-8).
        self._encoding = encoding_of(client)
        self._io = io_client(client)  # what the hub sends and subscribes through
        self._mutex = threading.Lock()
        self._channels: Dict[str, _Channel] = {}
        self._runner: Optional[Any] = None  # the running reader (thread, or asyncio task)
        self._control_seen = False
        self._idle_since: Optional[float] = None  # when the table last became empty
        # (channel, waiter id) -> grant lines the hub must still drop: grants this process
        # learnt from a script reply before the hub read their line (see "Hand-over").
        self._echo: Dict[Tuple[str, str], int] = {}
        self._mine = identity.process_token() + ":"
        #: This hub's queue entry id in every primitive it serves: its waiters queue as
        #: one entry, and releases publish their grant lines on the channel named after
        #: it. One per hub, not per process: two hubs of one process (two connection
        #: pools, two event loops) each have their own head waiter, which must not
        #: re-point the other's entry to itself (bug hunt 9).
        self.entry = f"{identity.process_token()}/{next(_hub_numbers)}"
        # The private control channel stays inside the namespace, so an ACL user limited
        # to the namespace's channels may use it; one per hub, so a nudge wakes only the
        # hub it is for.
        self._control = f"{namespace}:hub:{self.entry}"
        #: Held around each read of a waiter's deadlock check (see Primitive._perform):
        #: one at a time per hub, so the waiters past ``deadlock_timeout`` (each checks)
        #: do not each hold a connection of the pool. (An asyncio.Lock in the asyncio hub.)
        self.reads: Any = self._lock_type()
        # channel -> (owner, until when) of this process's first try (an acquire without
        # queueing) in flight; see try_first
        self._trying: Dict[str, Tuple[str, float]] = {}
        # The head waiter that reads its wake-up lines from its entry's list (see listen):
        # one per hub, since its BLPOP holds a connection of the pool while it waits.
        self._listener: Optional[Waiter] = None
        self._may_listen = _roomy(client)

    # -- called by waiting threads -------------------------------------------------------

    def register(self, channel: str, waiter_id: str = "") -> Waiter:
        """Add a waiter on ``channel``; make sure the hub subscribes to it."""
        with self._mutex:
            ch = self._channels.get(channel)
            created = ch is None
            if ch is None:
                ch = self._channels[channel] = _Channel(channel, self._event_type)
            ch.idle_since = None
            waiter = Waiter(ch, self._event_type, waiter_id)
            ch.waiters.append(waiter)
            started = stopped(self._runner)
            if started:
                if self._runner is not None:
                    # The last reader was cancelled or died (an idle exit forgets it):
                    # its subscriptions went with its connection.
                    self._lost_locked()
                self._start_locked()
        if created and not started:
            self._nudge()
        return waiter

    def _start_locked(self) -> None:
        """Start the hub's reader (a daemon thread here); called under the mutex."""
        thread = threading.Thread(target=self._run, name="rlocks-wakeup-hub", daemon=True)
        self._runner = thread
        thread.start()

    def unregister(self, waiter: Waiter, holder: Optional[str] = None) -> None:
        """Remove ``waiter``; the next waiter takes over what it leaves.

        A leaving head hands the attempter's role to the next waiter (woken, it asks
        Redis itself from now on); a wake-up the leaver did not use goes to the next
        waiter not already woken.

        ``holder``: the leaving head was granted an exclusive hold for that owner (an
        RLock, a write side; fair mode). Then the next head does not queue while the
        hold lasts, until :meth:`unhold` (the holder's release begins) or for at most
        :data:`DEFER_LIMIT`: no grant can reach it before that release, and queued at
        once, its script run and its Python work (under this process's GIL, or in its
        event loop) land on the holder's critical section. Measured, 4 processes x 2
        threads: the section's GET took 150 µs with it, 124 µs without. Its place is
        then taken at the release: waiters of other processes that queued during the
        hold go first (with every process queued, as under contention, the order is
        the same).
        """
        with self._mutex:
            ch = waiter.channel
            was_head = bool(ch.waiters) and ch.waiters[0] is waiter
            try:
                ch.waiters.remove(waiter)
            except ValueError:  # pragma: no cover - registered once, removed once
                pass
            if holder is not None and was_head:
                ch.held = (holder, monotonic() + DEFER_LIMIT)
            elif ch.waiters and was_head:
                ch.waiters[0].event.set()
            elif waiter.event.is_set():
                self._wake_locked(ch, 1)
            if not ch.waiters:
                ch.idle_since = monotonic()

    def is_head(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` is the first of its channel's waiters in this process.

        Only the head asks Redis; the others wait for it to leave. So one process makes
        one attempt at a time per primitive however many of its threads wait, which keeps
        connections and round trips flat, and its waiters are served in arrival order.
        """
        waiters = waiter.channel.waiters
        return bool(waiters) and waiters[0] is waiter and self.deferred(waiter) is None

    def deferred(self, waiter: Waiter) -> Optional[float]:
        """Seconds ``waiter``'s queueing is still put off for a sibling's exclusive hold
        (see :meth:`unregister`), or None (no I/O)."""
        ch = waiter.channel
        held = ch.held
        if held is None or not ch.waiters or ch.waiters[0] is not waiter:
            return None
        left = held[1] - monotonic()
        return left if left > 0 else None

    def carry_begin(self, channel: str, owner: str) -> Optional[Waiter]:
        """``owner``'s release of its exclusive hold begins: the head that hold kept from
        queueing (see :meth:`unregister`) is queued by that release itself when it can
        read its lines from its entry's list (:meth:`listen`; it is made the listener
        now): returned, marked CARRYING, and still kept from queueing until
        :meth:`carry_end`. Otherwise it is woken to queue itself (None). No I/O."""
        with self._mutex:
            ch = self._channels.get(channel)
            if ch is None or ch.held is None or ch.held[0] != owner:
                return None
            head = ch.waiters[0] if ch.waiters else None
            if head is None or head.state != WAITING or head.named or (
                not ch.confirmed.is_set() or not self._may_listen
                or (self._listener is not None and self._listener is not head)
            ):
                ch.held = None
                if head is not None:
                    head.event.set()
                return None
            self._listener = head
            head.carry = CARRYING
            return head

    def carry_end(self, waiter: Waiter, owner: str, result: Optional[Tuple[float, Any]]) -> bool:
        """The release of :meth:`carry_begin` ended: ``result`` is (when it was sent, the
        QUEUED reply of ``waiter``'s queueing), or None (not queued, or the release
        failed: the waiter queues itself; its call re-points an entry the release may
        have made). Returns False when the waiter stopped waiting meanwhile (it never
        asked Redis, so it leaves nothing) and the release may have queued it: the caller
        must take the entry out in its name, whatever the release answered (a release cut
        short by an interrupt or a cancel may still have run). No I/O."""
        with self._mutex:
            ch = waiter.channel
            if ch.held is not None and ch.held[0] == owner:
                ch.held = None
            pending = waiter.carry is CARRYING
            if pending:
                waiter.carry = None
            if waiter.state == WAITING:
                if pending and result is not None:
                    waiter.carry = result
                if ch.waiters:
                    ch.waiters[0].event.set()
                return True
            return not (pending and waiter.gone)

    def take_carry(self, waiter: Waiter) -> Optional[Tuple[float, Any]]:
        """For a head about to queue: (when it was sent, the QUEUED reply) of the queueing
        a sibling's release did for it, or None: it queues itself (a release still
        travelling then queues it too, which its own call's re-point makes harmless).
        No I/O."""
        with self._mutex:
            got, waiter.carry = waiter.carry, None
            return got if isinstance(got, tuple) else None

    def next_in_line(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` is right behind its channel's head (no I/O)."""
        waiters = waiter.channel.waiters
        return len(waiters) > 1 and waiters[1] is waiter

    def unhold(self, channel: str, owner: str) -> None:
        """``owner``'s exclusive hold in this process ends (its release begins, or it
        was dropped): the head it kept from queueing queues now (see
        :meth:`unregister`). No I/O."""
        with self._mutex:
            ch = self._channels.get(channel)
            if ch is None or ch.held is None or ch.held[0] != owner:
                return
            ch.held = None
            if ch.waiters:
                ch.waiters[0].event.set()

    def rest(self, waiter: Waiter) -> bool:
        """For a waiter that is not its channel's head, before it sleeps: True after
        clearing a wake-up that asks nothing of it (the hub woke every waiter, or passed
        on a wake-up), so its sleep is not cut short again and again; False if it was
        granted or became the head meanwhile (it must look again, not sleep). No I/O."""
        with self._mutex:
            if waiter.state == GRANTED or self.is_head(waiter):
                return False
            waiter.event.clear()
            return True

    def has_waiters(self, channel: str) -> bool:
        """Whether threads of this process already wait on ``channel`` (no I/O)."""
        ch = self._channels.get(channel)
        return ch is not None and bool(ch.waiters)

    def try_first(self, channel: str, owner: str) -> bool:
        """Whether ``owner`` may try the primitive once before queueing (no I/O): only
        when no thread of this process waits on ``channel`` and no other owner is trying.
        True marks the try in flight until :meth:`tried`. Threads that arrive meanwhile
        wait behind one another, so a burst of arrivals makes one try and one queued call
        at a time, not one connection each.

        A mark whose :meth:`tried` never came (an exception raised by a signal handler
        exactly there) ends once a round trip surely has (connect and socket timeouts),
        and never stops its own owner: at worst, threads queue that could have tried.
        """
        now = monotonic()
        with self._mutex:
            if self.has_waiters(channel):
                return False
            mark = self._trying.get(channel)
            if mark is not None and mark[0] != owner and now < mark[1]:
                return False
            self._trying[channel] = (owner, now + CONNECT_TIMEOUT + SOCKET_TIMEOUT)
            return True

    def tried(self, channel: str, owner: str) -> None:
        """``owner``'s try that :meth:`try_first` allowed is over (answered or failed)."""
        with self._mutex:
            mark = self._trying.get(channel)
            if mark is not None and mark[0] == owner:
                del self._trying[channel]

    def is_confirmed(self, channel: str) -> bool:
        """Whether ``channel`` is subscribed and confirmed now (no I/O)."""
        ch = self._channels.get(channel)
        return ch is not None and bool(ch.confirmed.is_set())

    # -- wake-up lines read from the entry's list ----------------------------------------

    def listen(self, waiter: Waiter) -> bool:
        """Whether ``waiter``, its channel's head about to queue, reads its wake-up lines
        itself from the entry's list (BLPOP) instead of through this hub's subscriber: a
        hand-off then costs no pub/sub hop and no thread switch. One waiter per hub at a
        time (its BLPOP holds a connection of the pool), none on a pool capped below
        :data:`LISTEN_POOL_MIN` connections (the holder's release must not wait for one),
        and never one a leaving head named: the lines of its place may already travel on
        the channel. No I/O."""
        with self._mutex:
            if not self._may_listen or waiter.named or (
                self._listener is not None and self._listener is not waiter
            ):
                return False
            self._listener = waiter
            return True

    def unlisten(self, waiter: Waiter) -> None:
        """``waiter`` no longer reads the list (its wait is over, or it is named)."""
        with self._mutex:
            if self._listener is waiter:
                self._listener = None

    def to_pop(self, waiter: Waiter, timeout: float, client: Any) -> Optional[Tuple[Any, ...]]:
        """The BLPOP arguments of ``waiter``'s LISTEN step of at most ``timeout`` s through
        ``client``: its list (the channel's name) and :func:`listen_timeout`; None when it
        was woken already (no I/O: the caller then does not pop)."""
        if waiter.event.is_set():
            return None
        return ([waiter.channel.name], listen_timeout(client, timeout))

    def popped(self, waiter: Waiter, reply: Any) -> bool:
        """Act on the reply of ``waiter``'s BLPOP (None: it timed out); whether it popped."""
        if reply:
            self.heard(waiter, reply[1])
        return bool(reply)

    def heard(self, waiter: Waiter, payload: Any) -> None:
        """Act on one element ``waiter`` popped from its entry's list, as on a published
        message (``_lines_locked``) but dropping no echo: a list line is never also
        published, and the list only holds lines of the entry's current place, which the
        waiters that read it have not learnt of otherwise (a grant told by a reply ends
        that wait, and the next wait's new place deletes the list). No I/O."""
        text = _text(payload, self._encoding)
        with self._mutex:
            self._lines_locked(waiter.channel, text, echoed=False)

    # -- hand-over grants (queue scripts) ------------------------------------------------

    def claim(self, waiter: Waiter, leaving: bool = False) -> bool:
        """Close ``waiter``'s wait: True if it was granted (and not recorded yet), else
        it is marked leaving (with ``leaving``) so a grant line arriving now is ignored.
        Exactly one of the hub's line and the waiter's own ending wins."""
        with self._mutex:
            if waiter.state == GRANTED:
                waiter.state = LEAVING  # recorded by the caller: never twice
                return True
            if leaving:
                waiter.state = LEAVING
                waiter.gone = not waiter.named
                if isinstance(waiter.carry, tuple):
                    # A sibling's release queued it and ended while it still waited
                    # (carry_end), so that release leaves nothing in its name: it is in
                    # the server's queue before it asked, as a named waiter is, and
                    # must leave it in its turn.
                    waiter.carry = None
                    waiter.named = True
            return False

    def successor(self, waiter: Waiter) -> Optional[Waiter]:
        """The waiter after ``waiter`` on its channel that still waits, or None (no I/O)."""
        with self._mutex:
            after = False
            for other in waiter.channel.waiters:
                if after and other.state == WAITING:
                    return other
                after = after or other is waiter
            return None

    def take_over(self, waiter: Waiter) -> bool:
        """The process's entry was re-pointed to ``waiter``: mark it named, unless it
        stopped waiting ungranted meanwhile (False: the entry names a waiter that is
        gone, and the caller must take it out in its name). A waiter granted meanwhile
        records its grant itself (True)."""
        with self._mutex:
            if waiter.gone:
                return False
            # as if it had queued now: the channel was confirmed for the leaving head
            waiter.counts = waiter.channel.confirmed.is_set()
            waiter.named = True
            return True

    def rewait(self, waiter: Waiter) -> None:
        """``waiter``'s grant was revoked before it was recorded: it waits again."""
        with self._mutex:
            waiter.state = WAITING
            waiter.hub_seen = waiter.other_seen = False
            waiter.token = 0

    def note_grant(self, waiter: Waiter) -> None:
        """A reply told ``waiter`` of its grant (ADOPTED, PASSED, a release's wakes): the
        hub must drop that grant's line when it reads it, unless it already did."""
        with self._mutex:
            self._note_locked(waiter)

    def _note_locked(self, waiter: Waiter) -> None:
        if waiter.hub_seen or waiter.other_seen or not waiter.counts:
            return
        if waiter not in waiter.channel.waiters:
            # Its wait is over (a leave in the name of a waiter that stopped before it was
            # named answered PASSED): its thread may wait again under the same id, and
            # the hub may have read the grant's line already, for that newer wait. An
            # echo would then drop the newer wait's own next grant line (a lost wake-up:
            # bug hunt); left unechoed, a late line costs the newer wait one adoption
            # round trip, which fails.
            return
        waiter.other_seen = True
        key = (waiter.channel.name, waiter.id)
        self._echo[key] = self._echo.get(key, 0) + 1

    def deliver(self, channel: str, wakes: Any, sent: int) -> None:
        """The fast path: a script reply's wake lines, for this process's waiters.

        ``sent``: a serial drawn before the script was sent. Only waiters registered
        before it can be the ones named (a later waiter of the same id had no entry yet),
        so a late reply never grants a newer wait. Lines for other processes are skipped.
        """
        if not wakes:
            return  # (most replies: a queued acquire's, a release nobody waited for)
        with self._mutex:
            ch = self._channels.get(channel)
            if ch is None:
                return
            for line in wakes:
                what, wid, token = wake_line(line)
                if not wid.startswith(self._mine):
                    continue
                for waiter in ch.waiters:
                    if waiter.id == wid and waiter.seq < sent:
                        if what == "g":
                            if waiter.state == WAITING:
                                waiter.state = GRANTED
                                waiter.token = token
                            self._note_locked(waiter)
                        waiter.event.set()
                        break

    def _lines_locked(self, ch: _Channel, payload: str, echoed: bool = True) -> None:
        """Act on a queue script's wake-up message (under the mutex): each line names one
        waiter; a line for another process is dropped unread (a channel is this
        process's own, but the release reply the releasing process delivers itself
        lists every process's lines). ``echoed``: a grant line a reply already told of
        (``_echo``) is dropped; False for lines read from a list, which have no echo."""
        for line in payload.split("\n"):
            what, wid, token = wake_line(line)
            if not wid.startswith(self._mine):
                continue
            key = (ch.name, wid)
            if what == "g" and echoed:
                pending = self._echo.get(key, 0)
                if pending > 0:
                    # A reply already told this process of that grant.
                    if pending == 1:
                        del self._echo[key]
                    else:
                        self._echo[key] = pending - 1
                    continue
            for waiter in ch.waiters:
                if waiter.id == wid:
                    if what == "g":
                        waiter.hub_seen = True
                        if waiter.state == WAITING:
                            waiter.state = GRANTED
                            waiter.token = token
                    waiter.event.set()
                    break

    def wait_subscribed(self, waiter: Waiter, timeout: float) -> bool:
        """Block until ``waiter``'s channel is confirmed subscribed, at most ``timeout`` s."""
        return bool(waiter.channel.confirmed.wait(timeout))

    def _nudge(self) -> None:
        # Wakes the hub thread out of its blocking read so it sends the new SUBSCRIBE now.
        try:
            self._io.publish(self._control, b"")
        except Exception:  # noqa: BLE001 - the waiter's own next attempt will report it
            log.debug("could not nudge the wake-up hub", exc_info=True)

    # -- waking --------------------------------------------------------------------------

    def _wake_locked(self, ch: _Channel, count: Optional[int]) -> None:
        for waiter in ch.waiters:
            if count is not None and count <= 0:
                break
            if not waiter.event.is_set():
                waiter.event.set()
                if count is not None:
                    count -= 1

    def _wake_everyone(self) -> None:
        with self._mutex:
            for ch in self._channels.values():
                self._wake_locked(ch, None)

    # -- the reader: one dialogue, run by the hub thread (aio.AsyncWakeHub: a task) ------

    def _run(self) -> None:
        drive(self._reader_steps(), self._perform)

    def _reader_steps(self) -> Generator[HubStep, Any, None]:
        """The hub's reader loop, written once without I/O (see :mod:`.dialogue`).

        Connects and subscribes to the control channel, then alternates between the
        (un)subscriptions the table asks for and dispatching what arrives, at least every
        ``TICK``. After any failure it tells the table the connection was lost, pauses
        (growing up to ``RECONNECT_BACKOFF[1]``) and connects again. Returns once the hub
        has been idle for ``IDLE_EXIT``; the connection is closed on every way out.
        """
        backoff = RECONNECT_BACKOFF[0]
        while True:
            pubsub = None
            try:
                pubsub = yield HubOp.OPEN, None, None
                self._control_seen = False
                yield HubOp.SUBSCRIBE, pubsub, (self._control,)
                while True:
                    subscribe, unsubscribe, done = self._plan_sync()
                    if done:
                        return
                    if subscribe:
                        yield HubOp.SUBSCRIBE, pubsub, tuple(ch.name for ch in subscribe)
                    if unsubscribe:
                        yield HubOp.UNSUBSCRIBE, pubsub, tuple(ch.name for ch in unsubscribe)
                    message = yield HubOp.READ, pubsub, TICK
                    if message is not None:
                        # Straight back to the blocking read, with no poll for more first:
                        # the thread just woken needs the GIL, which this one gives up
                        # only there (a poll cost each hand-off ~50 us). A message that
                        # is already buffered comes back from that read at once.
                        self._dispatch(message)
                    backoff = RECONNECT_BACKOFF[0]
            except Exception:  # noqa: BLE001 - the hub must outlive any one failure
                log.debug("wake-up hub lost its connection; reconnecting", exc_info=True)
                self._connection_lost()
                yield HubOp.PAUSE, None, backoff
                backoff = min(backoff * 2, RECONNECT_BACKOFF[1])
            finally:
                if pubsub is not None:
                    try:
                        yield HubOp.CLOSE, pubsub, None
                    except Exception:  # noqa: BLE001 - closing a broken connection
                        pass

    def _perform(self, step: HubStep) -> Any:
        """Do one step of :meth:`_reader_steps`, blocking (the hub thread)."""
        what, pubsub, arg = step
        if what == HubOp.OPEN:
            return self._io.pubsub()
        if what == HubOp.SUBSCRIBE:
            return pubsub.subscribe(*arg)
        if what == HubOp.UNSUBSCRIBE:
            return pubsub.unsubscribe(*arg)
        if what == HubOp.READ:
            return pubsub.get_message(timeout=arg)
        if what == HubOp.PAUSE:
            return threading.Event().wait(arg)
        return pubsub.close()

    def _plan_sync(self) -> Tuple[List[_Channel], List[_Channel], bool]:
        """The table work of a sync pass (no I/O): (subscribe, unsubscribe, exit now).

        New channels are to be subscribed; channels without waiters for longer than
        ``LINGER`` leave the table and are to be unsubscribed; a hub whose table stayed
        empty for ``IDLE_EXIT`` exits.
        """
        now = monotonic()
        subscribe: List[_Channel] = []
        unsubscribe: List[_Channel] = []
        with self._mutex:
            for name, ch in list(self._channels.items()):
                if not ch.sent:
                    ch.sent = True
                    subscribe.append(ch)
                elif (
                    not ch.waiters
                    and ch.confirmed.is_set()
                    and ch.idle_since is not None
                    and now - ch.idle_since > LINGER
                ):
                    del self._channels[name]
                    unsubscribe.append(ch)
            if not self._channels and not unsubscribe:
                if self._idle_since is None:
                    self._idle_since = now
                    self._idle_started_locked()
                elif now - self._idle_since > IDLE_EXIT:
                    self._runner = None
                    self._idle_since = None
                    return [], [], True
            else:
                self._idle_since = None
        return subscribe, unsubscribe, False

    def _idle_started_locked(self) -> None:
        """The table just became empty (called under the mutex); the hub may tidy up."""

    def _dispatch(self, message: Dict[str, Any]) -> None:
        raw_kind = str(message.get("type"))
        kind = _PLAIN_KIND.get(raw_kind, raw_kind)
        channel = _text(message.get("channel"), self._encoding)
        if kind == "message":
            if channel == self._control:
                return  # a nudge: the loop's next _sync does the work
            data = message.get("data")
            if isinstance(data, bytes):
                data = data.decode("utf-8", "replace")
            if isinstance(data, str) and data[:2] in ("g ", "w "):
                with self._mutex:
                    ch = self._channels.get(channel)
                    if ch is not None:
                        self._lines_locked(ch, data)
                return
            count = wake_count(data)
            with self._mutex:
                ch = self._channels.get(channel)
                if ch is not None:
                    self._wake_locked(ch, count)
        elif kind == "subscribe":
            if channel == self._control:
                # A second confirmation means redis-py reconnected and re-subscribed on its
                # own: wake-ups may have been lost in between, so everyone looks again.
                if self._control_seen:
                    with self._mutex:
                        self._lines_lost_locked()
                    self._wake_everyone()
                self._control_seen = True
                return
            with self._mutex:
                ch = self._channels.get(channel)
                if ch is not None:
                    if ch.confirmed.is_set():
                        self._wake_locked(ch, None)
                    ch.confirmed.set()

    def _connection_lost(self) -> None:
        with self._mutex:
            self._lost_locked()

    def _lines_lost_locked(self) -> None:
        """Lines published while the subscription was down are lost (under the mutex):
        none will be read late, so no echo is owed for them, and a waiter's grant made
        meanwhile can be learnt only from a reply. So no waiter of this wait counts on
        its line any more (``Waiter.counts``): a grant a reply tells of must not leave an
        echo that would drop the thread's next real line."""
        self._echo.clear()
        for ch in self._channels.values():
            for waiter in ch.waiters:
                waiter.counts = False

    def _lost_locked(self) -> None:
        """The subscriber connection is gone (under the mutex): every channel is to be
        subscribed again, and every waiter looks again (messages may have been lost)."""
        self._lines_lost_locked()
        for ch in self._channels.values():
            ch.sent = False
            ch.confirmed.clear()
            self._wake_locked(ch, None)
