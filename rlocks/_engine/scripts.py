"""The Lua scripts and the one way they are sent and their replies read.

Every change to a primitive is one script (``lua/<kind>_<op>.lua``, with ``lua/lib.lua``
and the kind's ``lua/<kind>_lib.lua`` in front of it), run with EVALSHA: one atomic step
on the server, one round trip. Names and owner ids travel only as KEYS and ARGV, never
in script text.

Every script answers one line of text, ``<status> [<a> [<b>]]``, then the owners it woke,
one per line (``lua/lib.lua``). :func:`decode` is the only code that reads it:

========  ===================================================================
status    meaning
========  ===================================================================
 1        done: acquire granted (a = count now, b = token or 0); release
          (a = count left; semaphore: permits free); renew: renewed
 2        this very call had been applied already (a re-send after a lost
          reply): nothing changed (a, b as for 1)
 0        acquire: not granted (a = ms within which to ask again)
-1        the caller's hold is gone (release, renew, re-entry); a semaphore
          release: a = the 1-based owner listed that holds less
-2        an RWLock upgrade: refused
-3        a BoundedSemaphore release over its value: refused
-4        a semaphore of another value or kind (a = value, b = bounded)
========  ===================================================================

:class:`Call` sends one script: on a plain ``redis.Redis`` its command is packed once and
written straight to a pooled connection (no argument encoding per call); other clients
(cluster, asyncio, subclasses) take redis-py's ``execute_command``. NOSCRIPT loads the
script and sends the call again. Connection errors pass through: the caller's dialogue
decides (every call is safe to send again, see ``dialogues``).
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import redis
from redis.exceptions import NoScriptError, ResponseError

from ..errors import RLocksError
from .clients import asend_on, asend_once, bounded, io_client

__all__ = [
    "DONE", "GRANTED", "LOST", "MISMATCH", "NOT_SENT", "OVER", "UPGRADE", "WAIT",
    "Call", "Reply", "Script", "decode", "load", "run_many", "arun_many",
]

GRANTED, DONE, WAIT, LOST, UPGRADE, OVER, MISMATCH = 1, 2, 0, -1, -2, -3, -4
_STATUSES = frozenset((GRANTED, DONE, WAIT, LOST, UPGRADE, OVER, MISMATCH))
#: Not a script's status: an interrupted call that surely never reached the server.
NOT_SENT = -9

Arg = Union[str, int, float, bytes]


class Reply(NamedTuple):
    status: int
    a: int = 0
    b: int = 0
    woken: Tuple[str, ...] = ()
    replicas: int = -1  # WAIT's answer, when the call asked for one
    tokens: Tuple[Optional[int], ...] = ()  # a Quorum's grant: each master's token

    @property
    def ok(self) -> bool:
        return self.status in (GRANTED, DONE)


def decode(raw: Any, name: str = "script") -> Reply:
    """The :class:`Reply` of a script's text; RLocksError for anything else."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        line, *woken = text.split("\n")
        parts = [int(p) for p in line.split(" ")]
        if parts[0] not in _STATUSES or len(parts) > 3:
            raise ValueError(parts)
        status, a, b = (parts + [0, 0])[:3]
        return Reply(status, a, b, tuple(woken))
    except (AttributeError, ValueError, TypeError, IndexError):
        raise RLocksError(f"unexpected reply from {name}: {raw!r}") from None


class Script:
    """One operation's script: its composed source and SHA1."""

    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name}>"


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(f"lua/{name}.lua").read_text(encoding="utf-8")


@cache
def load(op: str, kind_lib: Optional[str] = None) -> Script:
    """The script of ``lua/<op>.lua`` with ``lib.lua`` and ``<kind_lib>.lua`` in front."""
    parts = [_read("lib")] + ([_read(kind_lib)] if kind_lib else []) + [_read(op)]
    return Script(op if kind_lib is None else f"{op}[{kind_lib}]", "\n".join(parts))


def _resp(commands: Sequence[Tuple[Any, ...]], encoding: str, errors: str) -> bytes:
    """``commands`` packed as RESP, arguments encoded as redis-py's Encoder does (bytes as
    they are, text in the client's encoding, numbers by ``repr``): a fifth of the time of
    redis-py's generic packer for a script call's dozen short arguments."""
    out = bytearray()
    for command in commands:
        out += b"*%d\r\n" % len(command)
        for arg in command:
            if isinstance(arg, bytes):
                data = arg
            elif isinstance(arg, str):
                data = arg.encode(encoding, errors)
            elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
                data = repr(arg).encode()
            else:
                raise TypeError(f"cannot send {type(arg).__name__} {arg!r} to Redis")
            out += b"$%d\r\n" % len(data)
            out += data
            out += b"\r\n"
    return bytes(out)


