"""The wake-up hub of a Redis Cluster client: one subscriber per shard, SSUBSCRIBE.

On a cluster client the release scripts publish with SPUBLISH, which the server delivers
only to subscribers connected to the shard that owns the channel's slot (the primitive's
hash tag, so the same shard as its hash). :class:`ShardedWakeHub` therefore keeps one
plain subscriber connection per primary node that owns a channel with waiters, sends
SSUBSCRIBE / SUNSUBSCRIBE there, and waits on all of those sockets at once with
``poll()``. It is nudged through a local socket pair rather than a control channel: a
control channel would have to live on every node's slots. redis-py's ``ClusterPubSub``
is not used because its ``get_sharded_message(timeout=...)`` waits on one node at a time
(a wake-up on another shard would wait a whole tick), and it starts worker threads of its
own. When a node answers MOVED, or unsubscribes a channel because its slot moved, the hub
refreshes the client's slot map and subscribes again where the slot lives now, waking
every waiter of that channel in case a message was missed in between.

The table, waking and waiting rules are :class:`~.wakehub.WakeHub`'s; only the transport
differs.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import weakref
from typing import Any, Dict

from .wakehub import RECONNECT_BACKOFF, TICK, WakeHub, _text

__all__ = ["ShardedWakeHub"]

log = logging.getLogger(__name__)


class ShardedWakeHub(WakeHub):
    """The hub for a ``redis.cluster.RedisCluster`` client (see "Redis Cluster" above).

    The channel table, waking and waiting rules are :class:`WakeHub`'s; only the transport
    differs: one subscriber per primary node, SSUBSCRIBE, and a local socket pair for
    nudges. Only the hub thread touches the per-node PubSub objects.
    """

    def __init__(self, client: Any, namespace: str) -> None:
        super().__init__(client, namespace)
        self._pubsubs: Dict[str, Any] = {}  # node name -> redis.client.PubSub
        self._refresh = False  # refresh the slot map before the next subscriptions
        self._bell_r, self._bell_w = socket.socketpair()
        self._bell_r.setblocking(False)
        self._bell_w.setblocking(False)
        # Hubs are forgotten when idle (see "Lifetime"): close the pair with the hub.
        weakref.finalize(self, _close_sockets, self._bell_r, self._bell_w)

    def _nudge(self) -> None:
        try:
            self._bell_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # the pair is full of unread nudges already: the hub will wake

    def _run(self) -> None:
        backoff = RECONNECT_BACKOFF[0]
        while True:
            try:
                if self._refresh:
                    self._refresh = False
                    self._client.nodes_manager.initialize()
                while True:
                    if self._sync_shards():
                        return
                    self._drain()
                    self._sleep(TICK)
                    self._drain()
                    backoff = RECONNECT_BACKOFF[0]
            except Exception as exc:  # noqa: BLE001 - the hub must outlive any one failure
                log.debug("sharded wake-up hub failed; resubscribing", exc_info=True)
                if "MOVED" in str(exc) or "ASK" in str(exc):
                    self._refresh = True
                self._close_all()
                self._connection_lost()
                threading.Event().wait(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF[1])

    def _close_all(self) -> None:
        pubsubs, self._pubsubs = self._pubsubs, {}
        for pubsub in pubsubs.values():
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def _lost_locked(self) -> None:
        for ch in self._channels.values():
            ch.node = None
        super()._lost_locked()

    def _pubsub_for(self, node: Any) -> Any:
        pubsub = self._pubsubs.get(node.name)
        if pubsub is None:
            pubsub = self._pubsubs[node.name] = (
                self._client.get_redis_connection(node).pubsub()
            )
        return pubsub

    def _sync_shards(self) -> bool:
        """SSUBSCRIBE/SUNSUBSCRIBE what the table asks for; True when the hub should exit."""
        subscribe, unsubscribe, done = self._plan_sync()
        if done:
            return True
        for ch in subscribe:
            # The channel's slot is its hash tag's: the primary serving it is where the
            # release script's SPUBLISH is delivered. One command per channel, since
            # channels of different slots may not share one SSUBSCRIBE.
            node = self._client.nodes_manager.get_node_from_slot(
                self._client.keyslot(ch.name)
            )
            ch.node = node.name
            self._pubsub_for(node).ssubscribe(ch.name)
        for ch in unsubscribe:
            pubsub = self._pubsubs.get(ch.node or "")
            if pubsub is not None:
                pubsub.sunsubscribe(ch.name)
        return False

    def _idle_started_locked(self) -> None:
        self._close_all()  # nothing to listen to: give the node connections back

    def _drain(self) -> None:
        """Dispatch every message already readable on any node's connection."""
        for pubsub in list(self._pubsubs.values()):
            message = pubsub.get_message(timeout=0)
            while message is not None:
                self._dispatch_sharded(pubsub, message)
                message = pubsub.get_message(timeout=0)

    def _sleep(self, timeout: float) -> None:
        """Block until a node's socket is readable, a nudge arrives, or ``timeout``."""
        poller = select.poll()
        poller.register(self._bell_r, select.POLLIN)
        for pubsub in self._pubsubs.values():
            connection = pubsub.connection
            sock = getattr(connection, "_sock", None) if connection is not None else None
            if sock is not None:
                poller.register(sock, select.POLLIN)
        poller.poll(timeout * 1000.0)
        try:
            while self._bell_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _dispatch_sharded(self, pubsub: Any, message: Dict[str, Any]) -> None:
        if message.get("type") != "sunsubscribe":
            self._dispatch(message)
            return
        channel = _text(message.get("channel"), self._encoding)
        # Our own SUNSUBSCRIBE removed the channel from the PubSub's table; an unsolicited
        # one (its slot moved to another node) leaves it there. Then the channel must be
        # subscribed again where the slot lives now.
        if not any(_text(c, self._encoding) == channel for c in pubsub.shard_channels):
            return
        pubsub.sunsubscribe(channel)  # keep redis-py from re-subscribing it here
        self._refresh = True
        with self._mutex:
            ch = self._channels.get(channel)
            if ch is not None:
                ch.sent = False
                ch.node = None
                ch.confirmed.clear()
                self._wake_locked(ch, None)
        raise _SlotMoved(channel)


def _close_sockets(*sockets: socket.socket) -> None:
    for sock in sockets:
        sock.close()


class _SlotMoved(Exception):
    """A channel's slot moved: restart the hub loop so the slot map is refreshed first."""
