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
carries the count it expects, so the server recognises it, see ``scripts``).
:func:`io_client` therefore gives rlocks a client of its own for such a blocking client:
a second pool with the same connection settings (address, credentials, TLS, database,
encoding) but with at most these socket timeouts and no retries. A client that already
has them is used as it is.

A ``redis.asyncio`` client is always used as it is, so that closing it (``await
client.aclose()``) closes everything rlocks opened through it: each of rlocks' own awaited
round trips is bounded by :data:`SOCKET_TIMEOUT` with ``asyncio.timeout`` instead
(:func:`bounded`), and the client's own retries within that bound are harmless (a re-sent
call is recognised).
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
import weakref
from typing import Any, Dict, Optional, Sequence, Tuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["DEFAULT_URL", "asend_on", "bounded", "default_client", "encoding_of", "io_client",
           "is_cluster", "pool_of"]

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
                try:
                    client = redis.Redis.from_url(
                        url,
                        socket_timeout=SOCKET_TIMEOUT,
                        socket_connect_timeout=CONNECT_TIMEOUT,
                        retry=Retry(NoBackoff(), 0),
                    )
                except ValueError as exc:
                    raise ValueError(f"RLOCKS_URL={url!r} is not a Redis URL: {exc}") from None
                _clients[url] = client
    return client


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a ``RedisCluster`` (``redis.cluster``'s or ``redis.asyncio``'s)."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def encoding_of(client: Any) -> str:
    """The ``encoding`` of ``client`` (redis-py's default: UTF-8): what redis-py decodes
    replies with, and encodes str arguments with unless hiredis packs them (always as
    UTF-8, see ``checks.check_wire_names``). No I/O."""
    get_encoder = getattr(client, "get_encoder", None)
    if get_encoder is not None:
        try:
            return str(get_encoder().encoding)
        except Exception:  # noqa: BLE001 - a cluster client without a node yet, say
            pass
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    return str((kwargs or {}).get("encoding", "utf-8"))


def pool_of(client: Any) -> Any:
    """The object that identifies ``client``'s connections (its pool; a cluster client itself).

    Two ``Redis`` objects built on one pool share the wake-up hub and renewal batches.
    """
    return getattr(client, "connection_pool", client)


# A user's pool -> rlocks' own client for it (None: the user's client is fine as it is).
# Weak keys: rlocks must not keep a pool alive that its program dropped; the values do not
# refer to the user's pool.
_io_clients: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _kind(client: Any) -> Optional[Tuple[Any, Tuple[Any, ...], Any]]:
    """(client class, pools rlocks may copy settings from, Retry class), or None.

    Only redis-py's own classes, as they are: a subclass may add behaviour that a copy
    would lose, and Sentinel-managed or other custom pools choose their servers themselves.
    """
    if type(client) is redis.Redis:
        return redis.Redis, (redis.ConnectionPool, redis.BlockingConnectionPool), Retry
    return None  # (asyncio clients too: see the module docstring and bounded())


async def bounded(awaitable: Any) -> Any:
    """Await one of rlocks' own round trips on a ``redis.asyncio`` client, for at most
    :data:`SOCKET_TIMEOUT` (then ``redis.exceptions.TimeoutError``: the link is broken,
    as a socket timeout says)."""
    try:
        async with asyncio.timeout(SOCKET_TIMEOUT):
            return await awaitable
    except TimeoutError:
        raise redis.exceptions.TimeoutError(
            f"no answer from Redis within {SOCKET_TIMEOUT:g} s") from None


async def asend_once(client: Any, args: Sequence[Any]) -> Any:
    """Send ``args`` once on a connection of a ``redis.asyncio`` client's pool and read the
    raw reply: never through the client's ``Retry``, whose silent resend would hide from
    rlocks that a call may have run twice (a last release, sent twice, finds its own work
    done and must know it sent twice: ``dialogues.release``). A client bound to one
    connection, or without a pool, runs the command its own way."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(client, "connection", None) is not None:
        return await client.execute_command(*args)
    conn = await pool.get_connection()
    try:
        return await asend_on(conn, args)
    finally:
        await pool.release(conn)


async def asend_on(conn: Any, args: Sequence[Any]) -> Any:
    """Send ``args`` once on ``conn`` (a ``redis.asyncio`` connection) and read the raw
    reply. A connection its server closed while it sat idle (or with a stray reply on it)
    is connected afresh first, as redis-py's own pools do unless maintenance notifications
    are on: so a send to a server that is gone fails to connect, which tells that it surely
    did not run (``steps.refused``), instead of being written to a dead link."""
    if conn.is_connected:
        try:
            # (can_read: redis-py 8's name for it)
            stale = await getattr(conn, "can_read", conn.can_read_destructive)() or _readable(conn)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            stale = True
        if stale:
            await conn.disconnect()
    try:
        await conn.send_command(*args)
        return await conn.read_response()
    except BaseException as exc:
        if not isinstance(exc, redis.exceptions.ResponseError):
            # Cut off or cancelled mid-reply: the link's state is unknown. (A shielded
            # disconnect would outlive a cancel; disconnect() is quick and never raises.)
            await conn.disconnect()
        raise


def _readable(conn: Any) -> bool:
    """Whether an idle connection's socket has something to read that the event loop has
    not taken in yet (the server closed it a moment ago): a poll that does not wait."""
    transport = getattr(getattr(conn, "_writer", None), "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    return bool(select.select([sock.fileno()], [], [], 0)[0])


def io_client(client: Any) -> Any:
    """The client rlocks sends its own commands through on behalf of ``client``.

    ``client`` itself when its socket timeouts are at most :data:`SOCKET_TIMEOUT` /
    :data:`CONNECT_TIMEOUT` and it does not retry, or when rlocks cannot copy its settings
    (cluster clients, subclasses, custom or caching pools, single-connection clients: see
    docs/operations.md), and always for a ``redis.asyncio`` client (bounded by
    :func:`bounded` instead); otherwise a ``redis.Redis`` on a pool of rlocks' own (made
    once per pool, dropped with it) with the same settings, those timeouts and no
    retries. No I/O.
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
    # recognised by the count it expects, so only time is at stake; see scripts.py).
    kwargs["retry"] = retry_type(NoBackoff(), 0)
    own = pool_types[0](
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return client_type(connection_pool=own)


def checked_client(client: Any, where: str, aio: bool) -> Any:
    """``client`` as a primitive takes it (a ``redis.Redis``, a ``RedisCluster``, or their
    ``redis.asyncio`` twins for the asyncio primitives, ``aio``): TypeError naming
    ``where`` for anything else, before any I/O."""
    if not callable(getattr(client, "evalsha", None)):
        raise TypeError(f"{where}: client must be a redis.Redis or "
                        f"redis.cluster.RedisCluster, not {type(client).__name__}")
    is_async = type(client).__module__.startswith("redis.asyncio")
    if is_async and not aio:
        raise TypeError(f"{where}: client is a redis.asyncio client; this needs a synchronous "
                        "redis.Redis (use the rlocks.asyncio twin for asyncio)")
    if aio and not is_async:
        raise TypeError(f"{where}: client must be a redis.asyncio client "
                        f"(redis.asyncio.Redis), not {type(client).__name__}")
    return client
