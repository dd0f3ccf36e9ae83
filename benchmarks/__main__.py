"""``python -m benchmarks``: run the rlocks benchmark suite (see benchmarks/README.md)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from contextlib import ExitStack
from typing import Any, Dict, List, Optional

from .adapters import QUORUM_ENV, all_adapters, make_client
from .harness import Context, Params, Progress, cleanup_keys
from .redisinfo import is_loopback_url, server_version
from .sections import ALIASES, ORDER, SectionResult, Target, load
from .stats import fmt_ns, table, verdict


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark rlocks against other Redis lock libraries.  Every figure is "
                    "given raw and as a ratio to a bare PING round trip (p50) of the same run.")
    ap.add_argument("--quick", action="store_true",
                    help="small counts, whole run about 3 minutes (CI smoke test)")
    ap.add_argument("--only", metavar="SECTION,...",
                    help=f"run only these sections: {', '.join(ORDER)} (or 1-{len(ORDER)}); "
                         "the floor (PING) is always measured because every ratio needs it")
    ap.add_argument("--json", metavar="PATH", help="also write all figures as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write the scaling curves as a PNG "
                    "(needs matplotlib and the scaling section)")
    ap.add_argument("--url", default=os.environ.get("RLOCKS_URL"),
                    help="use this Redis (loopback only) instead of starting a throwaway "
                         "redis-server; default $RLOCKS_URL")
    ap.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    return ap.parse_args(argv)


def selected_sections(only: Optional[str]) -> List[str]:
    if not only:
        return list(ORDER)
    wanted = []
    for raw in only.split(","):
        k = raw.strip().lower()
        if not k:
            continue
        k = ALIASES.get(k, k)
        if k not in ORDER:
            raise SystemExit(f"unknown section {raw!r}; choose from {', '.join(ORDER)}")
        wanted.append(k)
    # always in suite order; the floor first, since every ratio refers to it
    return [k for k in ORDER if k in wanted or k == "floor"]


def _clean(obj: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    sections = selected_sections(args.only)
    params = Params.quick() if args.quick else Params()
    progress = Progress(enabled=not args.no_progress)
    started = time.monotonic()
    out = sys.stdout

    with ExitStack() as stack:
        if args.url:
            if not is_loopback_url(args.url):
                print(f"refusing {args.url!r}: the benchmarks only talk to this machine "
                      "(127.0.0.1 / localhost)", file=sys.stderr)
                return 2
            url, server_note, own = args.url, f"given: {args.url}", False
        else:
            try:
                from rlocks.server import TemporaryRedisServer
            except Exception as exc:
                print(f"cannot import rlocks.server to start redis-server ({exc}); "
                      "pass --url or set RLOCKS_URL", file=sys.stderr)
                return 2
            srv = stack.enter_context(TemporaryRedisServer())
            url, server_note = srv.url, f"throwaway redis-server on port {srv.port}"
            own = True
        client = make_client(url)
        stack.callback(client.close)
        if {"uncontended", "handoff"} & set(sections):
            _start_quorum_masters(stack)
        adapters = all_adapters()
        ctx = Context(url=url, params=params, quick=args.quick, progress=progress,
                      client=client, adapters=adapters, own_server=own)

        print(f"rlocks benchmarks ({'quick' if args.quick else 'full'} run), "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')}", file=out)
        print(f"redis {server_version(client)} ({server_note}); Python "
              f"{platform.python_version()}; redis-py {_dist_version('redis')} "
              f"({_parser()} reply parser); {os.cpu_count()} CPUs", file=out)
        print("libraries:", file=out)
        lib_meta: Dict[str, Any] = {}
        for a in adapters:
            reason = a.unavailable_reason()
            if reason is None:
                print(f"  {a.key:<18} {a.version():<10} {a.defaults}", file=out)
                lib_meta[a.key] = {"available": True, "version": a.version(),
                                   "defaults": a.defaults}
            else:
                print(f"  {a.key:<18} unavailable: {reason}", file=out)
                lib_meta[a.key] = {"available": False, "reason": reason}
        out.flush()

        results: Dict[str, SectionResult] = {}
        for key in sections:
            title = key
            progress.set_section(key)
            t0 = time.monotonic()
            try:
                mod = load(key)
                title = mod.TITLE
                res = mod.run(ctx)
            except Exception as exc:  # one broken section must not cost the others
                res = SectionResult(key, title, data={"error": repr(exc)},
                                    lines=[f"section failed: {exc!r}"] +
                                    traceback.format_exc(limit=4).rstrip().splitlines())
            res.data["seconds"] = round(time.monotonic() - t0, 1)
            results[key] = res
            progress.done()
            print(f"\n== {res.title}  [{res.data['seconds']} s]", file=out)
            for line in res.lines:
                print(line, file=out)
            out.flush()

        targets: List[Target] = [t for r in results.values() for t in r.targets]
        if targets:
            print("\n== rlocks targets (floors of this run: PING p50 "
                  f"{fmt_ns(ctx.ping_p50_ns)}, EVALSHA p50 {fmt_ns(ctx.evalsha_p50_ns)}, "
                  f"BLPOP/LPUSH hand-off p50 {fmt_ns(ctx.blpop_p50_ns)})", file=out)
            rows = [[t.what, t.measured, t.goal, verdict(t.ok)] for t in targets]
            for line in table(["target", "measured", "goal", "result"], rows, left=4):
                print(line, file=out)
        elapsed = time.monotonic() - started
        print(f"\ntotal {elapsed:.0f} s", file=out)

        if "scaling" in results and args.plot:
            from .sections.scaling import plot

            print(plot(results["scaling"].data, args.plot, ctx.ping_p50_ns), file=out)
        elif args.plot:
            print("--plot skipped: the scaling section did not run", file=out)

        if args.json:
            doc = {
                "meta": {"mode": "quick" if args.quick else "full", "url": url,
                         "redis_version": server_version(client),
                         "python": platform.python_version(),
                         "redis_py": _dist_version("redis"), "parser": _parser(),
                         "cpus": os.cpu_count(),
                         "ping_p50_ns": ctx.ping_p50_ns,
                         "evalsha_p50_ns": ctx.evalsha_p50_ns,
                         "blpop_handoff_p50_ns": ctx.blpop_p50_ns,
                         "blpop_handoff_p99_ns": ctx.blpop_p99_ns, "seconds": round(elapsed, 1),
                         "params": params.__dict__, "libraries": lib_meta},
                "sections": {k: r.data for k, r in results.items()},
                "targets": [t.to_json() for t in targets],
            }
            with open(args.json, "w") as fh:
                json.dump(_clean(doc), fh, indent=1)
            print(f"JSON written to {args.json}", file=out)
        try:
            cleanup_keys(ctx)
        except Exception:
            pass
    return 0


def _start_quorum_masters(stack: ExitStack) -> None:
    """Start the two more masters of the Quorum row (throwaway local servers; the run's
    server is the third) and name them to every process through the environment. If
    they cannot be started the row reads ``unavailable``."""
    try:
        from rlocks.server import TemporaryRedisServer

        urls = [stack.enter_context(TemporaryRedisServer()).url for _ in range(2)]
    except Exception as exc:  # noqa: BLE001 - the row says why, the run goes on
        print(f"Quorum row: could not start 2 more masters ({exc})", file=sys.stderr)
        return
    os.environ[QUORUM_ENV] = ",".join(urls)
    stack.callback(os.environ.pop, QUORUM_ENV, None)


def _dist_version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def _parser() -> str:
    """The reply parser every library of the run shares: redis-py's C one (the hiredis
    package, rlocks' ``hiredis`` extra) when installed, else its pure-Python one. It
    weighs on every figure (README, Performance)."""
    from redis.utils import HIREDIS_AVAILABLE

    return "hiredis" if HIREDIS_AVAILABLE else "Python"


if __name__ == "__main__":
    sys.exit(main())
