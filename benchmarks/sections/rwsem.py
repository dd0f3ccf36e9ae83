"""Section 7 — rlocks' read/write lock and semaphore, when the library has them.

Guarded by ``hasattr(rlocks, "RWLock")`` / ``hasattr(rlocks, "Semaphore")``: until they land
the section says "not available yet" and reports no figure.

* RW, uncontended: acquire+release of ``read_lock`` and of ``write_lock`` (interleaved).
* RW, mixed: 4 processes, each operation a read (90 %: take ``read_lock``, GET the counter)
  or a write (10 %: take ``write_lock``, GET+SET the counter).  Reported: reads/s, writes/s,
  lost updates (writes minus the counter's final value: must be 0).
* Semaphore, uncontended: acquire+release of one permit of ``Semaphore(name, 4)``.
* Semaphore pool: 8 processes share ``Semaphore(name, 4)``, each holding a permit ~1 ms.
  Reported: permits taken per second, the largest number of simultaneous holders seen
  (a shared-memory counter; must be <= 4) and Jain's index over the 8 processes.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
import traceback
from typing import Any, Dict, List

from ..adapters import make_client
from ..harness import Context, interleaved
from ..stats import fmt_ns, fmt_num, fmt_ratio, jain, summary, table
from ..workers import drain
from . import SectionResult

KEY = "rwsem"
TITLE = "7. RW lock and semaphore (rlocks only)"
RW_PROCS, READ_RATIO = 4, 0.9
SEM_PROCS, SEM_VALUE = 8, 4


def _rlocks() -> Any:
    try:
        import rlocks

        return rlocks
    except Exception:
        return None


# -- worker processes (module level: they are started with spawn) -----------------------
def rw_process(url: str, name: str, counter: str, duration: float, seed: int, barrier: Any,
               out_q: Any) -> None:
    try:
        import rlocks

        client = make_client(url)
        rw = rlocks.RWLock(name, client=client)
        rnd = random.Random(seed)
        reads = writes = timeouts = 0
        barrier.wait(120)
        end = time.monotonic() + duration
        while time.monotonic() < end:
            if rnd.random() < READ_RATIO:
                if not rw.read_lock.acquire(timeout=10):
                    timeouts += 1
                    continue
                client.get(counter)
                rw.read_lock.release()
                reads += 1
            else:
                if not rw.write_lock.acquire(timeout=10):
                    timeouts += 1
                    continue
                v = client.get(counter)
                client.set(counter, int(v or 0) + 1)
                rw.write_lock.release()
                writes += 1
        out_q.put({"reads": reads, "writes": writes, "timeouts": timeouts})
    except Exception:
        barrier.abort()
        out_q.put({"fatal": traceback.format_exc(limit=3)})


def sem_process(url: str, name: str, duration: float, inside: Any, peak: Any, barrier: Any,
                out_q: Any) -> None:
    try:
        import rlocks

        client = make_client(url)
        sem = rlocks.Semaphore(name, SEM_VALUE, client=client)
        taken = timeouts = 0
        barrier.wait(120)
        end = time.monotonic() + duration
        while time.monotonic() < end:
            if not sem.acquire(blocking=True, timeout=10):
                timeouts += 1
                continue
            with inside.get_lock():
                inside.value += 1
                if inside.value > peak.value:
                    peak.value = inside.value
            time.sleep(0.001)
            with inside.get_lock():
                inside.value -= 1
            sem.release()
            taken += 1
        out_q.put({"taken": taken, "timeouts": timeouts})
    except Exception:
        barrier.abort()
        out_q.put({"fatal": traceback.format_exc(limit=3)})


def _spawn_all(target: Any, argsets: List[tuple], timeout: float) -> List[Dict[str, Any]]:
    spawn = mp.get_context("spawn")
    barrier = spawn.Barrier(len(argsets) + 1)
    q = spawn.Queue()
    ps = [spawn.Process(target=target, args=(*a, barrier, q), daemon=True) for a in argsets]
    for p in ps:
        p.start()
    try:
        barrier.wait(120)
    except Exception:
        pass
    got = drain(q, len(ps), timeout)
    for p in ps:
        p.join(5)
        if p.is_alive():
            p.terminate()
            p.join(5)
    return got


# -- the section ------------------------------------------------------------------------
def _rw(ctx: Context, rlocks: Any, res: SectionResult) -> None:
    c, ping = ctx.client, ctx.ping_p50_ns
    rw = rlocks.RWLock(ctx.name("rw", "unc"), client=c)

    def cycle(side: Any) -> Any:
        def fn() -> None:
            if not side.acquire(timeout=5):
                raise RuntimeError("uncontended acquire timed out")
            side.release()
        return fn

    fns = {"read_lock": cycle(rw.read_lock), "write_lock": cycle(rw.write_lock)}
    for fn in fns.values():
        for _ in range(10):
            fn()
    p = ctx.params
    samples = interleaved(ctx, fns, p.unc_rounds, p.unc_batch, "RW uncontended")
    rows = []
    for k, ns in samples.items():
        s = summary(ns)
        res.data[f"rw_{k}"] = s
        rows.append([f"RWLock.{k}", s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                     fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping)])
    res.lines += table(["acquire+release", "n", "p50", "p99", "p50/PING", "p99/PING"], rows)
    ctx.progress.step(f"RW {int(READ_RATIO * 100)}% reads, {RW_PROCS} processes")
    counter = ctx.name("rw", "counter")
    c.set(counter, 0)
    got = _spawn_all(rw_process, [(ctx.url, ctx.name("rw", "mixed"), counter,
                                   p.rw_duration_s, i) for i in range(RW_PROCS)],
                     p.rw_duration_s + 60)
    fatal = [g["fatal"].strip().splitlines()[-1] for g in got if "fatal" in g]
    ok = [g for g in got if "fatal" not in g]
    reads = sum(g["reads"] for g in ok)
    writes = sum(g["writes"] for g in ok)
    lost = writes - int(c.get(counter) or 0)
    d = {"reads_per_s": reads / p.rw_duration_s, "writes_per_s": writes / p.rw_duration_s,
         "lost_updates": lost, "timeouts": sum(g["timeouts"] for g in ok), "errors": fatal}
    res.data["rw_mixed"] = d
    res.lines += ["", f"RWLock, {RW_PROCS} processes, {int(READ_RATIO * 100)}% reads:"]
    res.lines += table(["reads/s", "writes/s", "lost", "timeouts", "errors"],
                       [[fmt_num(d["reads_per_s"]), fmt_num(d["writes_per_s"]), lost,
                         d["timeouts"], "; ".join(fatal)[:60] or "-"]], left=0)


def _sem(ctx: Context, rlocks: Any, res: SectionResult) -> None:
    c, ping, p = ctx.client, ctx.ping_p50_ns, ctx.params
    sem = rlocks.Semaphore(ctx.name("sem", "unc"), SEM_VALUE, client=c)

    def fn() -> None:
        if not sem.acquire(blocking=True, timeout=5):
            raise RuntimeError("uncontended acquire timed out")
        sem.release()

    for _ in range(10):
        fn()
    s = summary(interleaved(ctx, {"permit": fn}, p.unc_rounds, p.unc_batch,
                            "semaphore uncontended")["permit"])
    res.data["sem_uncontended"] = s
    res.lines += ["", f"Semaphore({SEM_VALUE}), one permit, uncontended:"]
    res.lines += table(["acquire+release", "n", "p50", "p99", "p50/PING", "p99/PING"],
                       [["Semaphore", s["n"], fmt_ns(s["p50"]), fmt_ns(s["p99"]),
                         fmt_ratio(s["p50"], ping), fmt_ratio(s["p99"], ping)]])
    ctx.progress.step(f"semaphore pool of {SEM_VALUE}, {SEM_PROCS} processes")
    spawn = mp.get_context("spawn")
    inside, peak = spawn.Value("i", 0), spawn.Value("i", 0)
    got = _spawn_all(sem_process, [(ctx.url, ctx.name("sem", "pool"), p.rw_duration_s,
                                    inside, peak) for _ in range(SEM_PROCS)],
                     p.rw_duration_s + 60)
    fatal = [g["fatal"].strip().splitlines()[-1] for g in got if "fatal" in g]
    ok = [g for g in got if "fatal" not in g]
    taken = [g["taken"] for g in ok]
    d = {"permits_per_s": sum(taken) / p.rw_duration_s, "peak_holders": peak.value,
         "jain": jain(taken), "timeouts": sum(g["timeouts"] for g in ok), "errors": fatal}
    res.data["sem_pool"] = d
    res.lines += ["", f"Semaphore({SEM_VALUE}) shared by {SEM_PROCS} processes, ~1 ms holds:"]
    res.lines += table(["permits/s", "peak holders", "Jain", "timeouts", "errors"],
                       [[fmt_num(d["permits_per_s"]), f"{peak.value} (max {SEM_VALUE})",
                         fmt_num(d["jain"], 3), d["timeouts"], "; ".join(fatal)[:60] or "-"]],
                       left=0)


def run(ctx: Context) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    rlocks = _rlocks()
    for attr, fn in (("RWLock", _rw), ("Semaphore", _sem)):
        if rlocks is None or not hasattr(rlocks, attr):
            res.data[attr] = "not available yet"
            res.lines.append(f"rlocks.{attr}: not available yet")
            continue
        try:
            fn(ctx, rlocks, res)
        except Exception as exc:
            res.data[attr] = {"error": repr(exc)}
            res.lines.append(f"rlocks.{attr}: error: {exc!r}")
    return res
