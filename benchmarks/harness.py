"""Shared machinery: run parameters, progress display, interleaved timing, and the
multi-process "chain" runner that sections 3, 4 and 6 are built on."""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import redis

from .adapters import Adapter, get_adapter
from .stats import jain, longest_wait, summary
from .workers import ChainConfig, chain_process, drain


@dataclass(frozen=True)
class Params:
    """Counts and durations.  Every loop in the suite is bounded by one of these."""

    floor_rounds: int = 10
    floor_batch: int = 300
    #: the bare BLPOP/LPUSH hand-off between two processes, the floor of every hand-off ratio
    floor_handoff_s: float = 4.0
    floor_handoff_max: int = 150
    unc_rounds: int = 10
    unc_batch: int = 100
    #: wall-clock cap for one library's batch in the interleaved loops
    batch_cap_s: float = 1.0
    handoff_max: int = 300
    handoff_duration_s: float = 12.0
    handoff_hold_ms: Tuple[float, float] = (2.0, 12.0)
    #: one contended run; the section runs every library ``contended_runs`` times
    contended_duration_s: float = 3.0
    #: each contended figure is the median of this many runs per library (issue 38)
    contended_runs: int = 3
    many_count: int = 10_000
    #: acquires of one lock at a time (distinct names, each released at once), timed before
    #: and after the N locks are held, and again while they are held (issue 38: N held vs 1)
    many_single: int = 200
    #: a released name must leave no key after this many seconds (issue 38)
    many_keys_after_s: float = 1.0
    many_window_s: float = 6.0
    #: ttl rlocks is built with in the many-locks section, so renewal lands inside the window
    many_rlocks_ttl: float = 5.0
    many_peer_window_s: float = 2.0
    #: portalocker holds a connection and a thread per lock, and releases in ~0.1 s each
    many_portalocker_cap: int = 200
    scale_procs: Tuple[int, ...] = (1, 2, 4, 8)
    scale_threads: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    scale_duration_s: float = 1.0
    scale_max_ops: int = 1000
    scale_hold_ms: Tuple[float, float] = (2.0, 6.0)
    conn_threads: int = 64
    rw_duration_s: float = 4.0
    #: live holders (distinct owners, held elsewhere) of a Semaphore and an RWLock read side
    holders_count: int = 1000
    #: ttl of those holds (rlocks' default).  Shorter was not honest with the engine before
    #: the lean core (its scripts read the whole hash: 2,000 holds renewed every 2 s kept
    #: the server saturated and the holds expired, seen at ttl=6 s under load)
    holders_ttl: float = 30.0
    #: the renewal window is this many ttl/3 periods long (a whole number of periods, so
    #: every periodic renewal lands in it the same number of times whatever its phase)
    holders_periods: int = 2
    #: helper processes the live holders are spread over.  One: with 4 taking their holds
    #: in parallel against the old engine's whole-hash scripts, on a loaded 2-core machine,
    #: the server stalled past the clients' socket timeout
    holders_procs: int = 1
    rounds: int = 2

    @classmethod
    def quick(cls) -> "Params":
        return cls(floor_rounds=3, floor_batch=300, many_portalocker_cap=20, unc_rounds=3,
                   unc_batch=30,
                   batch_cap_s=0.5, handoff_max=40, handoff_duration_s=2.5,
                   contended_duration_s=0.7, many_count=1000, many_single=60,
                   many_window_s=3.0,
                   many_rlocks_ttl=2.5, many_peer_window_s=0.5, scale_procs=(1, 8),
                   scale_threads=(64,), scale_duration_s=0.5, scale_max_ops=200,
                   rw_duration_s=1.0, floor_handoff_s=1.5, floor_handoff_max=40,
                   holders_periods=1, rounds=1)


