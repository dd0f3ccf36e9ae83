"""Reading primitives back from Redis: list, inspect and force-release, for operators.

Nothing here takes part in acquiring or releasing: these are the I/O helpers under the
``rlocks`` command line (:mod:`rlocks.cli`), and they work on any primitive in a
namespace without knowing how it was constructed (its ttl, its initial value).

Finding primitives
------------------
Every primitive is one hash named ``<namespace>:<kind>:{<name>}`` (see :mod:`.keys`), so a
namespace is listed with one SCAN over ``<namespace>:*`` (hashes only). A key is taken as
a primitive only if it parses back to a known kind and a name whose escaping round-trips
(:func:`unescape`), so side keys and other programs' keys in the namespace are skipped,
and a name containing ``:``, ``{``, ``}``, ``%`` or spaces comes back exactly as given.
The glob PATTERN of ``rlocks list`` is matched against those unescaped names, here in
Python: a glob over names cannot be rewritten as one over escaped keys.

One consistent snapshot
-----------------------
Leases in RWLock and Semaphore hashes are *server* times (redis TIME, ms), so "lease left"
is read against the server's clock, never this host's: TIME, each HGETALL and each PTTL
travel in one MULTI/EXEC, which also makes the listing an atomic snapshot of each batch.
The snapshot only reads. Holds whose lease has passed are still in the hash until the
next script on that primitive tidies them; they are left out of ``holders`` and counted
in ``stale`` (for a semaphore their permits are counted as free, as the next script will).

Waiters
-------
Who waits is not stored in Redis. What can be counted is subscribers of the wake-up
channels (PUBSUB NUMSUB, plus SHARDNUMSUB where the server has it): each *process* with
waiting threads subscribes once through its wake-up hub, however many of its threads
wait, and stays subscribed a few seconds after its last waiter left (see
:mod:`.waiting`). So "waiting" counts processes that wait or waited just now. An RWLock
also stores each waiting writer's claim, which is exact and shown as ``claims``.

Layouts (field names) are those documented in the headers of ``lua/rw_lib.lua`` and
``lua/sem_lib.lua``; an RLock hash is owner id -> hold count with the lease as the key's
PTTL. :data:`KINDS` lists the wake-up channels of each kind, which the primitives build
the same way (a test checks that they agree).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from redis.exceptions import ResponseError

from .clients import is_cluster
from .keys import escape, keys_for
from .scripts import load, run

__all__ = [
    "KINDS",
    "Holder",
    "Kind",
    "PrimitiveState",
    "channels_for",
    "find",
    "force_release",
    "list_primitives",
    "parse_key",
    "unescape",
]

_BATCH = 200  # primitives per MULTI/EXEC snapshot


class Kind(NamedTuple):
    """One kind of primitive as it appears in Redis."""

    code: str  # the key kind (``keys_for``): "rlock", "rw", "sem"
    label: str  # the public class
    # (role, suffix) of each wake-up channel; the channel is ``<keys.channel>[:<suffix>]``
    channels: Tuple[Tuple[str, str], ...]


KINDS: Dict[str, Kind] = {
    "rlock": Kind("rlock", "RLock", (("wake", ""),)),
    # Readers wait on the main channel, writers on their own (see rwlock.py).
    "rw": Kind("rw", "RWLock", (("readers", ""), ("writers", "writers"))),
    "sem": Kind("sem", "Semaphore", (("wake", ""),)),
}

_UNESCAPE = {"%25": "%", "%7B": "{", "%7D": "}"}
_ESCAPED = re.compile("%25|%7B|%7D")


def unescape(part: str) -> Optional[str]:
    """The name (or namespace) that :func:`.keys.escape` turned into ``part``.

    ``None`` when ``part`` is not something ``escape`` produces (a stray ``%``, a raw
    brace, lower-case hex): such a key was not written by rlocks. One pass, so ``%257B``
    comes back as ``%7B``, not ``{``.
    """
    name = _ESCAPED.sub(lambda match: _UNESCAPE[match.group(0)], part)
    return name if escape(name) == part else None


def parse_key(key: str, namespace: str) -> Optional[Tuple[str, str]]:
    """``(kind code, name)`` of a primitive's hash key in ``namespace``, else ``None``."""
    prefix = escape(namespace) + ":"
    if not key.startswith(prefix):
        return None
    kind, _, tagged = key[len(prefix):].partition(":")
    if kind not in KINDS or len(tagged) < 3 or tagged[0] != "{" or tagged[-1] != "}":
        return None
    name = unescape(tagged[1:-1])  # rejects braces inside: escaped names have none
    if not name:
        return None
    return kind, name


def channels_for(namespace: str, kind: str, name: str) -> Tuple[Tuple[str, str], ...]:
    """``(role, channel)`` of every wake-up channel of one primitive."""
    base = keys_for(namespace, kind, name).channel
    return tuple(
        (role, f"{base}:{suffix}" if suffix else base) for role, suffix in KINDS[kind].channels
    )


@dataclass(frozen=True)
class Holder:
    """One owner's live hold (or, in ``PrimitiveState.claims``, a writer's claim)."""

    owner: str  # host:pid:nonce:thread-serial, or host:pid:nonce:p for a process
    count: int  # hold count (re-entries), permits, or 0 for a claim
    lease_ms: Optional[int]  # ms until this hold's lease ends; None: the key has no expiry
    side: str = ""  # RWLock: "read" or "write"

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"owner": self.owner, "count": self.count}
        data["lease_ms"] = self.lease_ms
        if self.side:
            data["side"] = self.side
        return data


