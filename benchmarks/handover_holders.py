"""``python -m benchmarks.handover_holders``: script cost with 1 vs N live holders.

Times acquire+release of a Semaphore and of an RWLock read side by one more owner while
1 or N other owners hold it, through the lua_next scripts (queue and hand-over, issue 12)
and, for comparison, through today's scripts (rlocks/_engine/lua, HGETALL per call).
Prints, for 1 and N holders and their ratio (target <= 1.3x), the wall-clock
microseconds per pair (two EVALSHA round trips on loopback) and the server's own
microseconds per script call (best batch of each, batches alternating between 1 and N);
the ratios, not the absolute figures, are the point.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

import rlocks
from rlocks._engine import scripts
from rlocks.server import TemporaryRedisServer

LUA_NEXT = Path(rlocks.__file__).parent / "_engine" / "lua_next"
TTL = 600_000
ELEASE = 2000


def _next(client: "redis.Redis[bytes]", name: str) -> Any:
    lib = (LUA_NEXT / "queue_lib.lua").read_text()
    return client.register_script(lib + "\n" + (LUA_NEXT / f"{name}.lua").read_text())


def _batch(client: "redis.Redis[bytes]", pair: Callable[[], None],
           rounds: int) -> Tuple[float, float]:
    """One batch: (wall µs per pair, server µs per EVALSHA from INFO commandstats)."""
    client.config_resetstat()
    start = time.perf_counter()
    for _ in range(rounds):
        pair()
    wall = (time.perf_counter() - start) / rounds * 1e6
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return wall, float(stats.get("usec_per_call", float("nan")))


def _setup(client: "redis.Redis[bytes]", tag: str, holders: int,
           value: int) -> Dict[str, Callable[[], None]]:
    """``holders`` live holders on each of four primitives; returns one
    acquire+release pair function per primitive, for one more owner."""
    keys = [f"{tag}:{{x}}:{part}" for part in ("h", "l", "q", "w", "t", "c")]
    ctx_sem = ["", "PUBLISH", 1, ELEASE, value, 1]
    ctx_rw = ["", "PUBLISH", 1, ELEASE]
    sem_keys = [k.replace("{x}", "{sem}") for k in keys]
    rw_keys = [k.replace("{x}", "{rw}") for k in keys]
    sem_acq, sem_rel = _next(client, "sem_acquire"), _next(client, "sem_release")
    rw_acq, rw_rel = _next(client, "rw_acquire"), _next(client, "rw_release")
    old_sem_key, old_rw_key, chan = f"{tag}:{{osem}}", f"{tag}:{{orw}}", f"{tag}:chan"
    old_sem_acq = scripts.load("sem_acquire", "sem_lib")
    old_sem_rel = scripts.load("sem_release", "sem_lib")
    old_rw_acq = scripts.load("rw_acquire_read", "rw_lib")
    old_rw_rel = scripts.load("rw_release", "rw_lib")
    for i in range(holders):
        sem_acq(keys=sem_keys, args=ctx_sem + [f"h{i}.a", f"h{i}.a", f"h{i}", TTL, 1, 0])
        rw_acq(keys=rw_keys, args=ctx_rw + [f"h{i}.a", f"h{i}", "r", TTL, 1, 0, 0])
        scripts.run(client, old_sem_acq, [old_sem_key], [f"h{i}", TTL, 1, value, 1])
        scripts.run(client, old_rw_acq, [old_rw_key], [f"h{i}", TTL, 1, 0])

    def sem_pair() -> None:
        sem_acq(keys=sem_keys, args=ctx_sem + ["me.a", "me.a", "me", TTL, 1, 0])
        sem_rel(keys=sem_keys, args=ctx_sem + [1, "me.a", 1])

    def rw_pair() -> None:
        rw_acq(keys=rw_keys, args=ctx_rw + ["me.a", "me", "r", TTL, 1, 0, 0])
        rw_rel(keys=rw_keys, args=ctx_rw + ["me.a", "r", 1, 0])

    def old_sem_pair() -> None:
        scripts.run(client, old_sem_acq, [old_sem_key], ["me", TTL, 1, value, 1])
        scripts.run(client, old_sem_rel, [old_sem_key, chan], [1, value, 1, "PUBLISH", "me", 1])

    def old_rw_pair() -> None:
        scripts.run(client, old_rw_acq, [old_rw_key], ["me", TTL, 1, 0])
        scripts.run(client, old_rw_rel, [old_rw_key, chan, chan], ["me", "r", 1, 0, "PUBLISH"])

    return {"lua_next Semaphore": sem_pair, "lua_next RWLock read": rw_pair,
            "today Semaphore": old_sem_pair, "today RWLock read": old_rw_pair}


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.handover_holders")
    ap.add_argument("--holders", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=200, help="pairs per batch")
    ap.add_argument("--batches", type=int, default=15)
    args = ap.parse_args(argv)
    n = args.holders
    with TemporaryRedisServer() as server:
        client = redis.Redis.from_url(server.url)
        one = _setup(client, "bench-one", 1, n + 10)
        many = _setup(client, "bench-many", n, n + 10)
        print(f"{'acquire+release':<22}{'wall µs/pair':>30}{'server µs/script':>30}")
        print(f"{'':<22}{'1':>8}{n:>8}{'ratio':>14}{'1':>8}{n:>8}{'ratio':>14}")
        for label in one:
            for _ in range(50):
                one[label]()
                many[label]()
            # Batches alternate between 1 and n holders and the best of each is kept, so
            # other load on the machine cannot favour one side.
            a: List[Tuple[float, float]] = []
            b: List[Tuple[float, float]] = []
            for _ in range(args.batches):
                a.append(_batch(client, one[label], args.rounds))
                b.append(_batch(client, many[label], args.rounds))
            w1, wn = min(x[0] for x in a), min(x[0] for x in b)
            s1, sn = min(x[1] for x in a), min(x[1] for x in b)
            print(f"{label:<22}{w1:>8.0f}{wn:>8.0f}{wn / w1:>13.2f}x"
                  f"{s1:>8.1f}{sn:>8.1f}{sn / s1:>13.2f}x", flush=True)

if __name__ == "__main__":
    main()