#: PING's argument after an interrupted call: no script answers this.
_FENCE = b"rlocks-fence-after-an-interrupt"


def _fence(connection: Any) -> Optional[List[Any]]:
    """After an interrupt in a call on ``connection`` (still open): send a PING behind the
    call and read up to its answer. Then the call has surely run, or surely never reached
    the server. Returns the replies read before the PING's (none: the call was never
    sent), or None when that could not be learned (the connection must then be closed;
    the call was sent and may not have run yet, or its reply was read in part, so it ran).
    """
    if getattr(connection, "_sock", None) is None:
        return None  # closed by redis-py: a part of the command may have gone
    try:
        connection.send_command("PING", _FENCE, check_health=False)
        read: List[Any] = []
        for _ in range(3):  # the script's reply, WAIT's, then the fence's
            try:
                reply = connection.read_response(disconnect_on_error=False)
            except ResponseError as exc:
                reply = exc
            if reply == _FENCE:
                return read
            read.append(reply)
    except BaseException:  # noqa: BLE001 - interrupted again, or garbled: unknown
        return None
    return None


def _decoded(raw: Any, call: "Call") -> Optional[Reply]:
    if isinstance(raw, BaseException):
        return None
    try:
        return decode(raw, call.script.name)
    except RLocksError:
        return None


def _direct_pool(client: Any) -> Any:
    """The pool to write pre-packed commands to, or None where only the client may send:
    a plain ``redis.Redis`` (no ``execute_command`` override to bypass) on a standard
    pool, without a pinned single connection or client-side caching."""
    if type(client).execute_command is not redis.Redis.execute_command:
        return None
    if getattr(client, "connection", None) is not None:
        return None
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.ConnectionPool) or getattr(pool, "cache", None) is not None:
        return None
    return pool


