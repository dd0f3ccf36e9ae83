"""Deadlock detection: the wait-for graph each waiting owner records, and its check.

Written once, without I/O: :func:`check` is a generator that yields Redis commands and
receives their answers; :class:`Detector` turns them into :class:`~.steps.Read` steps, so
the threading and the asyncio drivers run the same check (see :mod:`.dialogues`).

The graph
---------
An owner (a thread, or a task) that has waited ``deadlock_timeout`` seconds for an RLock or
an RWLock side records its *wait-for edge*: the key ``<ns>:wait:{<owner>}`` holds
``"<seq> <side> <queue> <hash key>"``, the primitive it waits for and on which side (``x``
an RLock, ``r``/``w`` an RWLock side) and whether its place in the queue holds it back
(``+``; ``-`` for a ``fair=False`` primitive), with a lease (``PX``) that each later check
renews, so a dead waiter leaves no edge for longer than that lease. ``<seq>`` numbers the *wait*: it
is drawn once per wait (``INCR <ns>:wait-seq``) and kept while it lasts. The edge is
deleted when the wait ends, before ``acquire`` returns or raises, so while an edge with a
given ``seq`` exists, that owner is still inside that one blocking acquire. Nothing of
this is written by a wait shorter than ``deadlock_timeout``.

The check
---------
From the checker's own edge the walk reads what blocks the waiter (``lua/
deadlock_holders.lua``: one slot, so any cluster node): the primitive's live holds that
conflict with the side waited for (a reader waits only for the writer; a writer and an
RLock waiter for every holder) and, for a fair primitive, the owner of the queue entry
just ahead of the waiter's (strict FIFO: a reader queued behind a waiting writer is
granted only after it, though only readers hold); then those owners' edges, and so on,
depth first, until it comes back to the checker: a cycle. Each read is one slot, so the
walk is not atomic and what it saw may have changed; before accusing anyone it *confirms*:
it reads every hold (and place ahead) of the cycle again, then every edge again, and gives
up unless all are still there with the same ``seq``. Why that suffices: an owner whose
edge has the same ``seq`` at the walk's read and at the confirming read was blocked in one
acquire throughout, and a blocked owner cannot take a hold it lacks (a script grants only
to the caller that sent it, and a blocked owner sends no acquire but the one it waits in,
whose grant ends the wait); an owner that holds anything of what it
waits for is counted as not blocked at all (a re-entry, a writer's read and a refused
upgrade never wait), at the walk's read and at the confirming one. So each hold read
present by the confirmation was held since the walk read its owner's edge. A queue edge is
confirmed only with the same two sequence numbers (the entry ahead's and the waiter's):
entries join only at the tail and keep their number while they keep their place, so the
entry ahead was ahead throughout. At the moment of the walk's last edge read, then, every
owner of the cycle was blocked, holding (or queued ahead of) what the previous one waits
for: a deadlock.

Exactly one victim: the owner of the cycle whose wait has the highest ``seq`` (the wait
that entered the check last), leaving out a wait that may not give up: a Condition wait
taking its lock back (``Primitive._restoring``; its edge stores the side in capitals) must
return holding the lock, as ``threading.Condition.wait`` does, so another member of the
cycle is accused (a cycle of such waits only is logged and not broken). Every owner of
the cycle that checks picks the same one, and only the victim raises; the others keep
waiting and the victim's own check finds the cycle (usually at its first check, since
its edge was the last to appear). The victim leaves the queue and raises
:class:`~rlocks.errors.DeadlockError`; what it holds stays held until its
exception handler releases it, as in PostgreSQL.

A victim another member found: a walk visits at most ``MAX_OWNERS`` owners (holders
without an edge count too), so the victim's own walk may stop before it comes back (a
writer blocked by more readers than that) while the walk of another member, starting
elsewhere, closes the cycle. So a member that confirms a cycle whose victim is another
wait leaves that wait an *accusation* (``lua/deadlock_accuse.lua``: the cycle, turned to
start at the victim's edge, in ``<ns>:accuse:{<owner>}``), written only while that very
wait's edge is there (same ``seq``) and expiring with it. Every check reads its own
accusation first; one for its current wait is confirmed by the accused itself, exactly as
its own walk's finding would be (so a member that has left since clears it), and then
raises. The wait's end deletes the accusation with the edge. A cycle every member's walk
of which runs out of owners before it comes back (each blocked by that many holders) is
still not seen.

Limits: a wait through a Semaphore, or an owner whose primitive has ``deadlock_timeout=None``,
records no edge, so a cycle through it is not seen. Of the queue, only the entry just
ahead counts (it waits for the one ahead of it in turn), and only while its lease runs.
An edge whose deletion failed (the link broke as the wait ended) lives until its lease.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, Generator, List, NamedTuple, Optional, Sequence, Tuple

from redis.exceptions import NoScriptError, RedisError

from ..errors import DeadlockError
from .checks import shown
from .clock import monotonic
from .keys import accuse_key, wait_key, wait_seq_key
from .scripts import load
from .state import parse_key
from .steps import Read

__all__ = ["Detector", "Edge", "check", "drop_edge"]

log = logging.getLogger(__name__)

#: Owners a walk visits at most: a bound on the reads one check makes.
MAX_OWNERS = 64

_HOLDERS = load("deadlock_holders")
_ACCUSE = load("deadlock_accuse")

#: An edge's side as stored: capitals for a restoring wait (see Edge.restoring).
_SIDES = ("x", "r", "w", "X", "R", "W")

#: What a detector step yields: a Redis command (a tuple), answered with its raw reply.
Reads = Generator[Tuple[Any, ...], Any, Any]


class Edge(NamedTuple):
    """One owner's recorded wait: it waits for ``key`` (on ``side``), wait number ``seq``."""

    owner: str
    seq: int
    side: str  # 'x' RLock, 'r' / 'w' RWLock side
    key: str  # the primitive's holds hash
    entry: str = "-"  # '+': its place in the queue holds it back; '-': not (fair=False)
    #: A Condition wait taking its lock back: it may not give up, so never the victim.
    #: Stored as the side in capitals (an older rlocks reads no edge there: it then
    #: misses that cycle, never accuses the wrong owner).
    restoring: bool = False

    def value(self) -> str:
        side = self.side.upper() if self.restoring else self.side
        return f"{self.seq} {side} {self.entry} {self.key}"

    @classmethod
    def parse(cls, owner: str, raw: Any) -> Optional["Edge"]:
        """The edge stored as ``raw`` (``None`` for no key or a value rlocks did not write)."""
        if raw is None:
            return None
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        parts = text.split(" ", 3)  # the key may contain spaces: it is last
        if len(parts) != 4 or parts[1] not in _SIDES or not parts[0].isdigit():
            return None
        side = parts[1]
        return cls(owner, int(parts[0]), side.lower(), parts[3], parts[2], side.isupper())


