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
Lease ends are *server* times (redis TIME, ms), so "lease left" is read against the
server's clock, never this host's: TIME and every read of each primitive travel in one
MULTI/EXEC, which also makes the listing an atomic snapshot of each batch.
The snapshot only reads. Holds whose lease has passed are still in the hash until the
next script on that primitive tidies them; they are left out of ``holders`` and counted
in ``stale`` (for a semaphore their permits are counted as free, as the next script will).

Waiters
-------
Who waits is the primitive's queue (``lua/queue_lib.lua``): one entry per waiting
*process*, in order, naming the thread or task it is for now, what it wants and when its
lease ends; ``queue`` lists them and ``waiting`` counts them. Entries whose lease passed
are left out (counted in ``stale``) as the next script will drop them.

Layouts (field names) are those documented in the header of ``lua/queue_lib.lua``: the
holds hash (owner -> count, plus counters whose names start with ``#``), the holders'
lease ends, the queue, its entries and their lease ends, all under one hash tag.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .clients import is_cluster
from .keys import escape, keys_for
from .scripts import load_queued, run

__all__ = [
    "KINDS",
    "Forced",
    "Holder",
    "Kind",
    "PrimitiveState",
    "QueueEntry",
    "afind",
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


KINDS: Dict[str, Kind] = {
    "rlock": Kind("rlock", "RLock"),
    "rw": Kind("rw", "RWLock"),  # readers and writers wait in one queue
    "sem": Kind("sem", "Semaphore"),
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


@dataclass(frozen=True)
class Holder:
    """One owner's live hold."""

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
class QueueEntry:
    """One process's place in a primitive's queue (``lua/queue_lib.lua``, KEYS[3..5])."""

    waiter: str  # the owner id (thread or task) the entry is for now
    side: str  # "read" / "write" (RWLock), "" otherwise
    wanted: int  # holds (permits) it asks for
    lease_left_ms: Optional[int]  # ms until the entry ends unless renewed
    age_ms: Optional[int]  # ms since it took its place
    entry: str = ""  # a process's wake-up hub (host:pid:nonce/n): one entry per hub

    def to_dict(self) -> Dict[str, Any]:
        return _entry_dict(self)


_QUEUE_FIELDS = ("waiter", "side", "wanted", "lease_left_ms", "age_ms", "entry")


def _entry_dict(entry: Any) -> Dict[str, Any]:
    return {name: getattr(entry, name) for name in _QUEUE_FIELDS if hasattr(entry, name)}


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
    # (role, processes queued): ("wake", ZCARD of the queue); None when not asked
    waiting: Optional[Tuple[Tuple[str, int], ...]] = None
    value: Optional[int] = None  # semaphores: the initial value
    free: Optional[int] = None  # semaphores: permits free, dead holders' included
    stale: int = 0  # holds or entries past their lease, not yet tidied by a script
    #: The queue in order, head first: one entry per waiting process (None: not read).
    queue: Optional[Tuple[QueueEntry, ...]] = None

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
            "queue": None if self.queue is None else [_entry_dict(e) for e in self.queue],
        }
        if self.kind == "sem":
            data["value"] = self.value
            data["free"] = self.free
        return data


# -- decoding one hash (read-only mirrors of the layouts in lua/*_lib.lua) -----------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> Optional[int]:
    try:
        return int(float(_text(value)))
    except ValueError:
        return None


def _scores(raw: Any) -> List[Tuple[str, float]]:
    """A ``ZRANGE ... WITHSCORES`` reply as (member, score) pairs."""
    if isinstance(raw, Exception) or not raw:
        return []
    return [(_text(member), float(score)) for member, score in raw]


def _decode_rlock(flat: Dict[str, str], ends: Dict[str, int], now: int) -> Dict[str, Any]:
    holders, stale = [], 0
    for owner, raw in sorted(flat.items()):
        count = _int(raw)
        ends_at = ends.get(owner)
        if owner.startswith("#") or count is None or count <= 0:
            continue
        if ends_at is None or ends_at <= now:
            stale += 1
            continue
        holders.append(Holder(owner, count, ends_at - now))
    return {"holders": tuple(holders), "stale": stale, "type": "RLock"}


def _decode_rw(flat: Dict[str, str], ends: Dict[str, int], now: int) -> Dict[str, Any]:
    holders, stale = [], 0
    # The writer first, then readers by owner id.
    fields = sorted((f for f in flat if f[1:2] == ":" and f[0] in "rw"),
                    key=lambda f: (f[0] != "w", f))
    for name in fields:
        count = _int(flat[name])
        ends_at = ends.get(name)
        if count is None or count <= 0 or ends_at is None or ends_at <= now:
            stale += 1
            continue
        side = "write" if name[0] == "w" else "read"
        holders.append(Holder(name[2:], count, ends_at - now, side))
    return {"holders": tuple(holders), "stale": stale, "type": "RWLock"}


def _decode_sem(flat: Dict[str, str], ends: Dict[str, int], now: int) -> Dict[str, Any]:
    free = _int(flat.get("#free", "")) if "#free" in flat else None
    value = _int(flat.get("#value", "")) if "#value" in flat else None
    held = _int(flat.get("#held", "0")) or 0
    bounded = _int(flat.get("#bounded", "0")) == 1
    holders, stale = [], 0
    for owner, raw in sorted(flat.items()):
        if owner.startswith("#"):
            continue
        count = _int(raw) or 0
        ends_at = ends.get(owner)
        if ends_at is None or ends_at <= now or count <= 0:
            stale += 1
            if free is not None:
                # What the next script's purge computes (queue_lib.lua): a dead holder's
                # permits are free again, a bounded semaphore's never above its value.
                held -= max(count, 0)
                back = free + max(count, 0)
                if bounded and value is not None:
                    back = min(back, max(free, value - held))
                free = back
            continue
        holders.append(Holder(owner, count, ends_at - now))
    return {
        "holders": tuple(holders),
        "stale": stale,
        "value": value,
        "free": free,
        "type": "BoundedSemaphore" if bounded else "Semaphore",
    }


_SIDES = {"r": "read", "w": "write"}


def _decode_queue(
    queue: Any, entries: Any, times: Any, now: int
) -> Tuple[Tuple[QueueEntry, ...], int]:
    """The queue in order, and how many of its entries' leases ended (stale)."""
    table = {} if isinstance(entries, Exception) or not entries else {
        _text(k): _text(v) for k, v in entries.items()
    }
    ends = dict(_scores(times))
    result, stale = [], 0
    for token, _seq in _scores(queue):
        try:
            data = json.loads(table.get(f"e:{token}", ""))
        except ValueError:
            data = {}
        end = ends.get(f"e:{token}")
        if end is not None and end <= now:
            stale += 1
            continue
        since = data.get("t")
        result.append(QueueEntry(
            entry=token,
            waiter=str(data.get("w", "")),
            side=_SIDES.get(str(data.get("s", "")), ""),
            wanted=int(data.get("n", 0) or 0),
            lease_left_ms=None if end is None else int(end) - now,
            age_ms=None if since is None else now - int(since),
        ))
    return tuple(result), stale


def _decode(
    namespace: str, kind: str, name: str, replies: Sequence[Any], now: int
) -> Optional[PrimitiveState]:
    raw, pttl, leases, queue, entries, times = replies
    hash_gone = isinstance(raw, Exception) or not raw
    queue_gone = isinstance(queue, Exception) or not queue
    if hash_gone and queue_gone:  # gone since SCAN, or not a hash
        return None
    flat = {} if hash_gone else {_text(k): _text(v) for k, v in raw.items()}
    lease = None if isinstance(pttl, Exception) or int(pttl) < 0 else int(pttl)
    ends = {member: int(score) for member, score in _scores(leases)}
    if kind == "rlock":
        parts = _decode_rlock(flat, ends, now)
    elif kind == "rw":
        parts = _decode_rw(flat, ends, now)
    else:
        parts = _decode_sem(flat, ends, now)
    waiting_in, stale = _decode_queue(queue, entries, times, now)
    parts["stale"] += stale
    return PrimitiveState(
        namespace=namespace,
        kind=kind,
        name=name,
        key=keys_for(namespace, kind, name).hash,
        lease_ms=lease,
        queue=waiting_in,
        **parts,
    )


# -- I/O ----------------------------------------------------------------------------------


def _server_ms(reply: Any) -> int:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def _read_batch(pipe: Any, namespace: str, batch: Sequence[Tuple[str, str]]) -> None:
    """Queue on ``pipe`` (a MULTI pipeline, sync or asyncio) the reads of ``batch``."""
    pipe.time()
    for kind, name in batch:
        key, leases, queue, table, times = keys_for(namespace, kind, name).queued()[:5]
        pipe.hgetall(key)
        pipe.pttl(key)
        pipe.zrange(leases, 0, -1, withscores=True)
        pipe.zrange(queue, 0, -1, withscores=True)
        pipe.hgetall(table)
        pipe.zrange(times, 0, -1, withscores=True)


def _decode_batch(
    namespace: str, batch: Sequence[Tuple[str, str]], replies: Sequence[Any]
) -> List[PrimitiveState]:
    """The states of ``batch`` from the replies of :func:`_read_batch`'s pipeline (read
    with ``raise_on_error=False``: a key of another type under our name, WRONGTYPE, must
    not hide the others). Raises the error of TIME, the batch's first command."""
    if isinstance(replies[0], Exception):
        raise replies[0]
    now = _server_ms(replies[0])
    states: List[PrimitiveState] = []
    for i, (kind, name) in enumerate(batch):
        state = _decode(namespace, kind, name, replies[1 + 6 * i:7 + 6 * i], now)
        if state is not None:
            states.append(state)
    return states


def _batches(entries: Sequence[Tuple[str, str]]) -> Iterable[Sequence[Tuple[str, str]]]:
    for start in range(0, len(entries), _BATCH):
        yield entries[start:start + _BATCH]


def _snapshot(
    client: Any, namespace: str, entries: Sequence[Tuple[str, str]]
) -> List[PrimitiveState]:
    """Read ``entries`` ((kind, name) pairs) at one server time per batch (blocking I/O)."""
    states: List[PrimitiveState] = []
    for batch in _batches(entries):
        pipe = client.pipeline(transaction=True)
        _read_batch(pipe, namespace, batch)
        states += _decode_batch(namespace, batch, pipe.execute(raise_on_error=False))
    return states


def _with_waiting(client: Any, states: List[PrimitiveState]) -> List[PrimitiveState]:
    # Who waits is the queue: one entry per waiting process (no round trip: the snapshot
    # read it; ZCARD counts entries whose lease ended too, the snapshot does not).
    return [replace(state, waiting=(("wake", len(state.queue or ())),)) for state in states]


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
    With ``waiting``, each state's ``waiting`` counts the live entries of its queue (one
    per waiting process; no extra round trip). Reads only; Redis errors propagate.
    """
    wanted = set(kinds) if kinds is not None else set(KINDS)
    found = sorted(
        {(kind, name) for kind, name in _scan(client, namespace)
         if kind in wanted and fnmatch.fnmatchcase(name, pattern)},
        key=lambda entry: (entry[1], entry[0]),
    )
    states = _snapshot(client, namespace, found)
    return _with_waiting(client, states) if waiting else states


def _named(name: str, kind: Optional[str]) -> List[Tuple[str, str]]:
    """The (kind, name) entries :func:`find` reads; ValueError for an unknown kind."""
    kinds = [kind] if kind is not None else list(KINDS)
    for code in kinds:
        if code not in KINDS:
            raise ValueError(f"unknown kind {code!r}: expected one of {', '.join(KINDS)}")
    return [(code, name) for code in kinds]


def find(
    client: Any, namespace: str, name: str, kind: Optional[str] = None, waiting: bool = True
) -> List[PrimitiveState]:
    """The primitives named exactly ``name`` (one per kind that exists; none if unknown).

    ``kind`` limits the search to one key kind. Reads only (one round trip, blocking);
    Redis errors propagate.
    """
    states = _snapshot(client, namespace, _named(name, kind))
    return _with_waiting(client, states) if waiting else states


async def afind(
    client: Any, namespace: str, name: str, kind: Optional[str] = None, waiting: bool = True
) -> List[PrimitiveState]:
    """:func:`find` for a ``redis.asyncio`` client (awaits its one round trip)."""
    entries = _named(name, kind)  # at most one per kind: one batch
    pipe = client.pipeline(transaction=True)
    _read_batch(pipe, namespace, entries)
    states = _decode_batch(namespace, entries, await pipe.execute(raise_on_error=False))
    return _with_waiting(client, states) if waiting else states


class Forced(NamedTuple):
    """What :func:`force_release` did."""

    #: Whether there was a primitive to release (False: no such hash).
    released: bool
    #: Queued waiters (one per process) the freed primitive was handed to at once.
    handed: int

    def __bool__(self) -> bool:
        return self.released


def force_release(client: Any, namespace: str, kind: str, name: str) -> Forced:
    """End every hold of a primitive and hand it over to its queue, in order.

    Returns whether there was a primitive to release (False when no such hash exists;
    the result is truthy then) and to how many queued waiters it was handed. One atomic
    script (``lua/force_release.lua``). Live holders find their holds lost at their next
    renewal or release. Redis errors propagate.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    keys = keys_for(namespace, kind, name).queued()
    command = "SPUBLISH" if is_cluster(client) else "PUBLISH"
    # fair = 1: the freed primitive is granted to the queue head(s) at once; 2000 ms: the
    # engine's entry lease (Primitive._entry_ms), the grants' lease until adopted.
    reply = run(client, _FORCE_RELEASE, keys, ("", command, 1, 2000, kind))
    # A grant's wake-up line is 'g <waiter> [token]' (see queue_lib.lua's reply contract).
    return Forced(reply.granted, sum(1 for line in reply.wakes if line.startswith("g ")))


_FORCE_RELEASE = load_queued("force_release")
