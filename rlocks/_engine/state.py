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
server's clock, never this host's: each primitive is read with its server time by one
script (``lua/state_read.lua``), an atomic snapshot of that primitive on the node that
holds its slot.
The snapshot only reads. Holds whose lease has passed are still in the hash until the
next script on that primitive tidies them; they are left out of ``holders`` and counted
in ``stale`` (for a semaphore their permits are counted as free, as the next script will).

Waiters
-------
Who waits is the primitive's queue (``lua/lib.lua``): one entry per waiting thread or
task, in arrival order, with when its lease ends; ``queue`` lists them and ``waiting``
counts them. Entries whose lease passed are left out (counted in ``stale``) as the next
script will drop them.

Layouts are those of ``lua/rlock_lib.lua``, ``rw_lib.lua`` and ``sem_lib.lua``: the holds
hash (owner -> count, plus fields whose names start with ``#``), the holders' lease ends
(RWLock, semaphores; an RLock's lease is its hash's expiry), and the queue, under one
hash tag.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .keys import escape, keys_for
from .scripts import Call, load

__all__ = [
    "KINDS",
    "Forced",
    "Holder",
    "Kind",
    "PrimitiveState",
    "QueueEntry",
    "afind",
    "agreed",
    "astatistics",
    "find",
    "force_release",
    "list_primitives",
    "parse_key",
    "statistics",
    "unescape",
]

_BATCH = 200  # primitives read per pipeline


class Kind(NamedTuple):
    """One kind of primitive as it appears in Redis."""

    code: str  # the key kind (``keys_for``): "rlock", "rw", "sem"
    label: str  # the public class


KINDS: Dict[str, Kind] = {
    "rlock": Kind("rlock", "RLock"),
    "lock": Kind("lock", "Lock"),  # an RLock's layout; its owners are per acquire
    "event": Kind("event", "Event"),  # a flag and its waiters: no holders
    "barrier": Kind("barrier", "Barrier"),  # parties and generations: no holders
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
    #: ms since its lease was last set (granted or renewed): the lease length the last
    #: grant gave minus what is left. A live holder renews every third of it, so a larger
    #: value says its process stopped renewing. None when not known.
    renewed_ms: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"owner": self.owner, "count": self.count}
        data["lease_ms"] = self.lease_ms
        data["renewed_ms"] = self.renewed_ms
        if self.side:
            data["side"] = self.side
        return data


@dataclass(frozen=True)
class QueueEntry:
    """One waiter's place in a primitive's queue (``lua/lib.lua``)."""

    waiter: str  # the owner id (thread or task) that waits
    side: str  # "read" / "write" (RWLock), "" otherwise
    wanted: int  # holds (permits) it asks for
    lease_left_ms: Optional[int]  # ms until the entry ends unless its waiter looks again
    age_ms: Optional[int]  # ms since it took its place
    entry: str = ""  # its member in the queue: '<arrival>:<side>:<owner>'

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
    # (role, waiters queued): ("wake", live entries of the queue); None when not asked
    waiting: Optional[Tuple[Tuple[str, int], ...]] = None
    value: Optional[int] = None  # semaphores: the initial value
    free: Optional[int] = None  # semaphores: permits free, dead holders' included
    stale: int = 0  # holds or entries past their lease, not yet tidied by a script
    #: The queue in order, head first: one entry per waiting thread or task (None: not read).
    queue: Optional[Tuple[QueueEntry, ...]] = None
    #: What a kind without holders is: an Event's "set" or "clear", a Barrier's "2/3
    #: waiting" or "broken".
    detail: Optional[str] = None

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
        if self.detail is not None:
            data["detail"] = self.detail
        return data


# -- decoding one primitive (read-only mirrors of the layouts in lua/*_lib.lua) ----------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any) -> Optional[int]:
    try:
        return int(float(_text(value)))
    except ValueError:
        return None


def _pairs(raw: Any) -> List[Tuple[Any, Any]]:
    """A flat ``a1, b1, a2, b2, ...`` script reply as pairs (none for a missing key)."""
    if not raw:
        return []
    return list(zip(raw[0::2], raw[1::2]))


def _scores(raw: Any) -> List[Tuple[str, float]]:
    """A flat ``ZRANGE ... WITHSCORES`` script reply as (member, score) pairs."""
    return [(_text(member), float(score)) for member, score in _pairs(raw)]


def _decode_rlock(flat: Dict[str, str], pttl: Optional[int], ends: Dict[str, int],
                  now: int) -> Dict[str, Any]:
    holders = [Holder(owner, count, pttl) for owner, count in
               ((o, _int(v)) for o, v in sorted(flat.items()))
               if not owner.startswith("#") and count is not None and count > 0]
    return {"holders": tuple(holders), "stale": 0, "type": "RLock"}


def _decode_rw(flat: Dict[str, str], pttl: Optional[int], ends: Dict[str, int],
               now: int) -> Dict[str, Any]:
    holders, stale = [], 0
    fields = sorted((f for f in flat if f[1:2] == ":" and f[0] in "rw"),
                    key=lambda f: (f[0] != "w", f))  # the writer first, then readers
    for name in fields:
        count = _int(flat[name])
        ends_at = ends.get(name)
        if count is None or count <= 0 or ends_at is None or ends_at <= now:
            stale += 1
            continue
        side = "write" if name[0] == "w" else "read"
        holders.append(Holder(name[2:], count, ends_at - now, side))
    return {"holders": tuple(holders), "stale": stale, "type": "RWLock"}


def _decode_sem(flat: Dict[str, str], pttl: Optional[int], ends: Dict[str, int],
                now: int) -> Dict[str, Any]:
    initial = _int(flat.get("#i", "")) if "#i" in flat else None
    value = _int(flat.get("#v", "")) if "#v" in flat else initial
    bounded = _int(flat.get("#b", "0")) == 1
    holders, stale, held = [], 0, 0
    for owner, raw in sorted(flat.items()):
        if owner.startswith("#"):
            continue
        count = _int(raw) or 0
        ends_at = ends.get(owner)
        if ends_at is None or ends_at <= now or count <= 0:
            stale += 1  # its permits are free again for the next script
            continue
        held += count
        holders.append(Holder(owner, count, ends_at - now))
    free = None if value is None else value - held
    return {"holders": tuple(holders), "stale": stale, "value": initial, "free": free,
            "type": "BoundedSemaphore" if bounded else "Semaphore"}


def _decode_event(flat: Dict[str, str], pttl: Optional[int], ends: Dict[str, int],
                  now: int) -> Dict[str, Any]:
    return {"holders": (), "stale": 0, "type": "Event",
            "detail": "set" if flat.get("set") == "1" else "clear"}


def _decode_barrier(flat: Dict[str, str], pttl: Optional[int], ends: Dict[str, int],
                    now: int) -> Dict[str, Any]:
    # (lua/barrier_lib.lua: parties, n arrived in this generation, broken, act)
    if flat.get("broken") == "1":
        detail = "broken"
    else:
        detail = f"{_int(flat.get('n', '0')) or 0}/{flat.get('parties', '?')} waiting"
        if flat.get("act"):
            detail += ", action running"
    return {"holders": (), "stale": 0, "type": "Barrier", "detail": detail}


_SIDES = {"r": "read", "w": "write"}


def _decode_queue(queue: Any, now: int, kind: str = "") -> Tuple[Tuple[QueueEntry, ...], int]:
    """The queue in arrival order, and how many of its entries' leases ended (stale)."""
    result, stale = [], 0
    for member, end in sorted(_scores(queue)):
        if member.startswith("~"):
            continue  # a fair=False patience mark
        if end <= now:
            stale += 1
            continue
        if kind == "event":  # '[!]<owner>#<wait>': '!' once a set() reached it
            told = member.startswith("!")
            result.append(QueueEntry(
                entry=member, waiter=member.lstrip("!").rsplit("#", 1)[0],
                side="told" if told else "", wanted=1, lease_left_ms=int(end) - now,
                age_ms=None))
            continue
        arrival, side, owner = member.split(":", 2)
        result.append(QueueEntry(
            entry=member, waiter=owner, side=_SIDES.get(side, ""), wanted=1,
            lease_left_ms=int(end) - now, age_ms=now - int(arrival) // 1000))
    return tuple(result), stale


_DECODERS = {"rlock": _decode_rlock, "lock": _decode_rlock, "event": _decode_event,
             "barrier": _decode_barrier, "rw": _decode_rw, "sem": _decode_sem}


def _decode(namespace: str, kind: str, name: str, reply: Any) -> Optional[PrimitiveState]:
    """The state in a ``lua/state_read.lua`` reply (None: no such primitive)."""
    seconds, micros, raw, pttl, leases, queue = reply
    now = int(seconds) * 1000 + int(micros) // 1000
    if not raw and not queue:  # gone since SCAN, or not a hash
        return None
    flat = {_text(k): _text(v) for k, v in _pairs(raw)}
    lease = None if int(pttl) < 0 else int(pttl)
    ends = {member: int(score) for member, score in _scores(leases)}
    parts = _DECODERS[kind](flat, lease, ends, now)
    if kind == "lock":
        parts["type"] = KINDS[kind].label  # (the RLock's layout)
    length = _int(flat.get("#t", ""))
    if length is not None:
        parts["holders"] = tuple(
            replace(h, renewed_ms=max(0, length - h.lease_ms)) if h.lease_ms is not None else h
            for h in parts["holders"])
    waiting_in, stale = _decode_queue(queue, now, kind)
    parts["stale"] += stale
    return PrimitiveState(namespace=namespace, kind=kind, name=name,
                          key=keys_for(namespace, kind, name).hash, lease_ms=lease,
                          queue=waiting_in, waiting=(("wake", len(waiting_in)),), **parts)


# -- I/O ----------------------------------------------------------------------------------


_READ = load("state_read")


def _read_command(namespace: str, kind: str, name: str) -> Tuple[Any, ...]:
    # EVAL, not EVALSHA: a read for a person or a monitor, rare enough to send the text
    # (no NOSCRIPT round trip after a restart); a cluster client routes it by its keys.
    k = keys_for(namespace, kind, name)
    return ("EVAL", _READ.source, 3, k.hash, k.queue, k.leases)


def _states(namespace: str, entries: Sequence[Tuple[str, str]],
            replies: Sequence[Any]) -> List[PrimitiveState]:
    states = []
    for (kind, name), reply in zip(entries, replies):
        if isinstance(reply, Exception):
            raise reply
        state = _decode(namespace, kind, name, reply)
        if state is not None:
            states.append(state)
    return states


def _batches(entries: Sequence[Tuple[str, str]]) -> Iterable[Sequence[Tuple[str, str]]]:
    for start in range(0, len(entries), _BATCH):
        yield entries[start:start + _BATCH]


def _snapshot(client: Any, namespace: str,
              entries: Sequence[Tuple[str, str]]) -> List[PrimitiveState]:
    """Read ``entries`` ((kind, name) pairs), each at one server time (blocking I/O): a
    pipeline per batch; on a cluster, each by itself on its slot's node."""
    if hasattr(client, "get_nodes"):
        return _states(namespace, entries, [
            client.execute_command(*_read_command(namespace, kind, name))
            for kind, name in entries])
    states: List[PrimitiveState] = []
    for batch in _batches(entries):
        pipe = client.pipeline(transaction=False)
        for kind, name in batch:
            pipe.execute_command(*_read_command(namespace, kind, name))
        states += _states(namespace, batch, pipe.execute(raise_on_error=False))
    return states


def _scan(client: Any, namespace: str) -> Iterable[Tuple[str, str]]:
    # MATCH is a glob: the namespace's own glob characters must match literally.
    match = re.sub(r"([\\*?\[\]])", r"\\\1", escape(namespace)) + ":*"
    # Holds hashes, and queues (a primitive may have waiters and no hash: a Semaphore(0)).
    for kind in ("hash", "zset"):
        if hasattr(client, "get_nodes"):  # a cluster: every master
            keys: Iterable[Any] = (key for node in client.get_primaries()
                                   for key in client.scan_iter(match=match, count=1000,
                                                               _type=kind, target_nodes=node))
        else:
            keys = client.scan_iter(match=match, count=1000, _type=kind)
        for key in keys:
            try:
                text = key.decode("utf-8") if isinstance(key, bytes) else key
            except UnicodeDecodeError:
                continue  # rlocks keys are UTF-8 (names are checked at construction)
            if kind == "zset":
                if not text.endswith(":q"):
                    continue
                text = text[:-2]
            parsed = parse_key(text, namespace)
            if parsed is not None:
                yield parsed


def list_primitives(client: Any, namespace: str = "rlocks", pattern: str = "*",
                    kinds: Optional[Iterable[str]] = None,
                    waiting: bool = True) -> List[PrimitiveState]:
    """Every primitive of ``namespace`` whose name matches the glob ``pattern``, sorted by
    name, then kind (on a cluster, every master is scanned). ``kinds`` limits the key
    kinds. Reads only; Redis errors propagate."""
    wanted = set(kinds) if kinds is not None else set(KINDS)
    found = sorted({(kind, name) for kind, name in _scan(client, namespace)
                    if kind in wanted and fnmatch.fnmatchcase(name, pattern)},
                   key=lambda entry: (entry[1], entry[0]))
    states = _snapshot(client, namespace, found)
    return states if waiting else [replace(s, waiting=None) for s in states]


def _named(name: str, kind: Optional[str]) -> List[Tuple[str, str]]:
    """The (kind, name) entries :func:`find` reads; ValueError for an unknown kind."""
    kinds = [kind] if kind is not None else list(KINDS)
    for code in kinds:
        if code not in KINDS:
            raise ValueError(f"unknown kind {code!r}: expected one of {', '.join(KINDS)}")
    return [(code, name) for code in kinds]


def find(client: Any, namespace: str, name: str, kind: Optional[str] = None,
         waiting: bool = True) -> List[PrimitiveState]:
    """The primitives named exactly ``name`` (one per kind that exists; none if unknown).
    Reads only; Redis errors propagate."""
    states = _snapshot(client, namespace, _named(name, kind))
    return states if waiting else [replace(s, waiting=None) for s in states]


async def afind(client: Any, namespace: str, name: str, kind: Optional[str] = None,
                waiting: bool = True) -> List[PrimitiveState]:
    """:func:`find` for a ``redis.asyncio`` client."""
    entries = _named(name, kind)
    states = _states(namespace, entries, [
        await client.execute_command(*_read_command(namespace, code, name))
        for code, name in entries])
    return states if waiting else [replace(s, waiting=None) for s in states]


def _empty(p: Any) -> PrimitiveState:
    kind = p._spec.code
    return PrimitiveState(namespace=p._namespace, kind=kind, name=p._name, key=p._keys.hash,
                          type=KINDS[kind].label if kind != "sem" else (
                              "BoundedSemaphore" if p._spec.bounded else "Semaphore"),
                          holders=(), lease_ms=None, waiting=(("wake", 0),), queue=(),
                          value=p._spec.value if kind == "sem" else None,
                          free=p._spec.value if kind == "sem" else None)


def _own(p: Any, found: List[PrimitiveState]) -> PrimitiveState:
    """The state :func:`find` read for ``p`` (an empty one when Redis has none); a
    semaphore's value, when Redis has only its waiters, is ``p``'s own."""
    if not found:
        return _empty(p)
    state = found[0]
    if p._spec.code == "sem" and state.value is None:
        state = replace(state, value=p._spec.value, free=p._spec.value - state.holds)
    return state


def statistics(p: Any) -> PrimitiveState:
    """The state of primitive ``p`` now (one round trip; on a Quorum, what a majority of
    its masters agree on: :func:`agreed`)."""
    masters = getattr(p._backend, "masters", None)
    if masters is not None:
        results = p._backend._map(lambda m: find(m, p._namespace, p._name, p._spec.code))
        return agreed(p, p._backend.majority, results)
    return _own(p, find(p.client, p._namespace, p._name, p._spec.code))


async def astatistics(p: Any) -> PrimitiveState:
    masters = getattr(p._backend, "masters", None)
    if masters is not None:
        results = await p._backend._amap(
            lambda m: afind(m, p._namespace, p._name, p._spec.code))
        return agreed(p, p._backend.majority, results)
    return _own(p, await afind(p.client, p._namespace, p._name, p._spec.code))


def agreed(p: Any, need: int, results: Sequence[Any]) -> PrimitiveState:
    """What a majority (``need``) of a Quorum's masters agree on, from each master's
    :func:`find` result (or its error): a holder when a majority have its hold, with the
    count and lease a majority have at least. Raises the first error when fewer than a
    majority answered. No I/O."""
    answered = [r for r in results if not isinstance(r, BaseException)]
    if len(answered) < need:
        raise next(r for r in results if isinstance(r, BaseException))
    states = [_own(p, found) for found in answered]

    def at_least(values: List[Optional[int]]) -> Optional[int]:
        # The need-th largest: a majority have this much (None: no expiry, the largest).
        if len(values) < need:
            return None
        ranked = sorted(values, key=lambda v: float("inf") if v is None else v)
        return ranked[len(values) - need]

    holds: Dict[Tuple[str, str], List[Holder]] = {}
    for state in states:
        for holder in state.holders:
            holds.setdefault((holder.owner, holder.side), []).append(holder)
    holders = tuple(
        replace(found[0], count=min(sorted((h.count for h in found), reverse=True)[:need]),
                lease_ms=at_least([h.lease_ms for h in found]))
        for found in holds.values() if len(found) >= need)
    return replace(states[0], holders=holders, stale=0, queue=None, waiting=None,
                   lease_ms=at_least([s.lease_ms for s in states if s.holders]) if holders
                   else None)


class Forced(NamedTuple):
    """What :func:`force_release` did."""

    #: Whether there was a primitive to release (False: no such hash).
    released: bool
    #: Waiters woken to take the freed primitive (each asks with its own acquire).
    handed: int

    def __bool__(self) -> bool:
        return self.released


_FORCE_RELEASE = load("force_release")


def force_release(client: Any, namespace: str, kind: str, name: str) -> Forced:
    """End every hold of a primitive and wake its waiters, in queue order (one atomic
    script, ``lua/force_release.lua``). Live holders find their holds lost at their next
    renewal or release. Returns whether there was a primitive, and how many waiters were
    woken. Redis errors propagate."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    k = keys_for(namespace, kind, name)
    reply = Call(_FORCE_RELEASE, (k.hash, k.queue, k.leases), (k.wake,))(client)
    return Forced(reply.status == 1, len(reply.woken))
