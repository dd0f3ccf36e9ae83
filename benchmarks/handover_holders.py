"""``python -m benchmarks.handover_holders``: script cost with 1 vs N live holders.

Times acquire+release of a Semaphore and of an RWLock read side by one more owner while
1 or N other owners hold it, through the lua_next scripts (queue and hand-over, issue 12)
and, for comparison, through today's scripts (rlocks/_engine/lua, HGETALL per call).
Prints per-pair microseconds and the N/1 ratio (target <= 1.3x). Each pair is two
EVALSHA round trips on loopback; the ratio, not the absolute figure, is the point.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

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


def _time_pairs(pair: Callable[[], None], rounds: int) -> float:
    """Median over 5 batches of the mean µs per acquire+release pair."""
    for _ in range(50):
        pair()
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            pair()
        batches.append((time.perf_counter() - start) / rounds * 1e6)
    return statistics.median(batches)


def measure(client: "redis.Redis[bytes]", holders: int, rounds: int) -> Dict[str, float]:
    tag = f"bench-holders-{holders}-{time.monotonic_ns()}"
    keys = [f"{tag}:{{x}}:{part}" for part in ("h", "l", "q", "w", "t", "c")]
    value = holders + 10
    ctx_sem = ["", "PUBLISH", 1, ELEASE, value, 1]
    ctx_rw = ["", "PUBLISH", 1, ELEASE]
    sem_keys = [k.replace("{x}", "{sem}") for k in keys]
    rw_keys = [k.replace("{x}", "{rw}") for k in keys]
    sem_acq, sem_rel = _next(client, "sem_acquire"), _next(client, "sem_release")
    rw_acq, rw_rel = _next(client, "rw_acquire"), _next(client, "rw_release")
    for i in range(holders):
        sem_acq(keys=sem_keys, args=ctx_sem + [f"h{i}", f"h{i}.a", f"h{i}", TTL, 1, 0])
        rw_acq(keys=rw_keys, args=ctx_rw + [f"h{i}.a", f"h{i}", "r", TTL, 1, 0, 0])

    def sem_pair() -> None:
        sem_acq(keys=sem_keys, args=ctx_sem + ["me", "me.a", "me", TTL, 1, 0])
        sem_rel(keys=sem_keys, args=ctx_sem + ["me", 1, 1])

    def rw_pair() -> None:
        rw_acq(keys=rw_keys, args=ctx_rw + ["me.a", "me", "r", TTL, 1, 0, 0])
        rw_rel(keys=rw_keys, args=ctx_rw + ["me.a", "r", 1, 0])

    # Today's scripts, same workload.
    old_sem_key, old_rw_key = f"{tag}:{{osem}}", f"{tag}:{{orw}}"
    old_sem_acq = scripts.load("sem_acquire", "sem_lib")
    old_sem_rel = scripts.load("sem_release", "sem_lib")
    old_rw_acq = scripts.load("rw_acquire_read", "rw_lib")
    old_rw_rel = scripts.load("rw_release", "rw_lib")
    for i in range(holders):
        scripts.run(client, old_sem_acq, [old_sem_key], [f"h{i}", TTL, 1, value, 1])
        scripts.run(client, old_rw_acq, [old_rw_key], [f"h{i}", TTL, 1, 0])
    chan = f"{tag}:chan"

    def old_sem_pair() -> None:
        scripts.run(client, old_sem_acq, [old_sem_key], ["me", TTL, 1, value, 1])
        scripts.run(client, old_sem_rel, [old_sem_key, chan], ["me", 1, 1, value, 1, "PUBLISH"])

    def old_rw_pair() -> None:
        scripts.run(client, old_rw_acq, [old_rw_key], ["me", TTL, 1, 0])
        scripts.run(client, old_rw_rel, [old_rw_key, chan, chan], ["me", "r", 1, 0, "PUBLISH"])

    result = {
        "next sem": _time_pairs(sem_pair, rounds),
        "next rw read": _time_pairs(rw_pair, rounds),
        "today sem": _time_pairs(old_sem_pair, rounds),
        "today rw read": _time_pairs(old_rw_pair, rounds),
    }
    for key in client.scan_iter(match=f"{tag}:*"):
        client.delete(key)
    return result


def main(argv: List[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.handover_holders")
    ap.add_argument("--holders", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args(argv)
    with TemporaryRedisServer() as server:
        client = redis.Redis.from_url(server.url)
        one = measure(client, 1, args.rounds)
        many = measure(client, args.holders, args.rounds)
    print(f"{'acquire+release (µs/pair)':<28}{'1 holder':>10}{f'{args.holders} holders':>16}"
          f"{'ratio':>8}")
    for label in one:
        print(f"{label:<28}{one[label]:>10.1f}{many[label]:>16.1f}"
              f"{many[label] / one[label]:>7.2f}x")


if __name__ == "__main__":
    main()