class _Wait:
    """One waiting owner's detector state: when to check, and its edge once recorded."""

    __slots__ = (
        "namespace", "owner", "side", "key", "entry", "timeout", "due", "seq", "label", "name",
        "restoring", "warned",
    )

    def __init__(
        self, namespace: str, owner: str, side: str, key: str, timeout: float, since: float,
        label: str, name: str, entry: str = "-", restoring: bool = False,
    ) -> None:
        self.namespace = namespace
        self.owner = owner
        self.side = side
        self.key = key
        self.entry = entry  # '+': its place in the queue holds it back; '-': not
        self.timeout = timeout
        self.due = since + timeout  # the first check: only a wait this long pays for one
        self.seq: Optional[int] = None  # drawn at the first check; then an edge may exist
        self.label = label  # the waiting primitive, as messages describe it
        self.name = name  # and its name, as errors carry it
        self.restoring = restoring  # a Condition wait taking its lock back: never the victim
        self.warned = False  # it logged a cycle nobody may break (once per wait, not per check)

    def pause(self, pause: float) -> float:
        """``pause`` shortened so the waiter wakes up for its next check."""
        return max(0.0, min(pause, self.due - monotonic()))

    def lease_ms(self) -> int:
        # Renewed at each check, every ``timeout``: two periods and a second of slack.
        return int((2.0 * self.timeout + 1.0) * 1000.0)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _evalsha(script: Any, keys: Sequence[str], args: Sequence[str]) -> Reads:
    """Run one of the detector's scripts (one slot); its raw reply."""
    command = ("EVALSHA", script.sha, len(keys), *keys, *args)
    try:
        return (yield command)
    except NoScriptError:
        # (SCRIPT LOAD, not EVAL: the documented ACL lines allow only those two.)
        yield ("SCRIPT", "LOAD", script.source)
        return (yield command)


