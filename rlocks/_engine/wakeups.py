"""Wake-ups: the hints that tell a waiting thread (or task) to ask again now.

A script that frees capacity publishes ``<key>\\n<owner>`` on the channel of each head
waiter's process, ``<namespace>:wake:<process>`` (``lua/lib.lua``). A hint grants
nothing: the woken waiter claims with its own acquire, which the queue on the server
orders. So a lost, late or duplicated hint costs time, never safety; and every waiter
also asks again by itself at least every third of its entry lease (which renews its
place) and when the holder's lease would end.

One subscriber per process, client and namespace reads the channel: a daemon thread
(:class:`Hub`) or, for ``redis.asyncio`` clients, a task per event loop
(:class:`AsyncHub`). Both hand each hint to :func:`wake`, which sets the
:class:`Waiter` registered for ``(key, owner)``. A hint that comes before its waiter is
registered is kept a moment (:data:`KEEP`), so a waiter that registers just after its
first acquire reply misses nothing. A release that woke waiters of its own process wakes
them at once from its reply (``wake_local``), without the round trip through the server.

While a subscriber is not connected (the server restarted, the link broke) hints are
lost: on reconnecting it wakes every waiter it serves, and each asks again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
from typing import Any, Dict, Iterable, Optional, Tuple

import redis

from . import identity
from .clock import monotonic

__all__ = ["KEEP", "AsyncHub", "Hub", "Waiter", "wake", "wake_local"]

log = logging.getLogger(__name__)

KEEP = 2.0  # s a hint for nobody (yet) is kept for a waiter about to register
IDLE = 60.0  # s a subscriber with no waiter stays connected before it closes

_mutex = threading.Lock()
_waiters: Dict[Tuple[str, str], "Waiter"] = {}
_early: Dict[Tuple[str, str], float] = {}


class Waiter:
    """One thread's or task's wait for hints on one key (a primitive, a Condition)."""

    __slots__ = ("key", "owner", "hub", "fresh", "_event", "_loop", "__weakref__")

    def __init__(self, key: str, owner: str, hub: Any, loop: Optional[Any] = None) -> None:
        self.key, self.owner, self.hub = key, owner, hub
        self.fresh = False  # the subscriber was not listening before this registration
        self._loop = loop
        if loop is not None:
            self._event: Any = asyncio.Event()
        else:
            # A thread's: a C lock held while not woken (released by set(), taken back by
            # wait()), cheaper to wake across threads than threading.Event's Condition.
            self._event = threading.Lock()
            self._event.acquire()

    def set(self) -> None:
        """Wake it (from any thread)."""
        if self._loop is None:
            try:
                self._event.release()
            except RuntimeError:
                pass  # woken already
        else:
            try:
                self._loop.call_soon_threadsafe(self._event.set)
            except RuntimeError:
                pass  # its loop is closed: nobody waits any more

    def pending(self) -> bool:
        """Whether a hint came that no wait has used yet."""
        if self._loop is None:
            return not self._event.locked()
        return bool(self._event.is_set())

    def wait(self, seconds: float) -> bool:
        """Wait at most ``seconds`` for a hint; True if one came (it is used up)."""
        return bool(self._event.acquire(timeout=max(0.0, seconds)))

    async def await_(self, seconds: float) -> bool:
        # asyncio.timeout, not wait_for: on 3.11 wait_for drops a cancellation that
        # arrives in the step the event is set, and the cancelled task would wait on.
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await self._event.wait()
            woken = True
        except TimeoutError:
            woken = False
        self._event.clear()
        return woken

    def close(self) -> None:
        with _mutex:
            if _waiters.get((self.key, self.owner)) is self:
                del _waiters[(self.key, self.owner)]


def _register(waiter: Waiter) -> None:
    now = monotonic()
    with _mutex:
        _waiters[(waiter.key, waiter.owner)] = waiter
        early = _early.pop((waiter.key, waiter.owner), None)
        if len(_early) > 1000:
            for k in [k for k, t in _early.items() if now - t > KEEP]:
                del _early[k]
    if early is not None and now - early <= KEEP:
        waiter.set()


def wake(key: str, owner: str) -> None:
    """Set the waiter of ``(key, owner)``, or keep the hint a moment for it."""
    with _mutex:
        waiter = _waiters.get((key, owner))
        if waiter is None:
            _early[(key, owner)] = monotonic()
            return
    waiter.set()


def wake_local(key: str, owners: Iterable[str]) -> None:
    """Wake those of ``owners`` that belong to this process (from a reply's woken list)."""
    prefix = identity.process_token() + ":"
    for owner in owners:
        if owner.startswith(prefix):
            wake(key, owner)


def _dispatch(data: Any) -> None:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    key, sep, owner = text.rpartition("\n")
    if sep:
        wake(key, owner)


def _wake_all(hub: Any) -> None:
    with _mutex:
        mine = [w for w in _waiters.values() if w.hub is hub]
    for waiter in mine:
        waiter.set()


def _has_waiters(hub: Any) -> bool:
    with _mutex:
        return any(w.hub is hub for w in _waiters.values())


def _subscriber_client(client: Any) -> Any:
    """A plain client to subscribe with: the client itself, or for a cluster a client of
    one of its nodes, chosen at random (a PUBLISH reaches every node's subscribers)."""
    if hasattr(client, "get_nodes"):
        node = random.choice(client.get_nodes())
        return node.redis_connection or redis.Redis(host=node.host, port=node.port)
    return client


class Hub:
    """The subscriber thread of one process, client and namespace."""

    def __init__(self, client: Any, namespace_channel: str) -> None:
        self.client = client
        self.channel = namespace_channel + identity.process_token()
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def enlist(self, key: str, owner: str, seconds: float) -> Waiter:
        """A waiter for ``(key, owner)``; starts the subscriber if it is not running and
        waits (up to ``seconds``) until it listens. ``fresh``: it was not listening before."""
        waiter = Waiter(key, owner, self)
        fresh = not self.ready.is_set()
        _register(waiter)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="rlocks-wakeups")
                self._thread.start()
        if fresh:
            self.ready.wait(seconds)
        waiter.fresh = fresh
        return waiter

    def _run(self) -> None:
        idle_since = monotonic()
        delay = 0.05
        while True:
            pubsub = None
            try:
                pubsub = _subscriber_client(self.client).pubsub()
                pubsub.subscribe(self.channel)
                while True:  # listening once the server confirmed the subscription
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "subscribe":
                        break
                self.ready.set()
                _wake_all(self)  # hints sent while it was away are lost: look again
                delay = 0.05
                while True:
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        _dispatch(message["data"])
                        idle_since = monotonic()
                    elif not _has_waiters(self):
                        if monotonic() - idle_since > IDLE:
                            with self._lock:
                                if not _has_waiters(self):
                                    self.ready.clear()
                                    self._thread = None
                                    return
                    else:
                        idle_since = monotonic()
            except Exception as exc:  # noqa: BLE001 - the link: reconnect
                self.ready.clear()
                with self._lock:
                    if not _has_waiters(self):
                        # Nobody to serve (the client may have been closed): no new
                        # connection; the next waiter starts the subscriber again.
                        self._thread = None
                        return
                log.debug("wake-up subscriber %s: %r; reconnecting", self.channel, exc)
                _wake_all(self)
                threading.Event().wait(delay)
                delay = min(delay * 2, 1.0)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001
                        pass


