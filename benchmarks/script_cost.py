"""Server time and nested commands of the engine's scripts, call by call:
``python -m benchmarks.script_cost``.

A probe, not a benchmark section: it judges no target. Every call is built by the engine
itself: the spec of a real primitive object (``rlocks._engine.primitive.LockSpec`` for an
RLock and each RWLock side, ``PermitSpec`` for a semaphore) makes the
``rlocks._engine.scripts.Call`` with the KEYS and ARGV the engine sends (ttl, entry lease,
fairness, wake channel, the count the caller expects), under made-up owner ids of made-up
processes. The calls go to the server pipelined, in batches, with an ``INFO
commandstats`` between every two calls, so the server runs them back to back with no
client in between and each call's delta is its own: the server time of its ``EVALSHA``
and the commands it ran inside the server, by name. Each shape then runs again without
the INFOs between its calls (only one before and one after the batch), for its total.

Shapes, each repeated ``-n`` times per round:

- **uncontended**, RLock, RWLock read side, RWLock write side, Semaphore(1): an acquire
  of a free primitive nobody waits for (the early exit), and its release;
- **re-entrant**, RLock: a second level taken and given back inside a held one;
- **contended**, RLock, RWLock write side, Semaphore(1), fair: three owners of three
  processes take turns, as a contended section runs: the holder's release wakes the
  head waiter; the woken head asks again and is granted (leaving the queue); the owner
  that just released asks again at once, is refused and queued at the tail.

Every reply is checked (status, and whom a release woke); a reply the shape does not
expect raises, so a change to the engine's calls that breaks a shape fails loudly
(tests/test_probes.py runs it). Rounds alternate the shapes, so a slow moment of the
machine shows as spread, not as a bias; the median of the rounds is printed. The INFO
between calls is the price of the attribution (its work on the server comes between
the scripts); the shapes' totals without it are printed beside them.

Usage: ``python -m benchmarks.script_cost [--url URL] [-n 1000] [-r 3]``. Without
``--url`` it starts a throwaway ``redis-server`` as the benchmarks do; on a server other
clients use, a call whose delta holds another script call is left out (and counted), but
their plain commands would land in the counts: use a server of its own.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import redis

import rlocks
from rlocks._engine.primitive import LockSpec, PermitSpec
from rlocks._engine.scripts import Call, Reply, decode

#: Calls per pipeline: large enough that round trips do not count, small enough that the
#: server is never blocked long.
BATCH = 100

#: What a client sends to run a script: the call itself, not a nested command.
_SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
#: The probe's own commands, never a script's.
_OWN = ("info", "config", "script")

#: A primitive's calls, as the dialogues build them: (acquire, release).
Acquire = Callable[[str, int, int], Call]
Release = Callable[[str, int], Call]


class Step(NamedTuple):
    """One call, what it is (``None``: setup, not recorded) and the reply it must get."""

    label: Optional[str]
    call: Call
    status: int
    woken: Optional[Tuple[str, ...]] = None


class Kind:
    """One primitive object and how the engine builds its calls (its own spec)."""

    def __init__(self, label: str, primitive: Any) -> None:
        self.label = label
        self.p = primitive
        spec = primitive._spec
        if not isinstance(spec, (LockSpec, PermitSpec)):
            raise TypeError(f"{label}: unexpected spec {spec!r}")
        self.spec = spec

    def acquire(self, owner: str, expect: int, entry_ms: int) -> Call:
        return self.spec.acquire(self.p, owner, expect, entry_ms)

    def release(self, owner: str, expect: int) -> Call:
        if isinstance(self.spec, PermitSpec):
            return self.spec.release_permits(self.p, owner, 1, ((owner, expect, 1),))
        return self.spec.release(self.p, owner, expect)

    @property
    def entry_ms(self) -> int:
        """The entry lease a blocking acquire sends (the engine's default)."""
        return int(self.p._entry_ms)

    def scripts(self) -> List[Any]:
        return [self.spec.acquire_script, self.spec.release_script]

    def keys(self) -> List[str]:
        """The primitive's own keys (never the slot's fencing counter: its tokens must not
        go back, whoever else uses the server)."""
        k = self.p._keys
        return [k.hash, k.queue, k.leases]


def _owner(process: str, thread: int = 1) -> str:
    """A made-up owner id of the engine's form ``host:pid:nonce:serial``."""
    return f"probe:{process}:0:{thread}"


class Shape:
    """A repeated sequence of calls on one primitive: setup, one repetition, teardown."""

    def __init__(self, title: str, kind: Kind) -> None:
        self.title, self.kind = title, kind

    def setup(self) -> List[Step]:
        return []

    def cycle(self) -> List[Step]:
        raise NotImplementedError

    def teardown(self) -> List[Step]:
        return []


class Uncontended(Shape):
    def cycle(self) -> List[Step]:
        k, a = self.kind, _owner("a")
        return [Step("acquire: free, nobody waits", k.acquire(a, 0, k.entry_ms), 1),
                Step("release: the last level, nobody waits", k.release(a, 1), 1)]


class Reentrant(Shape):
    def setup(self) -> List[Step]:
        return [Step(None, self.kind.acquire(_owner("a"), 0, self.kind.entry_ms), 1)]

    def cycle(self) -> List[Step]:
        k, a = self.kind, _owner("a")
        return [Step("acquire: re-entry (level 2)", k.acquire(a, 1, 0), 1),
                Step("release: the inner level", k.release(a, 2), 1)]

    def teardown(self) -> List[Step]:
        return [Step(None, self.kind.release(_owner("a"), 1), 1)]


class Contended(Shape):
    """Three owners of three processes take turns, first come, first served."""

    def __init__(self, title: str, kind: Kind) -> None:
        super().__init__(title, kind)
        self.holder = _owner("a")
        self.queue = [_owner("b"), _owner("c")]

    def setup(self) -> List[Step]:
        k = self.kind
        return [Step(None, k.acquire(self.holder, 0, k.entry_ms), 1)] + [
            Step(None, k.acquire(w, 0, k.entry_ms), 0) for w in self.queue]

    def cycle(self) -> List[Step]:
        k, held, head = self.kind, self.holder, self.queue[0]
        steps = [Step("release: wakes the head waiter", k.release(held, 1), 1, (head,)),
                 Step("acquire: the woken head, granted", k.acquire(head, 0, k.entry_ms), 1),
                 Step("acquire: the releaser again, queued", k.acquire(held, 0, k.entry_ms),
                      0)]
        self.holder, self.queue = head, self.queue[1:] + [held]
        return steps

    def teardown(self) -> List[Step]:
        return [Step(None, self.kind.release(self.holder, 1), 1, (self.queue[0],))]


def shapes(client: "redis.Redis[bytes]", tag: str) -> List[Shape]:
    """Every shape, on primitive objects of their own (names unique to this run)."""
    def name(what: str) -> str:
        return f"script-cost-{tag}-{what}"

    rl = Kind("RLock", rlocks.RLock(name("rlock"), client=client))
    rw = rlocks.RWLock(name("rw"), client=client)
    read, write = Kind("RWLock read", rw.read_lock), Kind("RWLock write", rw.write_lock)
    sem = Kind("Semaphore(1)", rlocks.Semaphore(name("sem"), 1, client=client))
    rl_c = Kind("RLock", rlocks.RLock(name("rlock-c"), client=client))
    rw_c = Kind("RWLock write", rlocks.RWLock(name("rw-c"), client=client).write_lock)
    sem_c = Kind("Semaphore(1)", rlocks.Semaphore(name("sem-c"), 1, client=client))
    return [Uncontended("RLock, uncontended", rl), Reentrant("RLock, re-entrant", rl),
            Contended("RLock, contended (fair)", rl_c),
            Uncontended("RWLock read side, uncontended", read),
            Uncontended("RWLock write side, uncontended", write),
            Contended("RWLock write side, contended (fair)", rw_c),
            Uncontended("Semaphore(1), uncontended", sem),
            Contended("Semaphore(1), contended (fair)", sem_c)]


# -- sending ------------------------------------------------------------------------------

Stats = Dict[str, Tuple[int, int]]  # command -> (calls, usec), cumulative


def _stats(info: Dict[str, Any]) -> Stats:
    return {k[len("cmdstat_"):]: (int(v["calls"]), int(v["usec"])) for k, v in info.items()
            if k.startswith("cmdstat_") and isinstance(v, dict)}


def _delta(before: Stats, after: Stats) -> Tuple[int, int, Counter]:
    """(script calls, their µs, nested commands by upper-case name) between two readings."""
    calls = usec = 0
    nested: Counter = Counter()
    for name, (n, us) in after.items():
        n0, us0 = before.get(name, (0, 0))
        if n == n0:
            continue
        if name in _SCRIPT_CALLS:
            calls += n - n0
            usec += us - us0
        elif not name.startswith(_OWN):
            nested[name.upper()] += n - n0
    return calls, usec, nested


def _check(shape: Shape, step: Step, raw: Any) -> Reply:
    if isinstance(raw, BaseException):
        raise RuntimeError(f"{shape.title}: {step.label or 'setup'}: {raw!r}")
    reply = decode(raw, step.call.script.name)
    if reply.status != step.status or (step.woken is not None and reply.woken != step.woken):
        raise RuntimeError(f"{shape.title}: {step.label or 'setup'}: unexpected reply {reply} "
                           f"(expected status {step.status}"
                           + (f", woken {step.woken}" if step.woken is not None else "") + ")")
    return reply


class Tally:
    """Per call label: calls, server µs, nested commands by name; calls left out."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.usec: Counter = Counter()
        self.nested: Dict[str, Counter] = {}
        self.order: List[str] = []
        self.left_out = 0

    def add(self, label: str, usec: int, nested: Counter) -> None:
        if label not in self.nested:
            self.nested[label] = Counter()
            self.order.append(label)
        self.calls[label] += 1
        self.usec[label] += usec
        self.nested[label].update(nested)


def _chunks(steps: Sequence[Step]) -> Iterator[Sequence[Step]]:
    for i in range(0, len(steps), BATCH):
        yield steps[i:i + BATCH]


def run_attributed(client: "redis.Redis[bytes]", shape: Shape, steps: Sequence[Step],
                   tally: Tally) -> None:
    """Send ``steps`` with an INFO commandstats between every two calls; each recorded
    step's delta goes to ``tally`` under its label."""
    for chunk in _chunks(steps):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("INFO", "commandstats")
        for step in chunk:
            pipe.execute_command(*step.call.command())
            pipe.execute_command("INFO", "commandstats")
        out = pipe.execute(raise_on_error=False)
        before = _stats(out[0])
        for i, step in enumerate(chunk):
            _check(shape, step, out[1 + 2 * i])
            after = _stats(out[2 + 2 * i])
            calls, usec, nested = _delta(before, after)
            before = after
            if step.label is None:
                continue
            if calls != 1:  # another client's script ran in between: not this call's
                tally.left_out += 1
                continue
            tally.add(step.label, usec, nested)


def run_plain(client: "redis.Redis[bytes]", shape: Shape,
              steps: Sequence[Step]) -> Tuple[int, int, Counter, int]:
    """Send ``steps`` pipelined, INFO only around each batch: (script calls, their µs,
    nested commands by name, batches left out because another client's script ran)."""
    calls = usec = left_out = 0
    nested: Counter = Counter()
    for chunk in _chunks(steps):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("INFO", "commandstats")
        for step in chunk:
            pipe.execute_command(*step.call.command())
        pipe.execute_command("INFO", "commandstats")
        out = pipe.execute(raise_on_error=False)
        for i, step in enumerate(chunk):
            _check(shape, step, out[1 + i])
        n, us, inner = _delta(_stats(out[0]), _stats(out[-1]))
        if n != len(chunk):
            left_out += 1
            continue
        calls, usec = calls + n, usec + us
        nested.update(inner)
    return calls, usec, nested, left_out


def _send(client: "redis.Redis[bytes]", shape: Shape, steps: Sequence[Step]) -> None:
    """Setup and teardown: sent and checked, not counted."""
    for chunk in _chunks(steps):
        pipe = client.pipeline(transaction=False)
        for step in chunk:
            pipe.execute_command(*step.call.command())
        for step, raw in zip(chunk, pipe.execute(raise_on_error=False)):
            _check(shape, step, raw)


class Result(NamedTuple):
    """One shape in one round: per call label (µs, nested commands, by name), and the
    repetition's total sent without INFO between calls (µs, nested commands)."""

    calls: Dict[str, Tuple[float, float, Dict[str, float]]]
    plain_us: float
    plain_nested: float
    left_out: int


def measure(client: "redis.Redis[bytes]", shape: Shape, n: int) -> Result:
    """``n`` repetitions attributed call by call, then ``n`` more sent plainly."""
    keys = shape.kind.keys()
    client.delete(*keys)
    try:
        _send(client, shape, shape.setup())
        tally = Tally()
        run_attributed(client, shape, [s for _ in range(n) for s in shape.cycle()], tally)
        plain = [s for _ in range(n) for s in shape.cycle()]
        calls, usec, nested, left_out = run_plain(client, shape, plain)
        _send(client, shape, shape.teardown())
    finally:
        client.delete(*keys)
    per_call = {label: (tally.usec[label] / tally.calls[label],
                        sum(tally.nested[label].values()) / tally.calls[label],
                        {k: v / tally.calls[label] for k, v in tally.nested[label].items()})
                for label in tally.order}
    reps = calls / max(1, len(plain) // n) if calls else 0
    return Result(per_call, usec / reps if reps else float("nan"),
                  sum(nested.values()) / reps if reps else float("nan"),
                  tally.left_out + left_out)


def _names(by: Dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))


def report(url: str, n: int, rounds: int) -> Dict[str, List[Result]]:
    """Measure every shape ``rounds`` times and print the medians; returns the results."""
    client = redis.Redis.from_url(url)
    try:
        tag = uuid.uuid4().hex[:8]
        found: Dict[str, List[Result]] = {}
        all_shapes = shapes(client, tag)
        for shape in all_shapes:
            for script in shape.kind.scripts():
                client.script_load(script.source)
        for r in range(rounds):
            order = all_shapes if r % 2 == 0 else all_shapes[::-1]
            for shape in order:
                found.setdefault(shape.title, []).append(measure(client, shape, n))
        version = client.info("server")["redis_version"]
    finally:
        client.close()
    print(f"server time (µs) and nested commands per call, median of {rounds} round(s) of "
          f"{n:,} repetitions (pipelined; INFO commandstats between calls; redis {version})")
    for title, results in found.items():
        print(f"\n{title}")
        last = results[-1]  # by name: the last round (the slot's counter exists by then)
        for label in last.calls:
            us = statistics.median(res.calls[label][0] for res in results)
            nested = statistics.median(res.calls[label][1] for res in results)
            print(f"  {label:40} {us:8.1f} µs {nested:6.3g} nested: "
                  f"{_names(last.calls[label][2])}")
        us = statistics.median(res.plain_us for res in results)
        nested = statistics.median(res.plain_nested for res in results)
        print(f"  {'repetition, no INFO between calls':40} {us:8.1f} µs {nested:6.3g} nested")
        left = sum(res.left_out for res in results)
        if left:
            print(f"  ({left} calls or batches left out: another client's script ran)")
    return found


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.script_cost")
    parser.add_argument("--url", help="a loopback Redis (default: a throwaway server)")
    parser.add_argument("-n", type=int, default=1000, help="repetitions per shape and round")
    parser.add_argument("-r", "--rounds", type=int, default=3)
    parser.add_argument("--commands", action="store_true",
                        help="accepted for old command lines: the nested commands are always "
                             "listed by name")
    args = parser.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        parser.error("-n and -r must be at least 1")
    if args.url is None:
        from rlocks.server import TemporaryRedisServer

        with TemporaryRedisServer() as server:
            report(server.url, args.n, args.rounds)
    else:
        from .redisinfo import is_loopback_url

        if not is_loopback_url(args.url):
            parser.error(f"refusing {args.url!r}: loopback addresses only")
        report(args.url, args.n, args.rounds)


if __name__ == "__main__":
    main()