def _blockers(edge: Edge) -> Reads:
    """``{owner: how it blocks}`` for the waiter of ``edge``: the side it holds (``x``,
    ``r``, ``w``) for each hold of ``edge.key`` that conflicts with ``edge.side``, and
    ``q <side> <its arrival> <waiter's arrival>`` for the owner of the entry just ahead of
    the waiter in the queue. Nothing when the waiter holds ``edge.key`` itself (granted,
    and still inside its acquire)."""
    key = edge.key
    raw = yield from _evalsha(
        _HOLDERS, (key, f"{key}:q", f"{key}:l"),
        ("rlock" if edge.side == "x" else "rw", "" if edge.entry == "-" else edge.owner))
    holds, ahead = raw if raw else ((), ())
    fields = [_text(field) for field in holds or ()]
    own = (edge.owner,) if edge.side == "x" else ("r:" + edge.owner, "w:" + edge.owner)
    if any(field in own for field in fields):
        return {}
    owners: Dict[str, str] = {}
    for field in fields:
        if edge.side == "x":
            owners[field] = "x"
        elif field[:2] == "w:" or (edge.side == "w" and field[:2] == "r:"):
            owners.setdefault(field[2:], field[0])  # a writer that also reads: 'w' first
    if ahead:
        owner, side, theirs, mine = (_text(part) for part in ahead)
        owners.setdefault(owner, f"q {side} {theirs} {mine}")
    return owners


def check(det: _Wait) -> Reads:
    """Record (or renew) ``det``'s edge, then look for a cycle through it.

    Returns the :class:`DeadlockError` to raise when ``det``'s owner is the victim of a
    confirmed cycle, else ``None``. Sets ``det.due`` to the next check. Redis errors
    propagate (the caller treats a failed check as no finding).
    """
    if det.seq is None:
        det.seq = int((yield ("INCR", wait_seq_key(det.namespace))))
    mine = Edge(det.owner, det.seq, det.side, det.key, det.entry, det.restoring)
    yield ("SET", wait_key(det.namespace, det.owner), mine.value(), "PX", det.lease_ms())
    det.due = monotonic() + det.timeout
    accused = yield from _accused(det, mine)
    if accused is not None:
        return accused
    found = yield from _walk(det, mine)
    if found is None:
        return None
    cycle, ways = found
    held = yield from _confirm(det, cycle, ways)
    if held is None:
        return None
    described = _describe(det.namespace, cycle, held)
    victim = _victim(cycle)
    if victim is None:
        # Only Condition waits taking their locks back, none of which may give up: as
        # with threading's Condition, they wait on (see the module docstring).
        level = logging.DEBUG if det.warned else logging.WARNING
        det.warned = True
        log.log(level, "deadlock among Condition waits taking their locks back: %s", described)
        return None
    if victim.owner != det.owner:
        log.debug("deadlock seen by %s; %s will raise: %s", det.owner, victim.owner, described)
        yield from _accuse(det, victim, cycle, ways)
        return None
    return _error(det, described)