class AsyncHub:
    """The subscriber task of one event loop, client and namespace."""

    def __init__(self, client: Any, namespace_channel: str) -> None:
        self.client = client
        self.channel = namespace_channel + identity.process_token()
        self.ready = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None

    async def enlist(self, key: str, owner: str, seconds: float) -> Waiter:
        waiter = Waiter(key, owner, self, asyncio.get_running_loop())
        fresh = not self.ready.is_set()
        _register(waiter)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        if fresh:
            try:
                async with asyncio.timeout(seconds):
                    await self.ready.wait()
            except TimeoutError:
                pass
        waiter.fresh = fresh
        return waiter

    async def _run(self) -> None:
        idle_since = monotonic()
        delay = 0.05
        while True:
            pubsub = node_client = None
            try:
                client = self.client
                if hasattr(client, "get_nodes"):  # a cluster: one node (see _subscriber_client)
                    node = random.choice(client.get_nodes())
                    client = node_client = redis.asyncio.Redis(  # (the cluster's settings)
                        connection_pool=redis.asyncio.ConnectionPool(
                            connection_class=node.connection_class, **node.connection_kwargs))
                pubsub = client.pubsub()
                await pubsub.subscribe(self.channel)
                while True:  # listening once the server confirmed the subscription
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "subscribe":
                        break
                self.ready.set()
                _wake_all(self)
                delay = 0.05
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        _dispatch(message["data"])
                        idle_since = monotonic()
                    elif not _has_waiters(self):
                        if monotonic() - idle_since > IDLE:
                            self.ready.clear()
                            return
                    else:
                        idle_since = monotonic()
            except asyncio.CancelledError:
                self.ready.clear()
                raise
            except Exception as exc:  # noqa: BLE001 - the link: reconnect
                self.ready.clear()
                if not _has_waiters(self):
                    return  # nobody to serve (the client may have been closed): see Hub
                log.debug("wake-up subscriber %s: %r; reconnecting", self.channel, exc)
                _wake_all(self)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                if pubsub is not None:
                    try:
                        await pubsub.aclose()
                    except Exception:  # noqa: BLE001
                        pass
                if node_client is not None:
                    try:
                        await node_client.aclose()
                    except Exception:  # noqa: BLE001
                        pass


def _reset_after_fork() -> None:
    global _mutex
    _mutex = threading.Lock()
    _waiters.clear()
    _early.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
