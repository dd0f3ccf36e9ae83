"""Deadlock detection: the wait-for graph each waiting owner records, and its check.

Written once, without I/O: :func:`check` is a generator that yields :class:`.queued.Op`
(``READ``: run this one Redis command) and receives the answers, so the threading and the
asyncio drivers run the same check (see :mod:`.queued`).

The graph
---------
An owner (a thread, or a task) that has waited ``deadlock_timeout`` seconds for an RLock or
an RWLock side records its *wait-for edge*: the key ``<ns>:wait:{<owner>}`` holds
``"<seq> <side> <hash key>"``, the primitive it waits for and on which side (``x`` an
RLock, ``r``/``w`` an RWLock side), with a lease (``PX``) that each later check renews, so
a dead waiter leaves no edge for longer than that lease. ``<seq>`` numbers the *wait*: it
is drawn once per wait (``INCR <ns>:wait-seq``) and kept while it lasts. The edge is
deleted when the wait ends, before ``acquire`` returns or raises, so while an edge with a
given ``seq`` exists, that owner is still inside that one blocking acquire. Nothing of
this is written by a wait shorter than ``deadlock_timeout``.

The check
---------
From the checker's own edge the walk reads the primitive's live holds (``lua/
deadlock_holders.lua``: one key, so any cluster slot) that conflict with the side waited
for (a reader waits only for the writer; a writer and an RLock waiter for every holder),
then those holders' edges, and so on, depth first, until it comes back to the checker: a
cycle. Each read is one key in its own slot, so the walk is not atomic and what it saw may
have changed; before accusing anyone it *confirms*: it reads every hold of the cycle
again, then every edge again, and gives up unless all are still there with the same
``seq``. Why that suffices: an owner whose edge has the same ``seq`` at the walk's read
and at the confirming read was blocked in one acquire throughout, and a blocked owner
cannot take a hold it lacks; so each hold read present by the confirmation was held since
the walk read its owner's edge. At the moment of the walk's last edge read, then, every
owner of the cycle was blocked, holding what the previous one waits for: a deadlock.

Exactly one victim: the owner of the cycle whose wait has the highest ``seq`` (the wait
that entered the check last). Every owner of the cycle that checks picks the same one, and
only the victim raises; the others keep waiting and the victim's own check finds the cycle
(usually at its first check, since its edge was the last to appear). The victim leaves the
queue and raises :class:`~rlocks.errors.DeadlockError`; what it holds stays held until its
exception handler releases it, as in PostgreSQL.

Limits: a wait through a Semaphore, or an owner whose primitive has ``deadlock_timeout=None``,
records no edge, so a cycle through it is not seen; a reader queued behind a waiting
writer (with only readers holding) waits for that writer, not for a holder, and such a
cycle is not seen either. An edge whose deletion failed (the link broke as the wait ended)
lives until its lease.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Generator, List, NamedTuple, Optional, Sequence, Tuple

from redis.exceptions import NoScriptError

from ..errors import DeadlockError
from .clock import monotonic
from .keys import wait_key, wait_seq_key
from .scripts import load
from .state import parse_key

__all__ = ["Detector", "Edge", "check", "drop_edge"]

log = logging.getLogger(__name__)

#: Owners a walk visits at most: a bound on the reads one check makes.
MAX_OWNERS = 64

_HOLDERS = load("deadlock_holders")

#: What a detector step yields: a Redis command (a tuple), answered with its raw reply.
Reads = Generator[Tuple[Any, ...], Any, Any]


class Edge(NamedTuple):
    """One owner's recorded wait: it waits for ``key`` (on ``side``), wait number ``seq``."""

    owner: str
    seq: int
    side: str  # 'x' RLock, 'r' / 'w' RWLock side
    key: str  # the primitive's holds hash

    def value(self) -> str:
        return f"{self.seq} {self.side} {self.key}"

    @classmethod
    def parse(cls, owner: str, raw: Any) -> Optional["Edge"]:
        """The edge stored as ``raw`` (``None`` for no key or a value rlocks did not write)."""
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        parts = text.split(" ", 2)  # the key may contain spaces: it is last
        if len(parts) != 3 or parts[1] not in ("x", "r", "w") or not parts[0].isdigit():
            return None
        return cls(owner, int(parts[0]), parts[1], parts[2])


class Detector:
    """One waiting owner's detector state: when to check, and its edge once recorded."""

    __slots__ = ("namespace", "owner", "side", "key", "timeout", "due", "seq", "label", "name")

    def __init__(
        self, namespace: str, owner: str, side: str, key: str, timeout: float, since: float,
        label: str, name: str,
    ) -> None:
        self.namespace = namespace
        self.owner = owner
        self.side = side
        self.key = key
        self.timeout = timeout
        self.due = since + timeout  # the first check: only a wait this long pays for one
        self.seq: Optional[int] = None  # drawn at the first check; then an edge may exist
        self.label = label  # the waiting primitive, as messages describe it
        self.name = name  # and its name, as errors carry it

    def pause(self, pause: float) -> float:
        """``pause`` shortened so the waiter wakes up for its next check."""
        return max(0.0, min(pause, self.due - monotonic()))

    def lease_ms(self) -> int:
        # Renewed at each check, every ``timeout``: two periods and a second of slack.
        return int((2.0 * self.timeout + 1.0) * 1000.0)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _holders(key: str, side: str) -> Reads:
    """``{owner: side held}`` of the holds of ``key`` that block a waiter of ``side``."""
    # The lease ZSET beside the hash (``PrimitiveKeys.queued()``'s second key).
    command = ("EVALSHA", _HOLDERS.sha, 1, f"{key}:leases")
    try:
        raw = yield command
    except NoScriptError:
        # (SCRIPT LOAD, not EVAL: the documented ACL lines allow only those two.)
        yield ("SCRIPT", "LOAD", _HOLDERS.source)
        raw = yield command
    owners: Dict[str, str] = {}
    for field in raw or ():
        field = _text(field)
        if side == "x":
            owners[field] = "x"
        elif field[:2] == "w:" or (side == "w" and field[:2] == "r:"):
            owners.setdefault(field[2:], field[0])  # a writer that also reads: 'w' first
    return owners


