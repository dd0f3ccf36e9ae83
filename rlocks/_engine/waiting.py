"""Waiting for a primitive: the per-process wake-up hub and the deadline loop.

Why a hub
---------
A release script publishes a wake-up on the primitive's channel in the same atomic step
that frees it. Waiters must hear it without sleep-polling and without one connection per
waiting thread, so each process keeps ONE subscriber connection per (connection pool,
namespace), owned by one daemon thread, the hub. Threads that wait register a
:class:`Waiter` (an Event) on a channel; the hub subscribes to the channels that have
waiters and, when a wake-up "n" arrives, sets the events of the first n waiters that are
not already woken, in arrival order. One release therefore wakes one thread per process,
not every thread (no thundering herd).

Only the hub thread touches its PubSub object (redis-py's PubSub is not meant to be shared
between threads). A thread that needs a new subscription puts it in the hub's table and
publishes an empty message on the hub's private control channel, which wakes the hub
from its blocking read; the hub then sends SUBSCRIBE. A waiter makes its second attempt
only after the SUBSCRIBE is confirmed, so a release between the attempt and the
subscription cannot be missed.

Why a bounded re-check
----------------------
Messages can be lost (the subscriber reconnected) and holders can crash without
releasing. So a waiter never sleeps longer than the blocking hold's remaining lease, which
every busy script reply carries, and never past its own deadline. When the hub cannot
confirm its subscription, waiters re-check every ``DEGRADED_POLL`` seconds instead. When
the hub reconnects it wakes every waiter, since messages may have been lost meanwhile.

Lost wake-ups inside the process are prevented by two rules: a waiter clears its event
*before* each attempt (a wake-up that lands during the attempt causes one more attempt),
and a waiter that leaves with an unconsumed wake-up passes it on to the next waiter.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import identity
from .clock import monotonic
from .clients import pool_of
from .scripts import Reply

__all__ = ["WakeHub", "Waiter", "hub_for", "wait_until_granted", "wake_count"]

log = logging.getLogger(__name__)

LINGER = 5.0  # s an unused channel stays subscribed, so repeated contention re-uses it
TICK = 1.0  # s between the hub's housekeeping passes (unsubscribing, idle exit)
IDLE_EXIT = 30.0  # s without any channel after which the hub thread closes and exits
SUBSCRIBE_WAIT = 5.0  # s a waiter waits at most for its SUBSCRIBE to be confirmed
DEGRADED_POLL = 0.25  # s between re-checks while the subscription is not confirmed
NO_LEASE_RECHECK = 1.0  # s between re-checks when the holder's key has no expiry
RECONNECT_BACKOFF = (0.05, 1.0)  # s, first and largest pause before reconnecting


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


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Channel:
    """A subscribed (or to-be-subscribed) channel and its waiters, oldest first."""

    __slots__ = ("name", "waiters", "confirmed", "sent", "idle_since")

    def __init__(self, name: str) -> None:
        self.name = name
        self.waiters: Deque[Waiter] = deque()
        self.confirmed = threading.Event()  # SUBSCRIBE acknowledged by the server
        self.sent = False  # SUBSCRIBE sent on the current connection
        self.idle_since: Optional[float] = None


class Waiter:
    """One waiting thread's registration on one channel."""

    __slots__ = ("event", "channel")

    def __init__(self, channel: _Channel) -> None:
        self.event = threading.Event()
        self.channel = channel

    @property
    def subscribed(self) -> bool:
        return self.channel.confirmed.is_set()