class Progress:
    """One-line progress on stderr (rewritten in place on a terminal, one line per step in a
    log), so the table on stdout stays clean."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.section = ""

    def set_section(self, name: str) -> None:
        self.section = name
        self.step("starting")

    def step(self, msg: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.monotonic() - self.t0:6.1f}s] {self.section}: {msg}"
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@dataclass
class Context:
    url: str
    params: Params
    quick: bool
    progress: Progress
    client: redis.Redis
    adapters: List[Adapter]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    ping_p50_ns: float = math.nan
    #: p50 of a trivial EVALSHA (``return 1``), set by the floor section
    evalsha_p50_ns: float = math.nan
    #: bare BLPOP/LPUSH hand-off between two processes (floor section), p50 and p99
    blpop_p50_ns: float = math.nan
    blpop_p99_ns: float = math.nan
    #: keys this run created, removed at the end (the server may be the user's)
    keys: List[str] = field(default_factory=list)
    #: True when the runner started the server itself (no other client uses it): a
    #: section may then reset its statistics (CONFIG RESETSTAT)
    own_server: bool = False

    def name(self, *parts: object) -> str:
        """A lock/key name unique to this run, so runs never see each other's state."""
        return "rlb:" + self.run_id + ":" + ":".join(str(p) for p in parts)

    def available(self) -> List[Adapter]:
        return [a for a in self.adapters if a.unavailable_reason() is None]

    def unavailable_rows(self, ncols: int) -> List[List[Any]]:
        """Table rows for the libraries that could not be measured, so none go missing."""
        rows = []
        for a in self.adapters:
            reason = a.unavailable_reason()
            if reason is not None:
                rows.append([a.key, f"unavailable: {reason}"] + [""] * (ncols - 2))
        return rows

    def order(self, items: Sequence[Any], round_no: int) -> List[Any]:
        """Interleaving order for one round: rotated and, on odd rounds, reversed, so no
        library always runs first (or last) when the machine is warm (or throttled)."""
        items = list(items)
        if not items:
            return items
        k = round_no % len(items)
        items = items[k:] + items[:k]
        return items[::-1] if round_no % 2 else items


