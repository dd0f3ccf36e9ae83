"""The checker: reads a run's history and decides whether rlocks kept its promises.

It knows only the events (see ``worker`` and ``nemesis``), the fenced store's log and the
run's parameters. A *hold* is what the user saw: from an acquire that starts it returning
True to the ``release()`` call that ends it (a Condition's ``wait`` ends one hold when
called and starts another on return); a worker killed while holding holds until it was
reaped. A hold is *told* lost once its holder learned it: ``LockLostError`` from a
release, a re-entry or an acquire of its thread, ``owned()`` False inside it, or
``on_lost`` while it was its process's only hold of the primitive (or soon after a
release of it cut short by a cancel or an error returned), or its release failing on
the link, unanswered, while a fault was felt (its fate unknown: it may have been lost).

Rules (the issue's numbering):

1. ``exclusion``: two holds of an RLock, of a Condition's lock, or a writer and any other
   holder of an RWLock, by different threads, never overlap unless one was told lost;
2. ``permits``: never more than ``permits`` untold holds of a semaphore at once;
   ``bounded``: a BoundedSemaphore refuses every release of nobody's permit;
3. (readers/writers: rule 1 for the write side);
4. ``token-order``: a hold granted after another returned has a larger token, and no two
   holds share one; ``fence``: the fenced store refuses no write of an untold hold and
   never accepts a write of an earlier grant after one of a later grant;
5. ``untold-loss``: of two overlapping holds, the one that began first was told lost
   (unless a failover forked their grants: the later one's token is smaller, and which
   one the surviving server kept cannot be told from the order they returned in);
6. ``stall``: once the faults are over (each fault's end, plus its ``recover``), a
   primitive that could serve a waiting thread serves one within ``bound`` seconds;
   ``fifo`` (fair primitives): a waiter is not served after one that asked more than
   ``eps`` later while it waits on for more than ``eps`` (but for a thread's first call
   of a primitive, whose arrival is unknown); ``notify``: a notification
   reaches (a ``wait`` returns True) as many of the threads waiting when it was sent as
   it was for, within ``notify_bound``; ``hung``: every worker stops when told;
7. ``false-loss``: no hold is told lost, and no ``on_lost`` comes for a hold that was not
   lost, unless a fault touched the holder or the servers from one ttl before the hold
   to the telling; ``error``: no call fails outside the faults' reach.

8. (Barrier) ``barrier-early``, ``barrier-count``, ``barrier-slow``: see :func:`_barrier`.

Each violation names the rule, the time, and the holds or events involved.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Params", "Hold", "Report", "check", "load"]

INF = math.inf
EXCLUSIVE = ("rlock", "lock", "cond")  # every hold excludes every other
CUT_TELLS = 1.0  # s after a release cut short returns in which its on_lost tells its hold
PERMITS = ("sem", "bsem")


@dataclass(frozen=True)
class Params:
    ttl: float  # the longest ttl of the run's objects
    entry_lease: float
    permits: int
    fair: bool = True
    slack: float = 1.5  # added to ttl + entry_lease for ``stall``
    eps: float = 0.3  # FIFO: arrivals closer than this are not ordered
    notify_bound: float = 6.0
    parties: int = 3  # the Barrier's (workload.PARTIES)

    @property
    def bound(self) -> float:
        return self.ttl + self.entry_lease + self.slack


@dataclass
class Hold:
    id: str
    kind: str
    side: str
    worker: str
    thread: str
    inv: float  # when it was asked for
    start: float  # when the user had it
    end: float = INF  # when the user gave it up (release called), or died
    token: Optional[int] = None
    told: Optional[float] = None
    how: str = ""
    cut: float = -INF  # when a release that did not finish (cancelled, error) returned

    @property
    def owner(self) -> Tuple[str, str]:
        return (self.worker, self.thread)

    def tell(self, t: float, how: str) -> None:
        if self.told is None or t < self.told:
            self.told, self.how = t, how

    def brief(self) -> str:
        told = f", told {self.how} at {self.told:.3f}" if self.told is not None else ""
        end = "open" if self.end == INF else f"{self.end:.3f}"
        return (f"{self.id} ({self.kind}/{self.side}, token {self.token}) "
                f"{self.start:.3f}-{end}{told}")


@dataclass
class Waited:
    """An outermost acquire: a thread waiting from ``inv`` to ``ret``."""

    kind: str
    side: str
    worker: str
    thread: str
    inv: float
    ret: float
    outcome: str


@dataclass
class Fault:
    kind: str
    target: Optional[str]
    inv: float
    ret: float
    recover: float = 0.0

    @property
    def until(self) -> float:
        return self.ret + self.recover


@dataclass
class Violation:
    rule: str
    t: float
    kind: str
    detail: str


@dataclass
class Report:
    violations: List[Violation] = field(default_factory=list)
    stats: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, rule: str, t: float, kind: str, detail: str) -> None:
        self.violations.append(Violation(rule, t, kind, detail))

    def to_json(self) -> Dict[str, Any]:
        return {"ok": self.ok, "violations": [asdict(v) for v in self.violations],
                "stats": self.stats}

    def summary(self, limit: int = 20) -> str:
        lines = [f"{len(self.violations)} violation(s)"]
        by_rule: Dict[str, int] = defaultdict(int)
        for v in self.violations:
            by_rule[v.rule] += 1
        if by_rule:
            lines.append("by rule: " + ", ".join(f"{r} {n}" for r, n in sorted(by_rule.items())))
        for v in self.violations[:limit]:
            lines.append(f"  [{v.rule}] t={v.t:.3f} {v.kind}: {v.detail}")
        if len(self.violations) > limit:
            lines.append(f"  ... {len(self.violations) - limit} more")
        s = self.stats
        if s:
            lines.append(f"sections: {s.get('sections')}")
            lines.append(f"faults: {s.get('faults')}")
            lines.append(f"told lost: {s.get('told')}; false losses: {s.get('false_losses')}; "
                         f"errors: {s.get('errors')}")
            lines.append(f"longest stall: {s.get('longest_stall')}")
        return "\n".join(lines)


def load(folder: str) -> List[Dict[str, Any]]:
    """Every event of a run's folder: the workers' and the nemesis' files, in file order
    (each thread's events are in the order they happened)."""
    events: List[Dict[str, Any]] = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short by a SIGKILL
    return events


class _History:
    """The holds, waits, notifications and faults an event list describes."""

    def __init__(self, events: Iterable[Dict[str, Any]]) -> None:
        self.holds: Dict[str, Hold] = {}
        self._open: Dict[Tuple[str, str, str], List[Hold]] = defaultdict(list)
        self.waits: List[Waited] = []
        self.cond_waits: List[Dict[str, Any]] = []
        self.notifies: List[Dict[str, Any]] = []
        self.writes: List[Dict[str, Any]] = []
        self.on_lost: List[Dict[str, Any]] = []
        self.spurious: List[Dict[str, Any]] = []
        self.errors: List[Dict[str, Any]] = []
        self.faults: List[Fault] = []
        self.hung: List[Dict[str, Any]] = []
        self.failed_releases: List[Tuple[str, float]] = []  # (hold, when its release failed)
        self.barrier_calls: List[Dict[str, Any]] = []
        self.barrier_waits: List[Dict[str, Any]] = []
        self.barrier_passes: List[Dict[str, Any]] = []
        self.workers: Dict[str, Dict[str, float]] = defaultdict(dict)
        self.last = 0.0
        for ev in events:
            self._add(ev)
        killed = {f.target: f.ret for f in self.faults if f.kind == "kill_worker"}
        for hung in self.hung:
            killed.setdefault(hung["target"], hung["t"])
        for hold in self.holds.values():
            if hold.end == INF and hold.worker in killed:
                hold.end = killed[hold.worker]
        self.faults.sort(key=lambda f: f.inv)

    def _thread_holds(self, ev: Dict[str, Any]) -> List[Hold]:
        """The thread's holds of the event's primitive not given up yet."""
        mine = self._open.get((ev["w"], ev["th"], ev["p"]), [])
        mine[:] = [h for h in mine if h.end == INF]
        return mine

    def _start(self, hold: Hold) -> None:
        self.holds[hold.id] = hold
        self._open[(hold.worker, hold.thread, hold.kind)].append(hold)

    def _add(self, ev: Dict[str, Any]) -> None:
        a = ev["a"]
        for key in ("ret", "t", "inv"):
            if key in ev and isinstance(ev[key], (int, float)):
                self.last = max(self.last, ev[key])
                break
        if a == "acquire":
            if ev["d"] == 1:
                self.waits.append(Waited(ev["p"], ev["s"], ev["w"], ev["th"], ev["inv"],
                                         ev["ret"], ev["o"]))
            if ev["o"] == "ok" and ev["new"]:
                self._start(Hold(ev["h"], ev["p"], ev["s"], ev["w"], ev["th"], ev["inv"],
                                 ev["ret"], token=ev.get("tok")))
            elif ev["o"] == "lost":
                held = self.holds.get(ev["h"])
                if held is not None and not ev["new"]:
                    held.tell(ev["ret"], "re-entry")
                for hold in self._thread_holds(ev):
                    if ev["p"] in PERMITS:  # a thread's permits are lost together
                        hold.tell(ev["ret"], "acquire")
            elif ev["o"] == "error":
                self.errors.append(ev)
        elif a in ("release_call", "wait_call"):
            hold = self.holds.get(ev["h"])
            if hold is not None:
                hold.end = ev["inv"]
        elif a == "release":
            if ev["o"] == "lost":
                hold = self.holds.get(ev["h"])
                if hold is not None:
                    hold.tell(ev["ret"], "release")
                if ev["p"] in PERMITS:
                    for other in self._thread_holds(ev):
                        other.tell(ev["ret"], "release")
            elif ev["o"] in ("error", "refused"):
                self.errors.append(ev)
            if ev["o"] in ("error", "cancelled") and ev["h"] in self.holds:
                self.holds[ev["h"]].cut = ev["ret"]
            if ev["o"] == "error" and ev.get("end") and ev["h"] in self.holds:
                self.failed_releases.append((ev["h"], ev["ret"]))
        elif a == "owned":
            if ev["o"] == "false":
                hold = self.holds.get(ev["h"])
                if hold is not None and hold.end >= ev["t"]:
                    hold.tell(ev["t"], "owned")
        elif a == "wait":
            self.cond_waits.append(ev)
            if ev["o"] in ("ok", "false"):
                self._start(Hold(ev["new"], ev["p"], "x", ev["w"], ev["th"], ev["inv"],
                                 ev["ret"], token=ev.get("tok")))
            else:
                if ev["o"] == "lost":
                    old = self.holds.get(ev["h"])
                    if old is not None:
                        old.tell(ev["ret"], "wait")
                else:
                    self.errors.append(ev)
        elif a == "notify":
            self.notifies.append(ev)
        elif a == "write":
            self.writes.append(ev)
            if ev["o"] == "error":
                self.errors.append(ev)
        elif a == "on_lost":
            self.on_lost.append(ev)
        elif a == "spurious":
            self.spurious.append(ev)
            if ev["o"] == "error":
                self.errors.append(ev)
        elif a == "bwait_call":
            self.barrier_calls.append(ev)
        elif a == "bwait":
            self.barrier_waits.append(ev)
            if ev["o"] not in ("ok", "broken"):
                self.errors.append(dict(ev, p="barrier"))
        elif a == "bpass":
            self.barrier_passes.append(ev)
        elif a == "breset":
            if ev["o"] != "ok":
                self.errors.append(dict(ev, p="barrier"))
        elif a == "error":
            self.errors.append(ev)
        elif a == "fault":
            self.faults.append(Fault(ev["k"], ev.get("target"), ev["inv"], ev["ret"],
                                     ev.get("recover", 0.0)))
        elif a == "hung":
            self.hung.append(ev)
        elif a in ("start", "exit"):
            self.workers[ev["w"]][a] = ev["t"]

    # -- fault windows ------------------------------------------------------------------

    def touched(self, worker: Optional[str], t0: float, t1: float) -> Optional[Fault]:
        """A fault whose reach ([inv, ret + recover]) meets [t0, t1] and that touched
        ``worker`` (a fault of the servers or links touches every worker)."""
        for f in self.faults:
            if f.inv > t1:
                break
            if f.until >= t0 and (f.target is None or f.target == worker):
                return f
        return None

    def quiet_since(self, t: float) -> Optional[float]:
        """When the faults before ``t`` were last felt; None while one is felt at ``t``."""
        since = -INF
        for f in self.faults:
            if f.inv > t:
                break
            if f.until >= t:
                return None
            since = max(since, f.until)
        return since


def check(events: Sequence[Dict[str, Any]], params: Params,
          store_log: Sequence[Tuple[str, int, str]] = ()) -> Report:
    """Check a history: ``events`` from :func:`load`, ``store_log`` the fenced store's
    accepted writes in order, as (kind, token, hold)."""
    hist = _History(events)
    report = Report()
    _on_lost(hist, params)  # first: it tells holds, which the rules below read
    _failed_releases(hist)
    _exclusion(hist, params, report)
    _permits(hist, params, report)
    _tokens(hist, report)
    _fence(hist, store_log, report)
    _false_losses(hist, params, report)
    _errors(hist, report)
    longest = _stalls(hist, params, report)
    if params.fair:
        _fifo(hist, params, report)
    _notify(hist, params, report)
    _barrier(hist, params, report)
    for hung in hist.hung:
        report.add("hung", hung["t"], "-", f"worker {hung['target']} did not stop when told")
    report.violations.sort(key=lambda v: v.t)
    _stats(hist, report, longest)
    return report


# -- safety -----------------------------------------------------------------------------------


def _by_kind(hist: _History) -> Dict[str, List[Hold]]:
    grouped: Dict[str, List[Hold]] = defaultdict(list)
    for hold in hist.holds.values():
        grouped[hold.kind].append(hold)
    for holds in grouped.values():
        holds.sort(key=lambda h: h.start)
    return grouped


def _exclusion(hist: _History, params: Params, report: Report) -> None:
    for kind, holds in _by_kind(hist).items():
        if kind in PERMITS:
            continue
        active: List[Hold] = []
        for hold in holds:
            active = [a for a in active if a.end > hold.start]
            for other in active:
                if other.owner == hold.owner:
                    continue
                if kind == "rw" and other.side == "r" and hold.side == "r":
                    continue
                if other.told is None and hold.told is None:
                    report.add("exclusion", hold.start, kind,
                               f"{other.brief()} overlaps {hold.brief()}; neither was told lost")
                elif other.told is None and not _forked(hist, other, hold):
                    report.add("untold-loss", hold.start, kind,
                               f"{other.brief()} was overlapped by {hold.brief()} "
                               f"and never told lost")
            active.append(hold)


def _permits(hist: _History, params: Params, report: Report) -> None:
    for kind, holds in _by_kind(hist).items():
        if kind not in PERMITS:
            continue
        points = sorted([(h.start, 1, h.id) for h in holds if h.told is None]
                        + [(h.end, -1, h.id) for h in holds if h.told is None and h.end < INF],
                        key=lambda p: (p[0], p[1]))
        active: Dict[str, None] = {}
        flagged_until = -INF
        for t, step, hid in points:
            if step < 0:
                active.pop(hid, None)
                continue
            active[hid] = None
            if len(active) > params.permits and t > flagged_until:
                now = [hist.holds[h] for h in active]
                report.add("permits", t, kind,
                           f"{len(active)} untold holds of {params.permits} permits: "
                           + "; ".join(h.brief() for h in now))
                flagged_until = min(h.end for h in now)
    for ev in hist.spurious:
        if ev["p"] == "bsem" and ev["o"] == "ok":
            report.add("bounded", ev["ret"], "bsem",
                       f"a release of nobody's permit by {ev['th']} was accepted")


def _forked(hist: _History, first: Hold, later: Hold) -> bool:
    """Whether a failover forked the grants of ``first`` and ``later``: ``later``'s token
    is smaller, so the server that granted it had not seen ``first``'s grant. Which of the
    two the surviving server kept, and so which one was lost, the order they returned in
    cannot tell (either may be); rule 1 still asks that one was told."""
    return (first.token is not None and later.token is not None and later.token < first.token
            and _failover_between(hist, first.start, later.start))


def _failover_between(hist: _History, t0: float, t1: float) -> bool:
    return any(f.kind in ("failover", "failover_force", "kill_master")
               and f.inv <= t1 and f.until >= t0 for f in hist.faults)


def _tokens(hist: _History, report: Report) -> None:
    for kind, holds in _by_kind(hist).items():
        tokened = [h for h in holds if h.token is not None]
        seen: Dict[int, Hold] = {}
        for hold in tokened:
            first = seen.setdefault(hold.token, hold)  # type: ignore[arg-type]
            if first is not hold and not _failover_between(hist, first.start, hold.start):
                report.add("token-order", hold.start, kind,
                           f"{first.brief()} and {hold.brief()} share a token")
        # A hold that returned before another was asked for was granted first, so its
        # token is smaller: sweep the holds by start, asking at each one's ``inv`` for the
        # largest token returned before it.
        by_start = sorted(tokened, key=lambda h: h.start)
        starts = [h.start for h in by_start]
        best: List[Hold] = []
        for hold in by_start:
            best.append(hold if not best or hold.token > best[-1].token else best[-1])  # type: ignore[operator]
        for hold in tokened:
            i = bisect.bisect_left(starts, hold.inv)
            if i == 0:
                continue
            top = best[i - 1]
            if top.token >= hold.token and not _failover_between(hist, top.start, hold.start):  # type: ignore[operator]
                report.add("token-order", hold.start, kind,
                           f"{hold.brief()} was asked for after {top.brief()} returned, "
                           f"yet its token is not larger")


def _fence(hist: _History, store_log: Sequence[Tuple[str, int, str]], report: Report) -> None:
    for ev in hist.writes:
        hold = hist.holds.get(ev["h"])
        if ev["o"] == "refused" and hold is not None and hold.told is None \
                and not _failover_between(hist, hold.start - 60.0, hold.start):
            # (Not after a failover: one that loses the counter's last increments may
            # repeat a token, a documented limit of fencing on a replicated primary.)
            report.add("fence", ev["ret"], ev["p"],
                       f"the fenced store refused token {ev['tok']} of {hold.brief()}, "
                       f"which was never told lost")
    last: Dict[str, Tuple[int, str]] = {}
    for kind, token, hid in store_log:
        if kind in last and last[kind][1] != hid:
            before = hist.holds.get(last[kind][1])
            now = hist.holds.get(hid)
            if before is not None and now is not None and now.start < before.inv \
                    and not _failover_between(hist, now.start, before.start):
                report.add("fence", now.start, kind,
                           f"a write of {now.brief()} was accepted after one of "
                           f"{before.brief()}, which was granted later")
        last[kind] = (token, hid)


def _on_lost(hist: _History, params: Params) -> None:
    """Give each ``on_lost`` to the hold it tells of; one with no lost hold is false."""
    per: Dict[Tuple[str, str], List[Hold]] = defaultdict(list)
    for hold in hist.holds.values():
        per[(hold.worker, hold.kind)].append(hold)
    for ev in hist.on_lost:
        t = ev["t"]
        holds = per[(ev["w"], ev["p"])]
        active = [h for h in holds if h.start <= t <= h.end]
        if len(active) == 1 or (active and ev["p"] in EXCLUSIVE):
            for hold in active:
                hold.tell(t, "on_lost")
            continue
        if active:
            continue  # several holders in the process: it cannot say whose
        # A release cut short (cancelled, failed) still settles the hold after it returns,
        # and a loss it finds is told by on_lost only (it raised something else).
        cut = [h for h in holds if h.end <= t <= h.cut + CUT_TELLS and h.told is None]
        if len(cut) == 1:
            cut[0].tell(t, "on_lost")
            continue
        recent = [h for h in holds if t - params.ttl - 1.0 <= h.end <= t]
        if any(h.told is not None for h in recent):
            continue  # a late callback of a loss already told
        ev["false"] = True


def _failed_releases(hist: _History) -> None:
    """A release that failed on the link, unanswered, while a fault was felt (outside one,
    ``error`` is a violation of its own) tells its holder the hold's fate is unknown: it
    may have been lost (a failover may have dropped a grant the promoted replica never
    had; the release met the dead master). The library says so where it knows more:
    LockLostError once the hold's lease has ended."""
    for hid, t in hist.failed_releases:
        hold = hist.holds[hid]
        if hist.touched(hold.worker, hold.start, t) is not None:
            hold.tell(t, "release error")


def _false_losses(hist: _History, params: Params, report: Report) -> None:
    for hold in hist.holds.values():
        if hold.told is None:
            continue
        if hist.touched(hold.worker, hold.inv - params.ttl, hold.told) is None:
            report.add("false-loss", hold.told, hold.kind,
                       f"{hold.brief()} was told lost ({hold.how}) with no fault near it")
    for ev in hist.on_lost:
        if ev.get("false") and hist.touched(ev["w"], ev["t"] - 2 * params.ttl - 1.0,
                                            ev["t"]) is None:
            report.add("false-loss", ev["t"], ev["p"],
                       f"on_lost in {ev['w']} ({ev['obj']}) with no lost hold and no fault near it")


def _errors(hist: _History, report: Report) -> None:
    for ev in hist.errors:
        t0 = ev.get("inv", ev.get("t", 0.0))
        t1 = ev.get("ret", t0)
        if hist.touched(ev["w"], t0 - 1.0, t1) is None:
            report.add("error", t1, ev.get("p", "-"),
                       f"{ev['a']} by {ev.get('th')} ended {ev['o']}: {ev.get('x')} "
                       f"{ev.get('msg', '')}")


# -- liveness ---------------------------------------------------------------------------------


def _waits(hist: _History) -> Dict[str, List[Waited]]:
    """Each primitive's waits, but those of a worker stopped or killed while waiting."""
    grouped: Dict[str, List[Waited]] = defaultdict(list)
    for w in hist.waits:
        f = hist.touched(w.worker, w.inv, w.ret)
        if f is not None and f.target is not None:
            continue
        grouped[w.kind].append(w)
    return grouped


def _stalls(hist: _History, params: Params, report: Report) -> Dict[str, Any]:
    """A stall: a primitive that could serve a waiting thread serves nobody (no untold
    hold of the kind that blocks it)."""
    waits = _waits(hist)
    longest: Dict[str, Any] = {"seconds": 0.0}
    by_kind = _by_kind(hist)
    for kind in sorted(set(by_kind) | set(waits)):
        holds = by_kind.get(kind, [])
        points: List[Tuple[float, int, str, int]] = []  # (t, order, what, +1/-1)
        for h in holds:
            if h.told is None:
                points.append((h.start, 1, "hold", 1))
                if h.end < INF:
                    points.append((h.end, 0, "hold", -1))
        for w in waits.get(kind, []):
            if w.ret - w.inv < 1e-3:
                continue
            points.append((w.inv, 1, "wait", 1))
            points.append((w.ret, 0, "wait", -1))
        points.sort()
        capacity = params.permits if kind in PERMITS else 1
        held = waiting = 0
        stall_from: Optional[float] = None
        for t, _order, what, step in points:
            if what == "hold":
                held += step
            else:
                waiting += step
            stalled = waiting > 0 and held < capacity
            if stalled and stall_from is None:
                stall_from = t
            elif not stalled and stall_from is not None:
                _stall(hist, params, report, kind, stall_from, t, longest)
                stall_from = None
    return longest


def _stall(hist: _History, params: Params, report: Report, kind: str, s: float, e: float,
           longest: Dict[str, Any]) -> None:
    """Judge one stall [s, e]: no stretch of it out of every fault's reach may last
    longer than ``bound``."""
    if e - s > longest["seconds"]:
        longest.update(seconds=round(e - s, 3), kind=kind, start=round(s, 3), end=round(e, 3))
    if e - s <= params.bound:
        return
    free_from, gap = s, 0.0
    for f in hist.faults:
        if f.inv > e:
            break
        if f.until < free_from:
            continue
        gap = max(gap, f.inv - free_from)
        free_from = max(free_from, f.until)
    gap = max(gap, e - free_from)
    if gap <= params.bound:
        return
    report.add("stall", e, kind,
               f"nobody was served from {s:.3f} to {e:.3f} ({e - s:.2f} s), "
               f"{gap:.2f} s of it out of every fault's reach (bound {params.bound:.2f} s)")


def _fifo(hist: _History, params: Params, report: Report) -> None:
    for kind, waits in _waits(hist).items():
        waits = sorted(waits, key=lambda w: w.inv)
        invs = [w.inv for w in waits]
        # A thread's first call of a kind has no known arrival: before it reaches the
        # queue, a fresh process connects (on a cluster, reads the slot map and connects
        # to each master), loads the scripts and starts its subscriber, which a loaded
        # machine stretches well past eps. So it is never the earlier one of a judgment.
        first: Dict[Tuple[str, str], Waited] = {}
        for w in waits:
            first.setdefault((w.worker, w.thread), w)
        for later in waits:
            if later.outcome != "ok":
                continue
            lo = bisect.bisect_left(invs, later.inv - 30.0)
            hi = bisect.bisect_left(invs, later.inv - params.eps)
            for earlier in waits[lo:hi]:
                if (earlier.ret <= later.ret + params.eps
                        or first[earlier.worker, earlier.thread] is earlier):
                    continue
                if kind == "rw" and earlier.side == "r" and later.side == "r":
                    continue
                if (earlier.worker, earlier.thread) == (later.worker, later.thread):
                    continue
                if hist.touched(None, earlier.inv, later.ret) is not None:
                    continue
                if any(hist.touched(w.worker, earlier.inv, later.ret) is not None
                       for w in (earlier, later)):
                    continue
                report.add("fifo", later.ret, kind,
                           f"{later.thread} asked at {later.inv:.3f} and was served at "
                           f"{later.ret:.3f}, before {earlier.thread}, waiting since "
                           f"{earlier.inv:.3f} (until {earlier.ret:.3f}, {earlier.outcome})")
                break


def _notify(hist: _History, params: Params, report: Report) -> None:
    waits = hist.cond_waits
    consumed: set = set()
    holds = hist.holds
    for n in sorted(hist.notifies, key=lambda e: e["inv"]):
        hold = holds.get(n["h"])
        if hold is None:
            continue
        deadline = n["ret"] + params.notify_bound
        if deadline > hist.last:
            continue  # the run ended before it could be judged
        eligible = [w for w in waits if id(w) not in consumed and w["inv"] < hold.start
                    and w["ret"] > n["inv"] and w["inv"] + w["to"] > n["ret"] + params.eps]
        if not eligible:
            continue
        want = len(eligible) if n["n"] == 0 else min(n["n"], len(eligible))
        woken = sorted((w for w in eligible if w["o"] == "ok" and w["ret"] <= deadline),
                       key=lambda w: w["ret"])[:want]
        consumed.update(id(w) for w in woken)
        if len(woken) >= want:
            continue
        first = min(w["inv"] for w in eligible)
        if hist.touched(None, first, deadline) is not None or any(
                hist.touched(w["w"], first, deadline) is not None for w in eligible + [n]):
            continue
        report.add("notify", n["ret"], "cond",
                   f"notify(n={n['n'] or 'all'}) by {n['th']} at {n['inv']:.3f} woke "
                   f"{len(woken)} of the {want} it was for; waiting then: "
                   + ", ".join(f"{w['th']} ({w['inv']:.3f}-{w['ret']:.3f} {w['o']})"
                               for w in eligible))


#: Faults after which Redis may have lost writes a party was answered from (an
#: asynchronous replica promoted; a restart, without persistence): a generation may then
#: pass again with arrivals a lost pass had answered, as a lock's grant may be forked.
LOSES_WRITES = ("failover", "failover_force", "kill_master", "restart")


def _barrier(hist: _History, params: Params, report: Report) -> None:
    """The action records each generation's pass, run by the party that arrived last,
    in its wait, before any wait of the generation returns. A pass *took* when that wait
    returned True (else the generation may have broken after its action: a reset, a
    party gone, the pass's call lost with the link).

    ``barrier-early``: the j-th pass that took needs j x ``parties`` waits called before
    it that could have arrived for it (a wait of a generation that passed returns True,
    or fails on the link, or never returns: killed, or cut off by the run's end);
    ``barrier-count``: by any moment, no more waits returned True than ``parties`` x the
    actions run, each with an index below ``parties``;
    ``barrier-slow``: a wait returns within its timeout plus ``bound`` unless a fault
    (of any worker: a stopped party holds up every other) was felt meanwhile.

    The counts start again after each fault that may lose writes (``LOSES_WRITES``): from
    its reach's end ``e`` on, only waits still alive at ``e`` or called after it count (a
    wait that failed on the link, until its lease would have ended),
    and at most the waits alive at ``e`` may return once more than the actions after it
    allow; passes and returns within its reach are not judged."""
    n = params.parties
    ended = {(ev["w"], ev["th"], ev["inv"]): ev for ev in hist.barrier_waits}
    windows = sorted((f.inv, f.until) for f in hist.faults if f.kind in LOSES_WRITES)
    calls = []  # (inv, ret or INF, outcome)
    runs: Dict[Tuple[str, Any], List[Tuple[float, str]]] = defaultdict(list)
    for c in hist.barrier_calls:
        done = ended.get((c["w"], c["th"], c["inv"]))
        o = "unknown" if done is None else done["o"]
        if o == "broken" and any(inv <= done["ret"] and until >= c["inv"]
                                 for inv, until in windows):
            # Its generation may have passed before Redis lost the outcome it had not
            # collected yet (a restart without persistence, a failover): it then hears
            # "broken" for a wait that did arrive.
            o = "unknown"
        # A wait that failed on the link may have left its arrival in Redis (its break
        # could not be sent): it counts until its lease ends.
        until = INF if done is None else done["ret"] + (
            params.entry_lease + 1.0 if o == "error" else 0.0)
        calls.append((c["inv"], until, o))
        runs[(c["w"], c.get("tid"))].append((c["inv"], o))
    took = []
    for p in hist.barrier_passes:
        mine = runs.get((p["w"], p.get("tid")), [])
        at = bisect.bisect_right(mine, (p["t"], "~")) - 1  # the runner's wait then
        if at >= 0 and mine[at][1] == "ok":
            # (its wait failed on the link, or never returned: whether the pass took is
            # not known, so it is not counted; fewer passes only ask for fewer waits)
            took.append(p["t"])
    took.sort()
    actions = sorted(p["t"] for p in hist.barrier_passes)
    oks = sorted((ev for ev in hist.barrier_waits if ev["o"] == "ok"), key=lambda e: e["ret"])

    def segment(t: float) -> Optional[float]:
        """The start of the segment ``t`` is judged in (-INF: from the first), or None:
        within a fault's reach, not judged."""
        since = -INF
        for inv, until in windows:
            if inv <= t <= until:
                return None
            if until < t:
                since = max(since, until)
        return since

    counted: Dict[float, int] = defaultdict(int)
    for t in took:
        since = segment(t)
        if since is None:
            continue
        counted[since] += 1
        j = counted[since]
        could = sum(1 for inv, ret, o in calls
                    if inv <= t and o != "broken" and (since == -INF or ret > since))
        if could < j * n:
            report.add("barrier-early", t, "barrier",
                       f"generation {j} (since {since:.3f}) passed at {t:.3f} with {could} "
                       f"waits that could have arrived (it needs {j * n})")
    returned: Dict[float, int] = defaultdict(int)
    for ev in oks:
        since = segment(ev["ret"])
        if since is None:
            continue
        returned[since] += 1
        alive = 0 if since == -INF else sum(1 for inv, ret, _ in calls
                                            if inv <= since < ret)
        passed = sum(1 for t in actions if since < t <= ev["ret"])
        if returned[since] > n * passed + alive:
            report.add("barrier-count", ev["ret"], "barrier",
                       f"{returned[since]} waits returned by {ev['ret']:.3f} "
                       f"({ev['w']}.{ev['th']} the last), but {passed} actions had run")
        if not (isinstance(ev.get("idx"), int) and 0 <= ev["idx"] < n):
            report.add("barrier-count", ev["ret"], "barrier",
                       f"{ev['w']}.{ev['th']}'s wait returned index {ev.get('idx')!r}")
    timeouts = {(c["w"], c["th"], c["inv"]): c.get("to", 0.0) for c in hist.barrier_calls}
    for ev in hist.barrier_waits:
        spent = ev["ret"] - ev["inv"]
        if spent <= timeouts.get((ev["w"], ev["th"], ev["inv"]), 0.0) + params.bound:
            continue
        if any(f.inv <= ev["ret"] and f.until >= ev["inv"] for f in hist.faults):
            continue
        report.add("barrier-slow", ev["ret"], "barrier",
                   f"{ev['w']}.{ev['th']}'s wait took {spent:.3f} s with no fault near it")


def _stats(hist: _History, report: Report, longest: Dict[str, Any]) -> None:
    sections: Dict[str, int] = defaultdict(int)
    told: Dict[str, int] = defaultdict(int)
    for hold in hist.holds.values():
        sections[hold.kind] += 1
        if hold.told is not None:
            told[hold.kind] += 1
    if hist.barrier_passes:
        sections["barrier"] = len(hist.barrier_passes)  # actions run (generations)
    faults: Dict[str, int] = defaultdict(int)
    for f in hist.faults:
        faults[f.kind] += 1
    report.stats = {
        "sections": dict(sections),
        "told": dict(told),
        "faults": dict(faults),
        "waits": len(hist.waits),
        "timeouts": sum(1 for w in hist.waits if w.outcome == "false"),
        "notifies": len(hist.notifies),
        "false_losses": sum(1 for v in report.violations if v.rule == "false-loss"),
        "errors": len(hist.errors),
        "longest_stall": longest,
        "workers": len(hist.workers),
    }