class WakeHub:
    """The process's subscriber for one (connection pool, namespace). See the module doc."""

    def __init__(self, client: Any, namespace: str) -> None:
        self._client = client
        # The private control channel stays inside the namespace, so an ACL user limited
        # to the namespace's channels may use it.
        self._control = f"{namespace}:hub:{identity.process_token()}"
        self._mutex = threading.Lock()
        self._channels: Dict[str, _Channel] = {}
        self._thread: Optional[threading.Thread] = None
        self._control_seen = False
        self._idle_since: Optional[float] = None  # when the table last became empty

    # -- called by waiting threads -------------------------------------------------------

    def register(self, channel: str) -> Waiter:
        """Add a waiter on ``channel``; make sure the hub subscribes to it."""
        with self._mutex:
            ch = self._channels.get(channel)
            created = ch is None
            if ch is None:
                ch = self._channels[channel] = _Channel(channel)
            ch.idle_since = None
            waiter = Waiter(ch)
            ch.waiters.append(waiter)
            started = self._thread is None
            if started:
                self._thread = threading.Thread(
                    target=self._run, name="rlocks-wakeup-hub", daemon=True
                )
                self._thread.start()
        if created and not started:
            self._nudge()
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        """Remove ``waiter``; a wake-up it did not use goes to the next waiter."""
        with self._mutex:
            ch = waiter.channel
            try:
                ch.waiters.remove(waiter)
            except ValueError:  # pragma: no cover - registered once, removed once
                pass
            if waiter.event.is_set():
                self._wake_locked(ch, 1)
            if not ch.waiters:
                ch.idle_since = monotonic()

    def wait_subscribed(self, waiter: Waiter, timeout: float) -> bool:
        """Block until ``waiter``'s channel is confirmed subscribed, at most ``timeout`` s."""
        return waiter.channel.confirmed.wait(timeout)

    def _nudge(self) -> None:
        # Wakes the hub thread out of its blocking read so it sends the new SUBSCRIBE now.
        try:
            self._client.publish(self._control, b"")
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

    # -- the hub thread ------------------------------------------------------------------

    def _run(self) -> None:
        backoff = RECONNECT_BACKOFF[0]
        while True:
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                self._control_seen = False
                pubsub.subscribe(self._control)
                while True:
                    if self._sync(pubsub):
                        return
                    message = pubsub.get_message(timeout=TICK)
                    while message is not None:
                        self._dispatch(message)
                        message = pubsub.get_message(timeout=0)
                    backoff = RECONNECT_BACKOFF[0]
            except Exception:  # noqa: BLE001 - the hub must outlive any one failure
                log.debug("wake-up hub lost its connection; reconnecting", exc_info=True)
                self._connection_lost()
                threading.Event().wait(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF[1])
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001 - closing a broken connection
                        pass

    def _sync(self, pubsub: Any) -> bool:
        """Send the SUBSCRIBE/UNSUBSCRIBE the table asks for; True when the hub should exit."""
        now = monotonic()
        subscribe: List[str] = []
        unsubscribe: List[str] = []
        with self._mutex:
            for name, ch in list(self._channels.items()):
                if not ch.sent:
                    ch.sent = True
                    subscribe.append(name)
                elif (
                    not ch.waiters
                    and ch.confirmed.is_set()
                    and ch.idle_since is not None
                    and now - ch.idle_since > LINGER
                ):
                    del self._channels[name]
                    unsubscribe.append(name)
            if not self._channels and not unsubscribe:
                if self._idle_since is None:
                    self._idle_since = now
                elif now - self._idle_since > IDLE_EXIT:
                    self._thread = None
                    self._idle_since = None
                    return True
            else:
                self._idle_since = None
        if subscribe:
            pubsub.subscribe(*subscribe)
        if unsubscribe:
            pubsub.unsubscribe(*unsubscribe)
        return False

    def _dispatch(self, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        channel = _text(message.get("channel"))
        if kind == "message":
            if channel == self._control:
                return  # a nudge: the loop's next _sync does the work
            count = wake_count(message.get("data"))
            with self._mutex:
                ch = self._channels.get(channel)
                if ch is not None:
                    self._wake_locked(ch, count)
        elif kind == "subscribe":
            if channel == self._control:
                # A second confirmation means redis-py reconnected and re-subscribed on its
                # own: wake-ups may have been lost in between, so everyone looks again.
                if self._control_seen:
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
            for ch in self._channels.values():
                ch.sent = False
                ch.confirmed.clear()
                self._wake_locked(ch, None)


_hubs: Dict[Tuple[int, str], WakeHub] = {}
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

    Hubs live as long as the process (their thread exits when idle); one exists per pool
    and namespace in use, so share clients between primitives rather than making a pool
    per lock.
    """
    key = (id(pool_of(client)), namespace)
    hub = _hubs.get(key)
    if hub is None:
        with _hubs_mutex:
            hub = _hubs.get(key)
            if hub is None:
                hub = _hubs[key] = WakeHub(client, namespace)
    return hub


def _pause(reply: Reply, subscribed: bool) -> float:
    """How long to sleep after a busy reply before looking again (absent a wake-up)."""
    left = reply.retry_after
    # The holder's key disappears when its lease ends; look again just after that.
    pause = NO_LEASE_RECHECK if left < 0 else left + 0.001
    return pause if subscribed else min(pause, DEGRADED_POLL)


def wait_until_granted(
    hub: WakeHub,
    channel: str,
    attempt: Callable[[], Reply],
    deadline: Optional[float],
) -> Reply:
    """Attempt until granted or ``deadline`` (monotonic s; ``None``: never) passes.

    Called after a first attempt came back busy. Returns the last reply: granted, or busy
    when the deadline passed. Redis errors from ``attempt`` propagate at once.
    """
    waiter = hub.register(channel)
    try:
        bound = SUBSCRIBE_WAIT
        if deadline is not None:
            bound = max(0.0, min(bound, deadline - monotonic()))
        subscribed = hub.wait_subscribed(waiter, bound)
        while True:
            waiter.event.clear()
            reply = attempt()
            if not reply.busy:
                return reply
            now = monotonic()
            if deadline is not None and now >= deadline:
                return reply
            pause = _pause(reply, subscribed)
            if deadline is not None:
                pause = min(pause, deadline - now)
            waiter.event.wait(pause)
            subscribed = waiter.subscribed
    finally:
        hub.unregister(waiter)
