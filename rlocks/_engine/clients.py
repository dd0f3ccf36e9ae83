"""The client a primitive talks to when the caller passes none.

``client=None`` means ``RLOCKS_URL`` from the environment, else ``redis://localhost:6379/0``.
One client (one connection pool) is made per URL per process and shared by every primitive
that uses it, so a thousand locks do not open a thousand pools.

Unlike redis-py's own default, this client has socket timeouts and does not retry: a lock
call on a dead link must fail after a bounded time (one socket timeout), not hang forever
or for ``retries x socket timeout`` (redis-py 8 retries a failed command up to 10 times by
default, which would also stall the one renewal thread for minutes). Pass your own
client to choose others.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["DEFAULT_URL", "default_client", "is_cluster", "pool_of"]

DEFAULT_URL = "redis://localhost:6379/0"
SOCKET_TIMEOUT = 10.0
CONNECT_TIMEOUT = 5.0

_clients: Dict[str, "redis.Redis"] = {}
_mutex = threading.Lock()


def _reset_after_fork() -> None:
    # The clients themselves survive fork (redis-py pools reset on a pid change); only the
    # mutex may have been held by a thread that does not exist in the child.
    global _mutex
    _mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def default_client() -> "redis.Redis":
    """The shared client for ``RLOCKS_URL`` (or :data:`DEFAULT_URL`)."""
    url = os.environ.get("RLOCKS_URL") or DEFAULT_URL
    client = _clients.get(url)
    if client is None:
        with _mutex:
            client = _clients.get(url)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=SOCKET_TIMEOUT,
                    socket_connect_timeout=CONNECT_TIMEOUT,
                    retry=Retry(NoBackoff(), 0),
                )
                _clients[url] = client
    return client


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a ``redis.cluster.RedisCluster``."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, RedisCluster)


def pool_of(client: Any) -> Any:
    """The object that identifies ``client``'s connections (its pool; a cluster client itself).

    Two ``Redis`` objects built on one pool share the wake-up hub and renewal batches.
    """
    return getattr(client, "connection_pool", client)
