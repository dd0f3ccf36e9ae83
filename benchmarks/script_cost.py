"""Server time of an RLock's scripts, without the clients: ``python -m benchmarks.script_cost``.

A probe, not a benchmark section: it judges no target. It sends an RLock's own script calls
(the KEYS and ARGV the engine builds, each with a fresh op id) to the server as the queue
library's functions, pipelined in batches, so the server runs them back to back with no
client, scheduler or network time in between; ``INFO commandstats`` then says how much
server time they took, and how much of it went to the Redis commands they called. Two
shapes, each repeated ``-n`` times:

- **uncontended**: acquire (a single try, granted) and release;
- **contended**: the fair section of two processes with two threads each, as the
  contended benchmark runs it: the holder releases, which hands the lock over to the
  other process's queued entry and, in the same script, queues its own process's next
  thread (listening, as a contending process does; docs/design/handover.md, "The next
  head is queued by its sibling's release").

Rounds alternate so that a slow moment of the machine shows as spread, not as a bias;
the p50 of the rounds is printed. Changes to the Lua are compared with this on one
machine state: a full benchmark run's figures swing more between runs than most changes.

Usage: ``python -m benchmarks.script_cost [--url URL] [-n 10000] [-r 3] [--commands]``. Without
``--url`` it starts a throwaway ``redis-server`` as the benchmarks do. It needs Redis 7.0+
(functions).
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

import rlocks
from rlocks._engine.scripts import library, new_op, with_op

#: Batch size of a pipeline: large enough that round trips do not count, small enough
#: that the server is never blocked long.
BATCH = 250

#: ``INFO commandstats`` entries that are not the scripts' own nested commands.
_OUTSIDE = ("cmdstat_fcall", "cmdstat_config|resetstat", "cmdstat_info",
            "cmdstat_function|load")


class _Probe:
    """One RLock's calls as raw FCALL commands: the same KEYS and ARGV as the engine's."""

    def __init__(self, client: "redis.Redis[bytes]") -> None:
        self.client = client
        self.lock = rlocks.RLock(f"script-cost-{uuid.uuid4().hex[:8]}", client=client)
        self.functions = library().name
        client.function_load(library().code, replace=True)

    def acquire(self, pipe: Any, owner: str, entry: Optional[str]) -> None:
        """Queue (listening) under ``entry``, or a single try when it is None."""
        keys, args = self.lock._acquire_arguments(owner, 1, False, entry, entry is not None)
        self._send(pipe, "rlock_acquire", keys, args, owner + "/g")

    def release(self, pipe: Any, owner: str, carry: Tuple[str, ...] = ()) -> None:
        """Release ``owner``'s hold; ``carry``: (entry, waiter) to queue in the same script."""
        keys, args = self.lock._release_arguments(owner, 1)
        then = (*carry, 1) if carry else ()
        self._send(pipe, "rlock_release", keys, (*args, *then), owner)

    def _send(self, pipe: Any, op: str, keys: Any, args: Any, stream: str) -> None:
        pipe.execute_command("FCALL", f"{self.functions}_{op}", len(keys), *keys,
                             *with_op(args, new_op(stream)))

    def clear(self) -> None:
        """Delete the lock's keys, but not the namespace's fencing counter (KEYS[7]): its
        tokens must never go back, whoever else uses the server."""
        keys = self.lock._keys.queued()
        lists = [f"{keys[5]}:{entry}" for entry in ENTRIES.values()]  # the wake-up lists
        self.client.delete(*keys[:6], *keys[7:], *lists)


def _status(reply: bytes) -> bytes:
    return reply.split(b" ", 1)[0]


def _uncontended(probe: _Probe, n: int) -> None:
    owner = "h:1:u:1"
    for _ in range(0, n, BATCH):
        pipe = probe.client.pipeline(transaction=False)
        for _ in range(BATCH):
            probe.acquire(pipe, owner, None)
            probe.release(pipe, owner)
        for reply in pipe.execute():
            if _status(reply) != b"1":
                raise RuntimeError(f"uncontended: unexpected reply {reply!r}")


