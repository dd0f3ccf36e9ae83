"""The soak: ``python -m tests.history --minutes 10 --primitive rlock --seed 7``.

Runs one seeded history of any length against throwaway servers, with every fault the
topology has, and writes the report (``report.txt``, ``report.json``) and the picture
(``history.png``, with matplotlib: the ``bench`` extra) to ``--out``. Exits 1 when the
checker found a violation.
"""

from __future__ import annotations

import argparse
import sys
import time

from .run import RunConfig, run
from .workload import KINDS

PRIMITIVES = {"rlock": "rlock", "lock": "lock", "rwlock": "rw", "semaphore": "sem",
              "boundedsemaphore": "bsem", "condition": "cond", "barrier": "barrier"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.history", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--primitive", action="append", choices=sorted(PRIMITIVES) + ["all"],
                        help="repeat for several; default all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cluster", action="store_true", help="a cluster with replicas")
    parser.add_argument("--asyncio", action="store_true", help="asyncio tasks, not threads")
    parser.add_argument("--no-persist", action="store_true",
                        help="single server without persistence (a restart loses every hold)")
    parser.add_argument("--faults", help="comma-separated fault kinds (default: all)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="per primitive and worker")
    parser.add_argument("--ttl", type=float, default=0.6)
    parser.add_argument("--unfair", action="store_true", help="fair=False")
    parser.add_argument("--load", type=int, default=0, help="CPU hogs beside the workers")
    parser.add_argument("--out", help="folder for the history and report")
    args = parser.parse_args(argv)
    chosen = args.primitive or ["all"]
    kinds = KINDS if "all" in chosen else tuple(PRIMITIVES[p] for p in chosen)
    cfg = RunConfig(
        seed=args.seed, seconds=args.minutes * 60, topology="cluster" if args.cluster else "single",
        driver="asyncio" if args.asyncio else "thread", kinds=kinds,
        faults=args.faults.split(",") if args.faults else None, persist=not args.no_persist,
        workers=args.workers, threads=args.threads, ttl=args.ttl, ttl2=args.ttl * 3.5,
        fair=not args.unfair, load=args.load, out=args.out, plot=True)
    began = time.monotonic()
    result = run(cfg)
    print(result.report.summary(limit=50))
    print(f"{result.events} events in {time.monotonic() - began:.0f} s; "
          f"history and report in {result.folder}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
