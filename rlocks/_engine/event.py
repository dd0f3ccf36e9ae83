"""The distributed Event: one flag in Redis, waiters told by a mark that outlives a clear.

State (``lua/event_lib.lua``), in one cluster slot (``keys_for(namespace, "event",
name)``):

- the flag, hash ``<ns>:event:{name}`` with ``set = '1'``: it exists only while the
  Event is set, without expiry (an Event is state, not a hold: a set Event stays set
  until a ``clear()``, or until Redis loses its data);
- the waiters, sorted set ``<ns>:event:{name}:q``: one entry per ``wait()`` call,
  member ``<owner>#<wait>``, score = when its lease ends (server ms). A waiter renews
  it each time it looks (at least every third of ``entry_lease``), so a dead waiter's
  entry ends by itself; the set expires with its longest lease and is gone when nobody
  waits.

``wait`` asks ``event_wait``, which answers "set" or registers the entry; then (not set)
it enlists with the process's wake-up hub, which keeps a hint that came in between
(``wakeups.KEEP``), or, if the hub was not listening yet, it asks once more: a ``set()``
after its first call finds the entry, and its hint or the next look finds the waiter. No
lost wake-up, and a wait on a set Event costs one round trip and no hub. ``set()`` marks
every live entry (``!`` in front) and sends each waiter's process a hint; the mark is the
notification, so a waiter returns True even when a ``clear()`` came before it looked
(CPython's ``test_set_and_clear``, gh-57711), and a lost hint costs at most a third of
the entry lease, never the wake-up. ``clear()`` deletes the flag and leaves the marks.

Why a mark per entry rather than a generation counter in the flag's hash (which a
waiter would compare with the one it first saw): the counter must outlive every
``clear()`` while anyone waits, so the flag's hash would need a lease tied to the
waiters' (renewed by every waiter, and made persistent again by the next ``set()``),
and its value would start again from 0 once deleted. The mark lives in the waiter's own
entry, so each key has one lifetime rule: the flag while set, the queue while waited on.
``set()`` walks the waiters either way (one hint each).

Each ``wait()`` has its own member, so a stale entry of an earlier wait of the same
thread (its leave lost with the link) can never answer for this one, and a first call
sent again after a lost reply finds its own mark. A waiter stalled (or cut off from
Redis) longer than its entry lease loses its entry: it registers again when it looks,
and sees a ``set()`` that is still set, but not one that was cleared again meanwhile.

The dialogues (:func:`EventCore._wait`, ``_set``, ``_clear``, ``_is_set``) serve both
drivers, :func:`~.steps.drive` and :func:`~.steps.adrive`.
"""

from __future__ import annotations

import itertools
from typing import Any, Generator, Optional

from . import checks, identity, wakeups
from .backends import backend_for
from .clients import checked_client, default_client, encoding_of
from .clock import monotonic
from .dialogues import RELEASE_PATIENCE
from .keys import PrimitiveKeys, keys_for
from .primitive import ENTRY_LEASE
from .scripts import GRANTED, Call, load
from .steps import Enlist, Interrupted, Listen, Pause, Read, call, transient

__all__ = ["ENTRY_LEASE", "EventCore", "PATIENCE"]

Steps = Generator[Any, Any, Any]

_WAIT = load("event_wait", "event_lib")
_LEAVE = load("event_leave", "event_lib")
_SET = load("event_set", "event_lib")
_CLEAR = load("event_clear", "event_lib")

#: s ``set()`` and ``clear()`` send their call again after a broken link, before the
#: error propagates (as a lock's release does).
PATIENCE = RELEASE_PATIENCE

# Numbers the waits of this process, so each wait() has a member of its own. (A fork
# child counts on from its parent's value, under an owner id with a new nonce.)
_waits = itertools.count(1)


def _flag(raw: Any) -> bool:
    """The flag field as HGET returns it (bytes or str, None when clear)."""
    return raw in (b"1", "1")