def _victim(cycle: Sequence[Edge]) -> Optional[Edge]:
    """The edge of ``cycle`` whose owner must raise: the youngest wait that may give up
    (``None``: every one is a Condition wait taking its lock back)."""
    eligible = [edge for edge in cycle if not edge.restoring]
    if not eligible:
        return None
    # (seq, owner): a total order even if the counter was deleted and numbers repeat.
    return max(eligible, key=lambda edge: (edge.seq, edge.owner))


def _error(det: _Wait, described: Tuple[Tuple[str, str, str], ...]) -> DeadlockError:
    return DeadlockError(
        f"deadlock: {det.label} acquired by {det.owner} would wait forever: "
        + "; ".join(f"{o} holds {h} and waits for {w}" for o, h, w in described),
        name=det.name,
        cycle=described,
    )


def _accuse(det: _Wait, victim: Edge, cycle: Sequence[Edge], ways: Sequence[str]) -> Reads:
    """Leave ``victim`` the cycle ``det`` found and confirmed, turned to start at the
    victim's edge (as the victim's own walk would have found it); see "A victim another
    member found" in the module docstring."""
    at = list(cycle).index(victim)
    turned = list(cycle[at:]) + list(cycle[:at])
    text = json.dumps({
        "c": [[edge.owner, edge.value()] for edge in turned],
        "w": list(ways[at:]) + list(ways[:at]),
    })
    yield from _evalsha(
        _ACCUSE,
        (wait_key(det.namespace, victim.owner), accuse_key(det.namespace, victim.owner)),
        (str(victim.seq), text),
    )


def _accused(det: _Wait, mine: Edge) -> Reads:
    """The error to raise if another member of a cycle accused this wait and the cycle is
    still there (confirmed here, as by the accuser), else ``None``."""
    raw = yield ("GET", accuse_key(det.namespace, det.owner))
    if raw is None:
        return None
    try:
        doc = json.loads(_text(raw))
        cycle = [Edge.parse(str(owner), value) for owner, value in doc["c"]]
        ways = [str(way) for way in doc["w"]]
    except (ValueError, TypeError, KeyError):
        return None  # not what rlocks writes: no accusation
    if not cycle or any(edge is None for edge in cycle) or len(ways) != len(cycle):
        return None
    edges = [edge for edge in cycle if edge is not None]
    if edges[0] != mine:
        return None  # another wait's (or another primitive's) accusation
    held = yield from _confirm(det, edges, ways)
    if held is None:
        return None  # a member left since: no cycle any more
    victim = _victim(edges)
    if victim is None or victim.owner != det.owner:
        return None
    return _error(det, _describe(det.namespace, edges, held))


def _walk(
    det: _Wait, mine: Edge
) -> Generator[Tuple[Any, ...], Any, Optional[Tuple[List[Edge], List[str]]]]:
    """Depth first from ``mine``: the edges of a cycle back to ``det.owner`` (``mine``
    first; each edge's waiter is blocked by the next edge's owner, the last's by the
    checker) and how each is blocked (see :func:`_blockers`), or ``None``."""
    seen = {det.owner}
    # (path, ways): ways[i] is how path[i + 1]'s owner blocks path[i]'s waiter
    stack: List[Tuple[List[Edge], List[str]]] = [([mine], [])]
    while stack and len(seen) < MAX_OWNERS:
        path, ways = stack.pop()
        tip = path[-1]
        for holder, way in (yield from _blockers(tip)).items():
            if holder == tip.owner:
                continue  # a writer reading its own lock, say: not a wait
            if holder == det.owner:
                return path, ways + [way]
            if holder in seen:
                continue  # reachable from here iff it was from there: explored already
            seen.add(holder)
            edge = Edge.parse(holder, (yield ("GET", wait_key(det.namespace, holder))))
            if edge is not None:
                stack.append((path + [edge], ways + [way]))
    return None