#: The two processes' queue entries (wake-up hub ids) of the contended shape.
ENTRIES = {"a": "pa/1", "b": "pb/1"}


def _contended(probe: _Probe, n: int) -> None:
    threads = {"a": ("h:1:a:1", "h:1:a:2"), "b": ("h:2:b:1", "h:2:b:2")}
    # Thread a1 holds; thread b1 is its process's queued waiter.
    pipe = probe.client.pipeline(transaction=False)
    probe.acquire(pipe, threads["a"][0], None)
    probe.acquire(pipe, threads["b"][0], ENTRIES["b"])
    if [_status(r) for r in pipe.execute()] != [b"1", b"3"]:
        raise RuntimeError("contended: could not set up the holder and the queued waiter")
    holder, process, other = threads["a"][0], "a", "b"
    queued = {"b": threads["b"][0]}
    for _ in range(0, n, BATCH):
        pipe = probe.client.pipeline(transaction=False)
        for _ in range(BATCH):
            sibling = next(t for t in threads[process] if t != holder)
            # hands over to the other process's entry, and queues the sibling behind it
            probe.release(pipe, holder, (ENTRIES[process], sibling))
            queued[process] = sibling
            holder, process, other = queued[other], other, process
        for reply in pipe.execute():
            head = reply.split(b"\n", 1)[0].split(b" ")
            if head[0] != b"1" or b"\ng " not in reply or not head[4].startswith(b"3,"):
                raise RuntimeError(f"contended: unexpected reply {reply!r}")


def _measure(client: "redis.Redis[bytes]", shape: Callable[[_Probe, int], None],
             n: int) -> Tuple[float, float, float, Dict[str, float]]:
    """(server µs in the scripts, of which in nested commands, nested commands, each nested
    command's calls) per repetition of ``shape``."""
    probe = _Probe(client)
    try:
        client.config_resetstat()
        shape(probe, n)
        stats: Dict[str, Any] = client.info("commandstats")
    finally:
        probe.clear()
    total = stats["cmdstat_fcall"]["usec"] / n
    inner = [v for k, v in stats.items() if k not in _OUTSIDE]
    calls = {k[len("cmdstat_"):].upper(): v["calls"] / n for k, v in stats.items()
             if k not in _OUTSIDE}
    return (total, sum(v["usec"] for v in inner) / n, sum(calls.values()), calls)


def report(url: str, n: int, rounds: int, commands: bool = False) -> None:
    client = redis.Redis.from_url(url)
    shapes = {"uncontended acquire+release": _uncontended,
              "contended section (hand-over + queue)": _contended}
    found: Dict[str, List[Tuple[float, float, float, Dict[str, float]]]] = {
        k: [] for k in shapes}
    for _ in range(rounds):
        for label, shape in shapes.items():
            found[label].append(_measure(client, shape, n))
    print(f"server µs per repetition, p50 of {rounds} rounds of {n:,} (pipelined, "
          f"{client.info('server')['redis_version']})")
    print(f"{'':40} {'scripts':>8} {'nested':>8} {'Lua':>8} {'commands':>9}")
    for label, rows in found.items():
        total, inner, calls = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"{label:40} {total:8.1f} {inner:8.1f} {total - inner:8.1f} {calls:9.1f}")
        if commands:
            each = sorted(rows[-1][3].items(), key=lambda kv: -kv[1])
            print("    " + ", ".join(f"{name} {count:.1f}" for name, count in each))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.script_cost")
    parser.add_argument("--url", help="a loopback Redis 7.0+ (default: a throwaway server)")
    parser.add_argument("-n", type=int, default=10_000, help="repetitions per round")
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument("--commands", action="store_true",
                        help="also list the nested commands of each shape, per repetition")
    args = parser.parse_args(argv)
    if args.n < BATCH or args.n % BATCH or args.rounds < 1:
        parser.error(f"-n must be a positive multiple of {BATCH}, -r at least 1")
    if args.url is None:
        from rlocks.server import TemporaryRedisServer

        with TemporaryRedisServer() as server:
            report(server.url, args.n, args.rounds, args.commands)
    else:
        report(args.url, args.n, args.rounds, args.commands)


if __name__ == "__main__":
    main()