class EventCore:
    """What both Event surfaces share: the name, the keys, the checks, the dialogues.
    No I/O here: the public classes drive the dialogues."""

    __slots__ = ("_name", "_namespace", "_client", "_backend", "_keys", "_entry_ms",
                 "__weakref__")

    #: Public class name used in messages and reprs.
    _label = "rlocks.Event"
    #: Whether this is the asyncio twin (the client must be a ``redis.asyncio`` one).
    _aio = False

    def _configure(self, name: object, client: Any, namespace: object,
                   entry_lease: object) -> None:
        """Check the arguments and set this object up (no I/O). TypeError / ValueError
        naming the public class and the Event's name."""
        label = self._label
        self._name = checks.check_name(name, label)
        self._namespace = checks.check_namespace(namespace, label, self._name)
        self._entry_ms = checks.entry_lease(entry_lease, label, self._name)
        self._client = self._resolve_client(client)
        if self._client is not None:  # (asyncio's default client: UTF-8)
            checks.check_wire_names({"name": self._name, "namespace": self._namespace},
                                    [encoding_of(self._client)], self._where)
        self._backend: Any = self._backend_of(self._client)
        self._keys: PrimitiveKeys = keys_for(self._namespace, "event", self._name)

    @property
    def _where(self) -> str:
        return f"{self._label}({checks.shown(self._name)})"

    def _resolve_client(self, client: Any) -> Any:
        """``client`` as given, checked (``clients.checked_client``), or
        the default one (``None`` for asyncio: each loop's own, see ``_backend_of``)."""
        where = self._where
        if client is None:
            return None if self._aio else self._default_client()
        if hasattr(client, "masters") and hasattr(client, "queues"):
            raise ValueError(
                f"{where}: client is a Quorum, but an Event keeps its flag and its waiters "
                "on one server (a quorum of flags is not built): use a single server or "
                "a Redis Cluster client")
        return checked_client(client, where, self._aio)

    def _default_client(self) -> Any:
        return default_client()

    def _backend_of(self, client: Any) -> Any:
        return backend_for(client)

    @staticmethod
    def _owner() -> str:
        """Who waits: the calling thread (the running task, in the asyncio twin)."""
        return identity.thread_owner()

    # -- read-only facts (no I/O) -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The Event's name, as given."""
        return self._name

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def entry_lease(self) -> float:
        """Seconds a waiter's entry lives between its looks (a dead waiter's, at most)."""
        return self._entry_ms / 1000.0

    @property
    def client(self) -> Any:
        """The client this Event talks to."""
        return self._client

    def __repr__(self) -> str:
        # Local truth only: whether it is set is Redis's to say (is_set(), a round trip).
        return f"<{self._label} {checks.shown(self._name)} at {id(self):#x}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cannot pickle or copy {self._where}: it holds a client; build an "
                        "Event of the same name (and namespace) in the other process: it "
                        "is the same Event")

    # -- the dialogues ----------------------------------------------------------------------

    def _call(self, script: Any, *args: Any) -> Call:
        keys = self._keys
        return Call(script, (keys.hash, keys.queue), args)

    def _is_set(self) -> Steps:
        """One read of the flag (errors propagate, as a lock's ``locked()``)."""
        return _flag((yield Read(self._backend, ("HGET", self._keys.hash, "set"))))

    def _set(self) -> Steps:
        """Set the flag and tell every waiter; wakes this process's waiters at once."""
        reply = yield from call(self._backend, self._call(_SET, self._keys.wake),
                                monotonic() + PATIENCE)
        wakeups.wake_local(self._keys.hash, reply.woken)
        return None

    def _clear(self) -> Steps:
        yield from call(self._backend, self._call(_CLEAR), monotonic() + PATIENCE)
        return None

    def _seconds(self, timeout: object) -> Optional[float]:
        """``wait``'s timeout -> seconds (``None``: no limit), as ``threading.Event.wait``
        takes it: a negative one is 0 (one look); TypeError / ValueError (NaN) /
        OverflowError (above ``threading.TIMEOUT_MAX``) naming the Event, before I/O."""
        return checks.semaphore_wait(True, timeout, self._label, self._name)

    def _leave(self, member: str, once: bool = False) -> Steps:
        """``event_leave``: its reply, or None when Redis could not be reached; sent again
        after a broken link until the entry's lease would have ended anyway (``once``:
        one try). Best effort: an entry left behind ends with its lease."""
        until = monotonic() + (0.0 if once else self._entry_ms / 1000.0)
        try:
            return (yield from call(self._backend, self._call(_LEAVE, member), until))
        except BaseException as exc:  # noqa: BLE001 - best effort
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            return None

    def _wait(self, owner: str, seconds: Optional[float]) -> Steps:
        """The wait dialogue of ``owner`` (a thread's or a task's id): True as soon as the
        Event is set or a ``set()`` told this waiter, False at the deadline."""
        if seconds == 0:
            return (yield from self._is_set())  # a look: no entry, no hub
        backend, keys, lease = self._backend, self._keys, self._entry_ms
        deadline = None if seconds is None else monotonic() + seconds
        member = f"{owner}#{next(_waits)}"
        waiter: Any = None
        entered = False  # whether an entry of it may be in Redis (then it must leave)
        try:
            while True:
                entered = True
                reply = yield from call(backend, self._call(_WAIT, member, lease), deadline)
                if reply.status == GRANTED:
                    entered = reply.a == 1
                    break
                if waiter is None:
                    # Enlisted once it has an entry (a set Event costs no hub): a hint
                    # sent since its call is kept for it (wakeups.KEEP) if the process's
                    # subscriber listened; if it was not listening yet, it looks again.
                    waiter = yield Enlist(backend, keys.wake, keys.hash, member, deadline)
                    if waiter.fresh:
                        continue
                now = monotonic()
                if deadline is not None and now >= deadline:
                    # Out of time: a set() that told it just now still counts.
                    entered = False
                    left = yield from self._leave(member)
                    return left is not None and left.status == GRANTED
                pause = lease / 3000.0
                yield Listen(waiter, pause if deadline is None else min(pause, deadline - now))
        except BaseException as exc:
            # A link error out of call() with a deadline: Redis was away until (nearly:
            # call() gives up when its next try would be late) the deadline. A time-out,
            # and one try to leave (the entry ends with its lease anyway).
            late = transient(exc) and deadline is not None
            if entered:
                yield from self._leave(member, once=late)
            if isinstance(exc, Interrupted):
                raise exc.cause from None
            if not late:
                raise
            assert deadline is not None
            if deadline > monotonic():
                yield Pause(deadline - monotonic())  # never a False before its time
            return False
        finally:
            if waiter is not None:
                waiter.close()
        if entered:
            yield from self._leave(member)
        return True
