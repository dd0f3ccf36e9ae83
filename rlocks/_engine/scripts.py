"""Lua scripts: loading, running with EVALSHA, and the one place replies are decoded.

Every change to a primitive's state is one Lua script run with EVALSHA, so each operation
is atomic on the server and costs one round trip. Scripts live as ``.lua`` files in
``rlocks/_engine/lua/``; each starts with a header listing its KEYS, ARGV (with units) and
return values. Names and owner ids only ever travel as KEYS/ARGV: no user string is pasted
into script text, so no name can change what a script does.

Every script answers ``{status, value}``; :func:`decode` turns that into a :class:`Reply`
and is the only code that reads raw integers:

=========  ==========================================================================
status     value
=========  ==========================================================================
 1         granted / released / renewed: the owner's hold count now
 0         busy: another owner holds it; the value is how long (ms) until that hold's
           lease ends, which caps how long a waiter sleeps before it looks again
-1         not owner: this owner holds nothing there (lost, or never held)
=========  ==========================================================================
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple, Sequence, Union

import redis
from redis.exceptions import NoScriptError

from ..errors import RLocksError

__all__ = [
    "GRANTED",
    "BUSY",
    "NOT_OWNER",
    "Call",
    "Reply",
    "arun",
    "Script",
    "decode",
    "load",
    "run",
]

GRANTED = 1
BUSY = 0
NOT_OWNER = -1

Arg = Union[str, int, float, bytes]


class Reply(NamedTuple):
    """A decoded script reply (see the module docstring for the meaning of ``value``)."""

    status: int
    value: int

    @property
    def granted(self) -> bool:
        return self.status == GRANTED

    @property
    def busy(self) -> bool:
        return self.status == BUSY

    @property
    def not_owner(self) -> bool:
        return self.status == NOT_OWNER

    @property
    def count(self) -> int:
        """Hold count after a granted acquire, a release or a renewal."""
        assert self.status == GRANTED
        return self.value

    @property
    def retry_after(self) -> float:
        """Seconds until the blocking hold's lease ends (busy replies); -1 when unknown."""
        assert self.status == BUSY
        return self.value / 1000.0 if self.value >= 0 else -1.0


def decode(raw: Any, script_name: str = "script") -> Reply:
    """Turn a raw ``{status, value}`` script reply into a :class:`Reply`."""
    try:
        status, value = raw
        status = int(status)
        value = int(value)
    except (TypeError, ValueError):
        raise RLocksError(f"unexpected reply from {script_name}: {raw!r}") from None
    if status not in (GRANTED, BUSY, NOT_OWNER):
        raise RLocksError(f"unexpected status from {script_name}: {raw!r}")
    return Reply(status, value)


class Script:
    """One Lua file, read and hashed once per process."""

    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:12]}>"


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@lru_cache(maxsize=None)
def load(name: str, prelude: str = "") -> Script:
    """The script in ``lua/<name>.lua``, read and hashed once per process.

    ``prelude`` names a library file (``rw_lib``, ``sem_lib``) whose functions the script
    uses; it is put in front, so each operation still is one script and one round trip.
    """
    source = _read(name)
    if prelude:
        source = _read(prelude) + "\n" + source
    return Script(name, source)


def run(client: Any, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
    """Run ``script`` with EVALSHA on ``client`` (a ``Redis`` or ``RedisCluster``).

    One round trip normally. The first call on a server that does not know the script yet
    (new server, restart, SCRIPT FLUSH) gets NOSCRIPT, loads the script and runs it again.
    Redis errors other than NOSCRIPT propagate unchanged.
    """
    try:
        raw = client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(script.source)
        raw = client.evalsha(script.sha, len(keys), *keys, *args)
    return decode(raw, script.name)


async def arun(client: Any, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Reply:
    """:func:`run` for ``redis.asyncio`` clients: same contract, awaited I/O."""
    try:
        raw = await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await client.script_load(script.source)
        raw = await client.evalsha(script.sha, len(keys), *keys, *args)
    return decode(raw, script.name)


def _direct_pool(client: Any) -> Any:
    """The pool to send pre-packed commands on, or ``None`` where only the client may send.

    Only a plain ``redis.Redis`` (no ``execute_command`` override, so no instrumentation
    is bypassed) on a standard pool without client-side caching or a pinned single
    connection qualifies. Cluster clients route by slot and always take the generic path.
    """
    if type(client).execute_command is not redis.Redis.execute_command:
        return None
    if getattr(client, "connection", None) is not None:  # single_connection_client
        return None
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.ConnectionPool) or getattr(pool, "cache", None) is not None:
        return None
    return pool


class Call:
    """One script invocation with fixed KEYS/ARGV, packed into RESP once and re-sent as is.

    A primitive keeps one per (operation, owner, count): an uncontended acquire or release
    then costs one socket write and one read, with no per-call argument encoding. Unlike
    redis-py's command path, a failed send is not retried: re-sending a release whose first
    copy may have run could give back one level too many.
    """

    __slots__ = ("script", "keys", "args", "_packed")

    def __init__(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> None:
        self.script = script
        self.keys = tuple(keys)
        self.args = tuple(args)
        self._packed: Any = None

    def __call__(self, client: Any) -> Reply:
        """Run the script on ``client``: one round trip; NOSCRIPT is recovered as in run()."""
        pool = _direct_pool(client)
        if pool is None:
            return run(client, self.script, self.keys, self.args)
        connection = pool.get_connection()
        try:
            packed = self._packed
            if packed is None:
                packed = self._packed = connection.pack_command(
                    "EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args
                )
            connection.send_packed_command(packed, check_health=False)
            raw = connection.read_response()
        except NoScriptError:
            pool.release(connection)
            return run(client, self.script, self.keys, self.args)
        except BaseException:
            # The reply may still be on its way: this connection cannot be reused.
            connection.disconnect()
            pool.release(connection)
            raise
        pool.release(connection)
        return decode(raw, self.script.name)
