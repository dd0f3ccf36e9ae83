"""The client a primitive talks to when the caller passes none.

``client=None`` means ``RLOCKS_URL`` from the environment, else ``redis://localhost:6379/0``.
One client (one connection pool) is made per URL per process and shared by every primitive
that uses it, so a thousand locks do not open a thousand pools.

Unlike redis-py's own default, this client has socket timeouts and does not retry: a lock
call on a dead link must fail after a bounded time (one socket timeout), not hang forever
or for ``retries x socket timeout`` (redis-py 8 retries a failed command up to 10 times by
default, which would also stall the one renewal thread for minutes). Pass your own
client to choose others.

A client you pass is used as given for your own commands, but rlocks' own round trips
(acquire and release scripts, renewals, the wake-up hub) must keep those bounds whatever
the client says: a plain ``redis.Redis.from_url(url)`` has no socket timeout (a frozen
server would block a release or the renewer forever) and retries failed commands up to
10 times (a renewal round could take minutes; a re-sent script itself is harmless: its op
id makes the server answer it from a record, see ``lua/op_lib.lua``).
:func:`io_client` therefore gives rlocks a client of its own for such a client: a second
pool with the same connection settings (address, credentials, TLS, database, encoding)
but with at most these socket timeouts and no retries. A client that already has them
is used as it is.
"""

from __future__ import annotations

import os
import select
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .clock import monotonic

__all__ = [
    "DEFAULT_URL", "Spares", "default_client", "io_client", "is_cluster", "pool_of", "spares_for",
]

DEFAULT_URL = "redis://localhost:6379/0"
SOCKET_TIMEOUT = 10.0  # s, the longest any one of rlocks' own round trips may block
CONNECT_TIMEOUT = 5.0  # s, the longest opening a connection for rlocks may take

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


# A user's pool -> rlocks' own client for it (None: the user's client is fine as it is).
# Weak keys: rlocks must not keep a pool alive that its program dropped; the values do not
# refer to the user's pool.
_io_clients: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


_async_kind: Optional[Tuple[Any, Tuple[Any, ...], Any]] = None  # made on first use


def _kind(client: Any) -> Optional[Tuple[Any, Tuple[Any, ...], Any]]:
    """(client class, pools rlocks may copy settings from, Retry class), or None.

    Only redis-py's own classes, as they are: a subclass may add behaviour that a copy
    would lose, and Sentinel-managed or other custom pools choose their servers themselves.
    """
    if type(client) is redis.Redis:
        return redis.Redis, (redis.ConnectionPool, redis.BlockingConnectionPool), Retry
    if type(client).__module__ == "redis.asyncio.client":
        global _async_kind
        if _async_kind is None:
            # Imported here: programs that never use asyncio need not load redis.asyncio.
            import redis.asyncio as aredis
            from redis.asyncio.retry import Retry as AsyncRetry

            pools = (aredis.ConnectionPool, aredis.BlockingConnectionPool)
            _async_kind = (aredis.Redis, pools, AsyncRetry)
        if type(client) is _async_kind[0]:
            return _async_kind
    return None



def io_client(client: Any) -> Any:
    """The client rlocks sends its own commands through on behalf of ``client``.

    ``client`` itself when its socket timeouts are at most :data:`SOCKET_TIMEOUT` /
    :data:`CONNECT_TIMEOUT` and it does not retry, or when rlocks cannot copy its settings
    (cluster clients, subclasses, custom or caching pools, single-connection clients: see
    docs/operations.md); otherwise a client of the same kind (``redis.Redis`` or
    ``redis.asyncio.Redis``) on a pool of rlocks' own (made once per pool, dropped with
    it) with the same settings, those timeouts and no retries. No I/O.
    """
    pool = getattr(client, "connection_pool", None)
    kind = _kind(client)
    if (
        kind is None
        or type(pool) not in kind[1]
        or getattr(client, "connection", None) is not None  # single_connection_client
        or getattr(pool, "cache", None) is not None
    ):
        return client
    try:
        found = _io_clients[pool]
    except KeyError:
        found = _io_clients.setdefault(pool, _derive(pool, *kind))
    return client if found is None else found