def check(det: Detector) -> Reads:
    """Record (or renew) ``det``'s edge, then look for a cycle through it.

    Returns the :class:`DeadlockError` to raise when ``det``'s owner is the victim of a
    confirmed cycle, else ``None``. Sets ``det.due`` to the next check. Redis errors
    propagate (the caller treats a failed check as no finding).
    """
    if det.seq is None:
        det.seq = int((yield ("INCR", wait_seq_key(det.namespace))))
    mine = Edge(det.owner, det.seq, det.side, det.key)
    yield ("SET", wait_key(det.namespace, det.owner), mine.value(), "PX", det.lease_ms())
    det.due = monotonic() + det.timeout
    cycle = yield from _walk(det, mine)
    if cycle is None:
        return None
    held = yield from _confirm(det, cycle)
    if held is None:
        return None
    # (seq, owner): a total order even if the counter was deleted and numbers repeat.
    victim = max(cycle, key=lambda edge: (edge.seq, edge.owner))
    described = _describe(det.namespace, cycle, held)
    if victim.owner != det.owner:
        log.debug("deadlock seen by %s; %s will raise: %s", det.owner, victim.owner, described)
        return None
    return DeadlockError(
        f"deadlock: {det.label} acquired by {det.owner} would wait forever: "
        + "; ".join(f"{o} holds {h} and waits for {w}" for o, h, w in described),
        name=det.name,
        cycle=described,
    )


def _walk(det: Detector, mine: Edge) -> Generator[Tuple[Any, ...], Any, Optional[List[Edge]]]:
    """Depth first from ``mine``: the edges of a cycle back to ``det.owner`` (``mine``
    first; each edge's primitive is held by the next edge's owner, the last's by the
    checker), or ``None``."""
    seen = {det.owner}
    stack: List[List[Edge]] = [[mine]]
    while stack and len(seen) < MAX_OWNERS:
        path = stack.pop()
        tip = path[-1]
        for holder in (yield from _holders(tip.key, tip.side)):
            if holder == tip.owner:
                continue  # a writer reading its own lock, say: not a wait
            if holder == det.owner:
                return path
            if holder in seen:
                continue  # reachable from here iff it was from there: explored already
            seen.add(holder)
            edge = Edge.parse(holder, (yield ("GET", wait_key(det.namespace, holder))))
            if edge is not None:
                stack.append(path + [edge])
    return None


def _confirm(
    det: Detector, cycle: Sequence[Edge]
) -> Generator[Tuple[Any, ...], Any, Optional[List[str]]]:
    """Whether every hold, then every edge, of ``cycle`` is still what the walk read:
    the side each edge's primitive is held on (by the next owner), or ``None``."""
    owners = [edge.owner for edge in cycle[1:]] + [det.owner]
    held: List[str] = []
    for edge, holder in zip(cycle, owners):
        side = (yield from _holders(edge.key, edge.side)).get(holder)
        if side is None:
            return None
        held.append(side)
    for edge in cycle[1:]:  # the checker's own edge is its own: it is waiting
        raw = yield ("GET", wait_key(det.namespace, edge.owner))
        if Edge.parse(edge.owner, raw) != edge:
            return None
    return held


def _name(namespace: str, key: str, side: str) -> str:
    """``RLock 'a'`` / ``RWLock 'b' (read)`` for a primitive's hash key and a side."""
    parsed = parse_key(key, namespace)
    kind, name = parsed if parsed is not None else ("?", key)
    if side == "x":
        return f"{'RLock' if kind == 'rlock' else kind} {name!r}"
    return f"RWLock {name!r} ({'read' if side == 'r' else 'write'})"


def _describe(
    namespace: str, cycle: Sequence[Edge], held: Sequence[str]
) -> Tuple[Tuple[str, str, str], ...]:
    """``(owner, holds, waits_for)`` for each owner of ``cycle``, starting with the checker:
    edge ``i``'s primitive is held (on side ``held[i]``) by the owner of edge ``i + 1``."""
    return tuple(
        (
            edge.owner,
            _name(namespace, cycle[i - 1].key, held[i - 1]),
            _name(namespace, edge.key, edge.side),
        )
        for i, edge in enumerate(cycle)
    )


def drop_edge(det: Detector) -> Tuple[Any, ...]:
    """The command that deletes ``det``'s edge (its wait ended)."""
    return ("DEL", wait_key(det.namespace, det.owner))