@dataclass(frozen=True)
class PrimitiveState:
    """One primitive as Redis holds it, at one server time."""

    namespace: str
    kind: str  # key kind: "rlock", "rw", "sem"
    name: str
    key: str
    type: str  # "RLock", "RWLock", "Semaphore" or "BoundedSemaphore"
    holders: Tuple[Holder, ...]
    lease_ms: Optional[int]  # the key's PTTL; None when it has no expiry
    # (role, processes subscribed) per wake-up channel; None when not asked
    waiting: Optional[Tuple[Tuple[str, int], ...]] = None
    value: Optional[int] = None  # semaphores: the initial value
    free: Optional[int] = None  # semaphores: permits free, dead holders' included
    claims: Tuple[Holder, ...] = ()  # RWLock: writers waiting (their claims)
    stale: int = 0  # holds or claims past their lease, not yet tidied by a script
    channels: Tuple[str, ...] = field(default=(), repr=False)

    @property
    def holds(self) -> int:
        """Holds in all (re-entries counted; permits for a semaphore)."""
        return sum(holder.count for holder in self.holders)

    @property
    def waiting_total(self) -> Optional[int]:
        return None if self.waiting is None else sum(count for _role, count in self.waiting)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict (the CLI's ``--json`` output)."""
        data: Dict[str, Any] = {
            "namespace": self.namespace,
            "kind": self.kind,
            "type": self.type,
            "name": self.name,
            "key": self.key,
            "holders": [holder.to_dict() for holder in self.holders],
            "holds": self.holds,
            "lease_ms": self.lease_ms,
            "waiting": None if self.waiting is None else dict(self.waiting),
            "stale": self.stale,
        }
        if self.kind == "sem":
            data["value"] = self.value
            data["free"] = self.free
        if self.kind == "rw":
            data["claims"] = [claim.to_dict() for claim in self.claims]
        return data


# -- decoding one hash (read-only mirrors of the layouts in lua/*_lib.lua) -----------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> Optional[int]:
    try:
        return int(float(_text(value)))
    except ValueError:
        return None


def _decode_rlock(flat: Dict[str, str], pttl: Optional[int]) -> Dict[str, Any]:
    holders = []
    for owner, raw in sorted(flat.items()):
        count = _int(raw)
        if count is not None and count > 0:
            holders.append(Holder(owner, count, pttl))
    return {"holders": tuple(holders), "type": "RLock"}


def _decode_rw(flat: Dict[str, str], now: int) -> Dict[str, Any]:
    counts: Dict[Tuple[str, str], Optional[int]] = {}
    ends: Dict[Tuple[str, str], Optional[int]] = {}
    for name, raw in flat.items():
        if name.startswith("#") and name[2:3] == ":":
            ends[(name[1], name[3:])] = _int(raw)
        elif name[1:2] == ":":
            counts[(name[0], name[2:])] = _int(raw)
    holders, claims, stale = [], [], 0
    # The writer first, then readers by owner id.
    for (side, owner), count in sorted(counts.items(), key=lambda kv: (kv[0][0] != "w", kv[0])):
        ends_at = ends.get((side, owner))
        if side not in ("r", "w") or count is None or ends_at is None:
            stale += 1
            continue
        if count <= 0 or ends_at <= now:
            stale += 1
            continue
        holders.append(Holder(owner, count, ends_at - now, "write" if side == "w" else "read"))
    for (side, owner), ends_at in sorted(ends.items()):
        if side != "c":
            continue
        if ends_at is None or ends_at <= now:
            stale += 1
        else:
            claims.append(Holder(owner, 0, ends_at - now, "write"))
    return {"holders": tuple(holders), "claims": tuple(claims), "stale": stale, "type": "RWLock"}


def _decode_sem(flat: Dict[str, str], now: int) -> Dict[str, Any]:
    free = _int(flat.get("#free", "")) if "#free" in flat else None
    value = _int(flat.get("#value", "")) if "#value" in flat else None
    bounded = _int(flat.get("#bounded", "0")) == 1
    holders, stale, recovered, live = [], 0, 0, 0
    for owner, raw in sorted(flat.items()):
        if owner.startswith("#"):
            continue
        count = _int(raw) or 0
        ends_at = _int(flat.get(f"#lease:{owner}", ""))
        if ends_at is None or ends_at <= now or count <= 0:
            stale += 1
            recovered += max(count, 0)
            continue
        holders.append(Holder(owner, count, ends_at - now))
        live += count
    if free is not None and recovered:
        # What the next script will compute (sem_lib.lua, load_state): dead holders'
        # permits are free again, a bounded semaphore's never above its initial value.
        recovered_free = free + recovered
        if bounded and value is not None:
            recovered_free = min(recovered_free, max(free, value - live))
        free = recovered_free
    return {
        "holders": tuple(holders),
        "stale": stale,
        "value": value,
        "free": free,
        "type": "BoundedSemaphore" if bounded else "Semaphore",
    }


def _decode(
    namespace: str, kind: str, name: str, raw: Any, pttl: Any, now: int
) -> Optional[PrimitiveState]:
    if isinstance(raw, Exception) or not raw:  # gone since SCAN, or not a hash
        return None
    flat = {_text(k): _text(v) for k, v in raw.items()}
    lease = None if isinstance(pttl, Exception) or int(pttl) < 0 else int(pttl)
    if kind == "rlock":
        parts = _decode_rlock(flat, lease)
    elif kind == "rw":
        parts = _decode_rw(flat, now)
    else:
        parts = _decode_sem(flat, now)
    channels = tuple(channel for _role, channel in channels_for(namespace, kind, name))
    return PrimitiveState(
        namespace=namespace,
        kind=kind,
        name=name,
        key=keys_for(namespace, kind, name).hash,
        lease_ms=lease,
        channels=channels,
        **parts,
    )


# -- I/O ----------------------------------------------------------------------------------


def _server_ms(reply: Any) -> int:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def _snapshot(
    client: Any, namespace: str, entries: Sequence[Tuple[str, str]]
) -> List[PrimitiveState]:
    """Read ``entries`` ((kind, name) pairs) at one server time per batch."""
    states: List[PrimitiveState] = []
    for start in range(0, len(entries), _BATCH):
        batch = entries[start:start + _BATCH]
        pipe = client.pipeline(transaction=True)
        pipe.time()
        for kind, name in batch:
            key = keys_for(namespace, kind, name).hash
            pipe.hgetall(key)
            pipe.pttl(key)
        # A key of another type under our name (WRONGTYPE) must not hide the others.
        replies = pipe.execute(raise_on_error=False)
        if isinstance(replies[0], Exception):
            raise replies[0]
        now = _server_ms(replies[0])
        for i, (kind, name) in enumerate(batch):
            state = _decode(namespace, kind, name, replies[1 + 2 * i], replies[2 + 2 * i], now)
            if state is not None:
                states.append(state)
    return states


def _subscribers(client: Any, channels: Sequence[str]) -> Dict[str, int]:
    """Subscribers of each channel: classic plus sharded (where the server has it)."""
    counts = {channel: 0 for channel in channels}
    if not channels:
        return counts
    for channel, count in client.pubsub_numsub(*channels):
        counts[_text(channel)] += int(count)
    try:
        sharded = client.pubsub_shardnumsub(*channels)
    except ResponseError:  # Redis < 7: no sharded pub/sub, so no sharded subscribers
        return counts
    for channel, count in sharded:
        counts[_text(channel)] += int(count)
    return counts


def _with_waiting(client: Any, states: List[PrimitiveState]) -> List[PrimitiveState]:
    channels = [channel for state in states for channel in state.channels]
    counts: Dict[str, int] = {}
    for start in range(0, len(channels), _BATCH):
        counts.update(_subscribers(client, channels[start:start + _BATCH]))
    result = []
    for state in states:
        roles = channels_for(state.namespace, state.kind, state.name)
        waiting = tuple((role, counts.get(channel, 0)) for role, channel in roles)
        result.append(replace(state, waiting=waiting))
    return result


def _scan(client: Any, namespace: str) -> Iterable[Tuple[str, str]]:
    # MATCH is a glob: the namespace's own glob characters must match literally.
    match = re.sub(r"([\\*?\[\]])", r"\\\1", escape(namespace)) + ":*"
    for key in client.scan_iter(match=match, count=1000, _type="hash"):
        try:
            text = key.decode("utf-8") if isinstance(key, bytes) else key
        except UnicodeDecodeError:
            continue  # rlocks keys are UTF-8 (names are checked at construction)
        parsed = parse_key(text, namespace)
        if parsed is not None:
            yield parsed


def list_primitives(
    client: Any,
    namespace: str = "rlocks",
    pattern: str = "*",
    kinds: Optional[Iterable[str]] = None,
    waiting: bool = True,
) -> List[PrimitiveState]:
    """Every primitive of ``namespace`` whose name matches the glob ``pattern``.

    Sorted by name, then kind. ``kinds`` limits the key kinds ("rlock", "rw", "sem").
    With ``waiting``, each state's ``waiting`` counts subscribers of its wake-up channels
    (one more round trip per 200 primitives). Reads only; Redis errors propagate.
    """
    wanted = set(kinds) if kinds is not None else set(KINDS)
    found = sorted(
        {(kind, name) for kind, name in _scan(client, namespace)
         if kind in wanted and fnmatch.fnmatchcase(name, pattern)},
        key=lambda entry: (entry[1], entry[0]),
    )
    states = _snapshot(client, namespace, found)
    return _with_waiting(client, states) if waiting else states


def find(
    client: Any, namespace: str, name: str, kind: Optional[str] = None, waiting: bool = True
) -> List[PrimitiveState]:
    """The primitives named exactly ``name`` (one per kind that exists; none if unknown).

    ``kind`` limits the search to one key kind. Reads only; Redis errors propagate.
    """
    kinds = [kind] if kind is not None else list(KINDS)
    for code in kinds:
        if code not in KINDS:
            raise ValueError(f"unknown kind {code!r}: expected one of {', '.join(KINDS)}")
    states = _snapshot(client, namespace, [(code, name) for code in kinds])
    return _with_waiting(client, states) if waiting else states


def force_release(client: Any, namespace: str, kind: str, name: str) -> bool:
    """Delete a primitive's hash and wake every waiter on each of its channels.

    Returns True when there was a primitive to release, False when no such hash exists.
    One atomic script (``lua/force_release.lua``). Live holders find their holds lost at
    their next renewal or release. Redis errors propagate.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    keys = [keys_for(namespace, kind, name).hash]
    keys += [channel for _role, channel in channels_for(namespace, kind, name)]
    command = "SPUBLISH" if is_cluster(client) else "PUBLISH"
    return run(client, _FORCE_RELEASE, keys, (command,)).granted


_FORCE_RELEASE = load("force_release")
