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

from redis.exceptions import NoScriptError

from ..errors import RLocksError

__all__ = ["GRANTED", "BUSY", "NOT_OWNER", "Reply", "Script", "decode", "load", "run"]

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


@lru_cache(maxsize=None)
def load(name: str) -> Script:
    """The script in ``lua/<name>.lua`` (cached: each file is read and hashed once)."""
    source = resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")
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