def _confirm(
    det: _Wait, cycle: Sequence[Edge], ways: Sequence[str]
) -> Generator[Tuple[Any, ...], Any, Optional[List[str]]]:
    """Whether every hold or place ahead, then every edge, of ``cycle`` is still what
    the walk read (``ways``): how each edge's waiter is blocked (by the next owner), or
    ``None``."""
    owners = [edge.owner for edge in cycle[1:]] + [det.owner]
    held: List[str] = []
    for edge, holder, way in zip(cycle, owners, ways):
        now = (yield from _blockers(edge)).get(holder)
        # a hold may have changed side (still a hold since: see the module docstring);
        # a place ahead must be the same place
        if now is None or (now[0] == "q" or way[0] == "q") and now != way:
            return None
        held.append(now)
    for edge in cycle[1:]:  # the checker's own edge is its own: it is waiting
        raw = yield ("GET", wait_key(det.namespace, edge.owner))
        if Edge.parse(edge.owner, raw) != edge:
            return None
    return held


def _name(namespace: str, key: str, side: str) -> str:
    """``RLock 'a'`` / ``RWLock 'b' (read)`` for a primitive's hash key and a side (a
    place ahead in its queue, ``q <side> ...``, is described as such)."""
    if side[0] == "q":
        return f"a place ahead in the queue of {_name(namespace, key, side.split()[1])}"
    parsed = parse_key(key, namespace)
    kind, name = parsed if parsed is not None else ("?", key)
    if side == "x":
        return f"{'RLock' if kind == 'rlock' else kind} {shown(name)}"
    return f"RWLock {shown(name)} ({'read' if side == 'r' else 'write'})"


def _describe(
    namespace: str, cycle: Sequence[Edge], held: Sequence[str]
) -> Tuple[Tuple[str, str, str], ...]:
    """``(owner, holds, waits_for)`` for each owner of ``cycle``, starting with the checker:
    edge ``i``'s waiter is blocked by the owner of edge ``i + 1`` (``held[i]``: a hold of
    that side, or its place ahead in the queue)."""
    return tuple(
        (
            edge.owner,
            _name(namespace, cycle[i - 1].key, held[i - 1]),
            _name(namespace, edge.key, edge.side),
        )
        for i, edge in enumerate(cycle)
    )


def drop_edge(det: _Wait) -> Tuple[Any, ...]:
    """The command that deletes ``det``'s edge and any accusation of it (its wait ended;
    one slot: both are tagged by the owner)."""
    return ("DEL", wait_key(det.namespace, det.owner), accuse_key(det.namespace, det.owner))


class Detector:
    """The deadlock checks of one blocking acquire: :meth:`check` when due (each a few
    reads), :meth:`end` when the wait is over (drops its edge)."""

    __slots__ = ("backend", "wait", "gate", "until")

    def __init__(self, p: Any, owner: str, until: Optional[float]) -> None:
        self.backend = p._backend
        self.gate, self.until = p._gate(), until  # its reads share the waiters' bound
        side = p._spec.side
        self.wait = _Wait(p._namespace, owner, side, p._keys.hash, p._deadlock_timeout,
                          monotonic() - p._deadlock_timeout, p._describe(), p._name,
                          "+" if p._fair else "-", owner in p._restoring)
        self.wait.due = monotonic()

    def check(self) -> Generator[Any, Any, None]:
        if monotonic() < self.wait.due:
            return
        try:
            error = yield from self._reads(check(self.wait))
        except RedisError as exc:  # a failed check finds nothing; the next one may
            log.debug("deadlock check of %s failed: %r", self.wait.owner, exc)
            self.wait.due = monotonic() + self.wait.timeout
            return
        if error is not None:
            raise error

    def end(self) -> Generator[Any, Any, None]:
        if self.wait.seq is None:
            return
        try:
            yield Read(self.backend, drop_edge(self.wait))
        except BaseException:  # noqa: BLE001 - the edge ends with its lease
            pass

    def _reads(self, reads: Reads) -> Generator[Any, Any, Any]:
        value: Any = None
        error: Optional[BaseException] = None
        while True:
            try:
                command = reads.throw(error) if error is not None else reads.send(value)
            except StopIteration as done:
                return done.value
            value, error = None, None
            try:
                value = yield Read(self.backend, command, self.gate, self.until)
            except NoScriptError as exc:
                error = exc