def cleanup_keys(ctx: Context) -> int:
    """Delete every key this run left on the server (a bounded SCAN: the server may be the
    user's, so only names containing this run's ``rlb:<run id>:`` are touched)."""
    c = ctx.client
    n = 0
    batch: List[bytes] = []
    for key in c.scan_iter(match=f"*rlb:{ctx.run_id}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            n += c.delete(*batch)
            batch.clear()
        if n > 500_000:
            break
    if batch:
        n += c.delete(*batch)
    return n


def interleaved(ctx: Context, fns: Dict[str, Callable[[], Any]], rounds: int, batch: int,
                label: str) -> Dict[str, List[int]]:
    """Time every callable ``rounds x batch`` times, one batch per callable per round in a
    shuffled order, so slow drift (thermal, noisy neighbours) is shared by all of them.
    Returns per-call durations in ns.  Each batch stops early past ``params.batch_cap_s``."""
    out: Dict[str, List[int]] = {k: [] for k in fns}
    keys = list(fns)
    rng = random.Random(7)
    clock = time.perf_counter_ns
    for r in range(rounds):
        rng.shuffle(keys)
        ctx.progress.step(f"{label} round {r + 1}/{rounds}")
        for k in keys:
            fn = fns[k]
            cap = time.monotonic() + ctx.params.batch_cap_s
            samples = out[k]
            for _ in range(batch):
                t0 = clock()
                fn()
                samples.append(clock() - t0)
                if time.monotonic() > cap:
                    break
    return out


@dataclass
class ChainOutcome:
    ops: int = 0
    span_s: float = math.nan
    throughput: float = math.nan
    handoff_ns: List[int] = field(default_factory=list)
    per_worker: Dict[str, int] = field(default_factory=dict)
    #: longest single acquire per worker (ns); see ``workers.ThreadResult.max_wait_ns``
    per_worker_max_wait_ns: Dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    errors: List[str] = field(default_factory=list)
    lost_updates: Optional[int] = None
    client_cpu_s: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        h = summary(self.handoff_ns)
        counts = list(self.per_worker.values())
        return {
            "ops": self.ops, "span_s": self.span_s, "ops_per_s": self.throughput,
            "handoff_ns": {k: h[k] for k in ("n", "p50", "p99", "mean", "max")},
            "per_worker_ops": self.per_worker,
            "jain": jain(counts) if counts else math.nan,
            "worker_ops_min": min(counts, default=None),
            "worker_ops_max": max(counts, default=None),
            "longest_wait_ns": longest_wait(self.per_worker_max_wait_ns.values()),
            "timeouts": self.timeouts, "errors": self.errors[:3],
            "lost_updates": self.lost_updates, "client_cpu_s": self.client_cpu_s,
        }


def run_chain(ctx: Context, cfg: ChainConfig, procs: int) -> ChainOutcome:
    """Start ``procs`` spawned worker processes of ``cfg.threads`` threads each, wait for all
    of them to be connected, start them together, and gather what they measured."""
    spawn = mp.get_context("spawn")
    seq = spawn.Value("q", 0)
    stop = spawn.Value("b", 0)
    barrier = spawn.Barrier(procs + 1)
    out_q = spawn.Queue()
    if cfg.counter_key:
        ctx.client.set(cfg.counter_key, 0)
        ctx.keys.append(cfg.counter_key)
    prepare = getattr(get_adapter(cfg.adapter), "prepare", None)
    if prepare is not None:
        prepare(ctx.client, cfg.lock_name)
    ps = [spawn.Process(target=chain_process, args=(cfg, i, seq, stop, barrier, out_q),
                        daemon=True) for i in range(procs)]
    for p in ps:
        p.start()
    outcome = ChainOutcome()
    t_start = time.monotonic_ns()
    try:
        barrier.wait(timeout=120)
        t_start = time.monotonic_ns()
    except Exception:
        outcome.errors.append("workers failed to start")
    results = drain(out_q, procs, cfg.duration_s + cfg.acquire_timeout + 60)
    for p in ps:
        p.join(10)
        if p.is_alive():  # bounded: never leave a worker behind
            p.terminate()
            p.join(5)
            outcome.errors.append("a worker process had to be terminated")
    rows: List[Tuple[int, int, int, str]] = []
    for res in results:
        if "fatal" in res:
            outcome.errors.append(res["fatal"].strip().splitlines()[-1])
            continue
        outcome.client_cpu_s += res.get("cpu_s", 0.0)
        if res.get("stuck_threads"):
            outcome.errors.append(f"{res['stuck_threads']} thread(s) still blocked at the end")
        for th in res["threads"]:
            outcome.timeouts += th["timeouts"]
            outcome.errors.extend(e.strip().splitlines()[-1] for e in th["errors"])
            outcome.per_worker[th["wid"]] = len(th["ops"])
            outcome.per_worker_max_wait_ns[th["wid"]] = th.get("max_wait_ns", 0)
            rows.extend((s, a, r, th["wid"]) for s, a, r in th["ops"])
    if len(results) < procs:
        outcome.errors.append(f"only {len(results)}/{procs} workers reported")
    rows.sort()
    outcome.ops = len(rows)
    if rows:
        # from the common start line to the last release: a library that is slow to take
        # its first lock pays for it, and one lonely acquisition is not "infinitely fast"
        outcome.span_s = (max(r[2] for r in rows) - t_start) / 1e9
        if outcome.span_s > 0:
            outcome.throughput = outcome.ops / outcome.span_s
    for prev, nxt in zip(rows, rows[1:]):
        # a hand-off is consecutive sequence numbers taken by two different workers
        if nxt[0] == prev[0] + 1 and nxt[3] != prev[3]:
            outcome.handoff_ns.append(nxt[1] - prev[2])
    if cfg.counter_key:
        final = int(ctx.client.get(cfg.counter_key) or 0)
        outcome.lost_updates = outcome.ops - final
    return outcome


def merge(outcomes: Sequence[ChainOutcome]) -> ChainOutcome:
    """Combine rounds of the same measurement (workers keep their per-round identity)."""
    m = ChainOutcome()
    total_span = 0.0
    for i, o in enumerate(outcomes):
        m.ops += o.ops
        if not math.isnan(o.span_s):
            total_span += o.span_s
        m.handoff_ns.extend(o.handoff_ns)
        m.per_worker.update({f"r{i}{k}": v for k, v in o.per_worker.items()})
        m.per_worker_max_wait_ns.update(
            {f"r{i}{k}": v for k, v in o.per_worker_max_wait_ns.items()})
        m.timeouts += o.timeouts
        m.errors.extend(o.errors)
        if o.lost_updates is not None:
            m.lost_updates = (m.lost_updates or 0) + o.lost_updates
        m.client_cpu_s += o.client_cpu_s
    m.span_s = total_span if total_span else math.nan
    if total_span:
        m.throughput = m.ops / total_span
    return m