def _derive(pool: Any, client_type: Any, pool_types: Tuple[Any, ...], retry_type: Any) -> Any:
    """A client with ``pool``'s settings made safe for rlocks, or None when they are."""
    kwargs = dict(pool.connection_kwargs)
    # Keys the pool adds for itself (they refer to it): the new pool makes its own.
    for key in ("maint_notifications_pool_handler", "orig_host_address",
                "orig_socket_timeout", "orig_socket_connect_timeout"):
        kwargs.pop(key, None)
    # The values a connection of this pool really gets: missing keys mean the connection
    # class's defaults, which differ between redis-py versions. Building one does no I/O.
    sample = pool.connection_class(**kwargs)
    timeout = sample.socket_timeout
    connect = sample.socket_connect_timeout
    retries = sample.retry.get_retries() if getattr(sample, "retry", None) is not None else 0
    if (
        timeout is not None
        and timeout <= SOCKET_TIMEOUT
        and connect is not None
        and connect <= CONNECT_TIMEOUT
        and retries == 0
    ):
        return None
    kwargs["socket_timeout"] = SOCKET_TIMEOUT if timeout is None else min(timeout, SOCKET_TIMEOUT)
    kwargs["socket_connect_timeout"] = (
        CONNECT_TIMEOUT if connect is None else min(connect, CONNECT_TIMEOUT)
    )
    # Not one re-send: each would cost a socket timeout more (a re-sent script is
    # answered from its op record, so only time is at stake; see lua/op_lib.lua).
    kwargs["retry"] = retry_type(NoBackoff(), 0)
    own = pool_types[0](
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return client_type(connection_pool=own)


#: How long (s) a connection one of rlocks' round trips gave back stays set aside for the
#: next one (see :class:`Spares`).
SPARE_FOR = 0.5
#: The most connections of one pool set aside at once.
SPARES_MAX = 2
#: A pool limited to fewer connections sets none aside: its other users may need them
#: (redis-py 8 makes pools of 100 by default).
SPARES_MIN_POOL = 64


def _readable(sock: Any) -> bool:
    """Whether ``sock`` has bytes or an end of stream to read now (one system call, no
    wait). ``poll``, not ``select``: a process with over 1,024 open files has descriptors
    ``select`` refuses (FD_SETSIZE); ``select`` only where there is no ``poll`` (Windows)."""
    if _poll is None:
        return bool(select.select((sock,), (), (), 0)[0])
    poller = _poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


_poll = getattr(select, "poll", None)


class Spares:
    """Connections of one pool that rlocks' own round trips hand on to each other.

    redis-py's pool checks each connection it hands out for unread bytes: a read with a
    timeout of 0, three system calls (two ``settimeout`` s and a ``recv``), each of which
    lets the GIL go, a chance of a thread switch between the threads of a process that
    contend for a lock. A connection that a round trip read a whole reply from has nothing
    unread when it is given back (one cut short is closed instead, and never comes here),
    so :meth:`give` sets it aside and :meth:`take` hands it out again after one
    ``poll`` with a timeout of 0 (one system call): readable means the server closed it
    (a ``CLIENT KILL``, a restart) or it is not clean, and the pool's checked connection
    is taken instead, as the pool's own check would have found (a connection closed
    after that check is a lost reply, as after the pool's). One set aside longer than
    :data:`SPARE_FOR` goes back to the pool.

    Set-aside connections stay the pool's, counted in use (a ``close()`` of the client
    closes them too; the next round trip reconnects as redis-py does). A
    ``BlockingConnectionPool`` or a pool of fewer than :data:`SPARES_MIN_POOL` connections
    sets none aside. A forked child never takes its parent's. Thread-safe without a lock:
    ``list.append`` and ``list.pop`` are atomic, and the cap may be passed by one when two
    threads give back at once.
    """

    __slots__ = ("keep", "pid", "idle")

    def __init__(self, pool: Any) -> None:
        self.keep = (
            not isinstance(pool, redis.BlockingConnectionPool)
            and getattr(pool, "max_connections", 0) >= SPARES_MIN_POOL
        )
        self.pid = os.getpid()
        self.idle: List[Tuple[Any, float]] = []

    def take(self, pool: Any) -> Any:
        """A connection of ``pool`` (the one these spares belong to) for one round trip:
        a set-aside one, else the pool's (checked; may connect, and raises what
        ``get_connection`` raises)."""
        idle = self.idle
        if idle:
            if self.pid != os.getpid():
                self._forked()
            else:
                now = monotonic()
                while True:
                    try:
                        connection, since = idle.pop()
                    except IndexError:
                        break
                    if now - since < SPARE_FOR:
                        sock = connection._sock
                        # Readable: closed by the server (CLIENT KILL, a restart), or not
                        # clean. Either way not one to send a script on (its reply would
                        # be taken for lost): the pool's connection instead.
                        if sock is not None and not _readable(sock):
                            return connection
                        connection.disconnect()
                    pool.release(connection)
        return pool.get_connection()

    def give(self, pool: Any, connection: Any) -> None:
        """Give back ``connection``, whose last reply was read whole (anything else goes
        to the pool's ``release`` after ``disconnect``, as before)."""
        if self.keep and len(self.idle) < SPARES_MAX:
            if self.pid != os.getpid():
                self._forked()
            self.idle.append((connection, monotonic()))
        else:
            pool.release(connection)

    def _forked(self) -> None:
        # The parent's connections are not this process's to use or close (its pool
        # forgot them when it reset after the fork).
        self.idle = []
        self.pid = os.getpid()


def spares_for(pool: Any) -> Spares:
    """The :class:`Spares` of ``pool``, made at its first use. No I/O.

    Kept on the pool itself, not in a table of rlocks': the set-aside connections may
    refer to their pool, and a table's value that refers to its own weak key keeps it
    alive for ever.
    """
    try:
        found: Spares = pool._rlocks_spares
    except AttributeError:
        # (setdefault: two threads at once make one; a lost one could strand a connection)
        found = vars(pool).setdefault("_rlocks_spares", Spares(pool))
    return found