class Call:
    """One script with its KEYS and ARGV, ready to send (and re-send) as it is.

    ``replication``: ``(replicas, ms)`` to send WAIT after the script in the same round
    trip (the reply's ``replicas`` is its answer).
    """

    __slots__ = ("script", "keys", "args", "replication", "undo", "ttl_ms", "gate", "until",
                 "_packed", "_route")

    def __init__(self, script: Script, keys: Sequence[str], args: Sequence[Arg],
                 replication: Optional[Tuple[int, int]] = None) -> None:
        self.script = script
        self.keys = tuple(keys)
        self.args = tuple(args)
        self.replication = replication
        # An acquire sent to a Quorum: the call that gives its grant back (to a minority,
        # or outside the validity window), and the lease it grants (ms).
        self.undo: Optional["Call"] = None
        self.ttl_ms = 0
        # A waiter's call: how many of one primitive's waiters of this process may have a
        # call on the way at once (backends.Server.gate), so a crowd of waiters does not
        # open a connection each; ``until`` (monotonic): no waiting for a turn past it.
        self.gate: Any = None
        self.until: Optional[float] = None
        self._packed: Any = None
        self._route: Tuple[Any, Any, Any] = (None, None, None)

    def __repr__(self) -> str:
        return f"<Call {self.script.name} {self.keys} {self.args}>"

    def command(self, sha: bool = True) -> Tuple[Any, ...]:
        head = ("EVALSHA", self.script.sha) if sha else ("EVAL", self.script.source)
        return (*head, len(self.keys), *self.keys, *self.args)

    # -- blocking ---------------------------------------------------------------------------

    def __call__(self, client: Any) -> Reply:
        """Run on ``client`` (through :func:`~.clients.io_client`): one round trip."""
        given, sender, pool = self._route
        if given is not client:
            sender = io_client(client)
            pool = _direct_pool(sender)
            self._route = (client, sender, pool)
        try:
            if pool is None:
                if hasattr(sender, "nodes_manager") and self.keys:
                    return self._cluster(sender)
                return self._generic(sender)
            return self._loaded(pool)
        except ResponseError as exc:
            _login_refused(exc)
            raise

    def _loaded(self, pool: Any) -> Reply:
        try:
            return self._direct(pool)
        except NoScriptError:
            redis.Redis(connection_pool=pool).script_load(self.script.source)
            return self._direct(pool)

    def _cluster(self, cluster: Any) -> Reply:
        """On a cluster client: straight to the node of the keys' slot, sent once (the
        cluster client would re-send by itself, which the caller could not tell from a
        first send). A moved slot or a broken link refreshes the client's map of the
        cluster and raises, so the caller's retry goes to the new owner of the slot."""
        try:
            node = cluster.get_node_from_key(self.keys[0])
            pool = node.redis_connection.connection_pool
        except Exception:  # noqa: BLE001 - no usable node in the map: redis-py's own path
            return self._generic(cluster)
        try:
            return self._loaded(pool)
        except ResponseError as exc:
            moved = isinstance(exc, (redis.exceptions.MovedError, redis.exceptions.AskError))
            if not moved and not str(exc).startswith(("MOVED", "ASK")):
                raise
            cluster.nodes_manager.initialize()
            raise redis.exceptions.TryAgainError(str(exc)) from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            try:
                cluster.nodes_manager.initialize()
            except Exception:  # noqa: BLE001 - the map is refreshed at the next try
                pass
            raise

    def _direct(self, pool: Any) -> Reply:
        # Nothing between taking the connection and the try: an interrupt there would
        # strand it, counted in use by its pool for ever.
        connection = pool.get_connection()
        try:
            if self._packed is None:
                commands = [self.command()]
                if self.replication is not None:
                    commands.append(("WAIT", *self.replication))
                encoder = connection.encoder
                self._packed = [_resp(commands, encoder.encoding, encoder.encoding_errors)]
            connection.send_packed_command(self._packed, check_health=False)
            first: Any = None
            error: Optional[ResponseError] = None
            try:
                first = connection.read_response(disconnect_on_error=False)
            except ResponseError as exc:
                error = exc
            replicas = -1
            if self.replication is not None:
                replicas = int(connection.read_response(disconnect_on_error=False))
        except BaseException as exc:
            if not isinstance(exc, (redis.RedisError, OSError)):
                # An interrupt (a signal handler's exception): learn what became of the
                # call before anyone looks at its keys from another connection.
                settled = _fence(connection)
                if settled is not None:
                    # What the driver hands the dialogue (steps.Interrupted.reply).
                    exc._rlocks_reply = (  # type: ignore[attr-defined]
                        Reply(NOT_SENT) if not settled else _decoded(settled[0], self))
                    pool.release(connection)
                    raise
            # The reply may still be on its way: this connection cannot be used again.
            connection.disconnect()
            pool.release(connection)
            raise
        pool.release(connection)
        if error is not None:
            raise error
        return decode(first, self.script.name)._replace(replicas=replicas)

    def _generic(self, client: Any) -> Reply:
        try:
            return self._generic_once(client)
        except NoScriptError:
            client.script_load(self.script.source)
            return self._generic_once(client)

    def _generic_once(self, client: Any) -> Reply:
        if self.replication is None:
            return decode(client.execute_command(*self.command()), self.script.name)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*self.command())
        pipe.execute_command("WAIT", *self.replication)
        first, replicas = pipe.execute()
        return decode(first, self.script.name)._replace(replicas=int(replicas))

    # -- awaited ----------------------------------------------------------------------------

    async def arun(self, client: Any) -> Reply:
        """Run on a ``redis.asyncio`` client: one round trip, at most a socket timeout."""
        try:
            return await bounded(self._arun(client))  # type: ignore[no-any-return]
        except ResponseError as exc:
            _login_refused(exc)
            raise

    async def _arun(self, client: Any) -> Reply:
        sender = io_client(client)
        if hasattr(sender, "nodes_manager") and self.keys:
            return await self._acluster(sender)
        try:
            return await self._ageneric_once(sender)
        except NoScriptError:
            await sender.script_load(self.script.source)
            return await self._ageneric_once(sender)

    async def _acluster(self, cluster: Any) -> Reply:
        """:meth:`_cluster` for a ``redis.asyncio`` cluster client."""
        try:
            await cluster.initialize()
        except redis.exceptions.RedisClusterException as exc:
            if not str(exc).startswith("Redis Cluster cannot be connected"):
                raise
            # (no node reachable: the link, as for one server, so sent again in time)
            raise redis.exceptions.ConnectionError(str(exc)) from exc
        node = cluster.get_node_from_key(self.keys[0])
        try:
            conn = node.acquire_connection()
            try:
                try:
                    raw = await asend_on(conn, self.command())
                except NoScriptError:
                    await asend_on(conn, ("SCRIPT", "LOAD", self.script.source))
                    raw = await asend_on(conn, self.command())
            finally:
                node.release(conn)
            return decode(raw, self.script.name)
        except ResponseError as exc:
            moved = isinstance(exc, (redis.exceptions.MovedError, redis.exceptions.AskError))
            if not moved and not str(exc).startswith(("MOVED", "ASK")):
                raise
            await cluster.nodes_manager.initialize()
            raise redis.exceptions.TryAgainError(str(exc)) from None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            try:
                await cluster.nodes_manager.initialize()
            except Exception:  # noqa: BLE001 - the map is refreshed at the next try
                pass
            raise

    async def _ageneric_once(self, client: Any) -> Reply:
        if self.replication is None:
            return decode(await asend_once(client, self.command()), self.script.name)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*self.command())
        pipe.execute_command("WAIT", *self.replication)
        first, replicas = await pipe.execute()
        return decode(first, self.script.name)._replace(replicas=int(replicas))


def _login_refused(exc: ResponseError) -> None:
    """Raise AuthenticationError if ``exc`` is Redis refusing a connection that has not
    logged in (waiting does not cure that). Redis answers a long command from such a
    connection with this error and hangs up; redis-py 7.4 sends the script before anything
    that would get ``NOAUTH``."""
    if str(exc).startswith("Protocol error: unauthenticated"):
        raise redis.exceptions.AuthenticationError(str(exc)) from None


def _results(calls: Sequence[Call], raw: List[Any]) -> List[Reply | BaseException]:
    out: List[Reply | BaseException] = []
    for call, result in zip(calls, raw):
        if isinstance(result, BaseException):
            out.append(result)
        else:
            try:
                out.append(decode(result, call.script.name))
            except RLocksError as exc:
                out.append(exc)
    return out


def _missing(results: Sequence[Any]) -> bool:
    return any(isinstance(r, NoScriptError) for r in results)


def _wait_for(calls: Sequence[Call]) -> Optional[Tuple[int, int]]:
    """The one WAIT that ends a batch with calls that ask for replicas: the most replicas
    and the longest wait any of them asks for (None: no call asks)."""
    asked = [c.replication for c in calls if c.replication is not None]
    if not asked:
        return None
    return max(r for r, _ in asked), max(ms for _, ms in asked)


def _batch_results(calls: Sequence[Call], raw: List[Any],
                   wait: Optional[Tuple[int, int]]) -> List[Reply | BaseException]:
    if wait is None:
        return _results(calls, raw)
    results, acked = _results(calls, raw[:-1]), raw[-1]
    if isinstance(acked, BaseException):
        return results
    return [r._replace(replicas=int(acked))
            if isinstance(r, Reply) and c.replication is not None else r
            for c, r in zip(calls, results)]


def run_many(client: Any, calls: Sequence[Call]) -> List[Reply | BaseException]:
    """Run ``calls`` in one pipeline (a cluster client splits it by node); each result is
    a Reply or the exception of that call. Calls that ask for replicas share one WAIT at
    the end (each reply's ``replicas`` is its answer). A connection error of the whole
    pipeline is raised."""
    client = io_client(client)
    wait = _wait_for(calls)

    def once() -> List[Any]:
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.command())
        if wait is not None:
            pipe.execute_command("WAIT", *wait)
        return _batch_results(calls, pipe.execute(raise_on_error=False), wait)

    results = once()
    if _missing(results):
        for script in {c.script.sha: c.script for c in calls}.values():
            client.script_load(script.source)
        results = once()
    return results


async def arun_many(client: Any, calls: Sequence[Call]) -> List[Reply | BaseException]:
    """:func:`run_many` for a ``redis.asyncio`` client (at most a socket timeout)."""
    return await bounded(_arun_many(client, calls))  # type: ignore[no-any-return]


async def _arun_many(client: Any, calls: Sequence[Call]) -> List[Reply | BaseException]:
    client = io_client(client)
    wait = _wait_for(calls)

    async def once() -> List[Any]:
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.command())
        if wait is not None:
            pipe.execute_command("WAIT", *wait)
        return _batch_results(calls, await pipe.execute(raise_on_error=False), wait)

    results = await once()
    if _missing(results):
        for script in {c.script.sha: c.script for c in calls}.values():
            if hasattr(client, "get_primaries"):  # a cluster: every master
                for node in client.get_primaries():
                    await node.execute_command("SCRIPT", "LOAD", script.source)
            else:
                await client.script_load(script.source)
        results = await once()
    return results
