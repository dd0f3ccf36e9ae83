"""A worker process: runs the workloads of ``workload`` with rlocks and records them.

``python -m tests.history.worker CONFIG WORKER_ID`` (the runner starts it so). CONFIG is
the run's JSON file (see ``run.RunConfig.worker_config``). The worker writes one JSON line
per event to ``<dir>/<WORKER_ID>.jsonl``, each with one ``os.write`` to a file opened
for appending, so a SIGKILL loses at most the event being written. It stops starting
sections once ``<dir>/stop`` exists, finishes the one it is in, and exits.

Events (keys kept short: a run writes tens of thousands):

- ``a``: what happened (``start``, ``acquire``, ``release_call``, ``release``, ``write``,
  ``owned``, ``wait_call``, ``wait``, ``notify``, ``spurious``, ``on_lost``, ``error``);
- ``w`` worker, ``th`` thread (or task), ``p`` primitive kind, ``s`` side, ``h`` hold,
  ``d`` depth, ``new`` (an acquire that starts a hold), ``end`` (a release that ends
  one), ``n``, ``to`` (a wait's timeout);
- ``inv`` / ``ret``: monotonic seconds at the call and its return (``t`` for instants);
- ``o`` the outcome (see ``workload``), ``x`` an exception's class, ``tok`` a token.

Only rlocks' public names are used.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

import rlocks
import rlocks.asyncio

from .workload import (
    PARTIES,
    Acquire,
    BarrierReset,
    BarrierWait,
    Notify,
    Owned,
    Release,
    Shape,
    Sleep,
    Spurious,
    Wait,
    Write,
    workload,
)

#: The fenced store's script: accept a write whose token is at least the highest the
#: primitive has seen, and log it; refuse a smaller one. Tokens are integers below 2**53
#: (server microseconds), which Lua's numbers hold exactly.
FENCE = """
local top = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) < top then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return 1
"""
FENCE_KEYS = ("fence:top", "fence:log")


class Recorder:
    def __init__(self, folder: str, worker: str) -> None:
        self.worker = worker
        self._fd = os.open(os.path.join(folder, f"{worker}.jsonl"),
                           os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, **event: Any) -> None:
        event["w"] = self.worker
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())


def outcome(exc: BaseException) -> str:
    if isinstance(exc, rlocks.BrokenBarrierError):
        return "broken"
    if isinstance(exc, rlocks.LockLostError):
        return "lost"
    if isinstance(exc, (ValueError, rlocks.NotOwnedError)):
        return "refused"
    if isinstance(exc, (asyncio.CancelledError, asyncio.TimeoutError)):
        return "cancelled"
    return "error"


def make_client(spec: Dict[str, Any], aio: bool) -> Any:
    options = dict(socket_timeout=spec.get("socket_timeout", 2.0), socket_connect_timeout=2.0)
    if "cluster" in spec:
        if aio:
            from redis.asyncio.cluster import ClusterNode, RedisCluster
        else:
            from redis.cluster import ClusterNode, RedisCluster  # type: ignore[assignment]
        nodes = [ClusterNode(h, p) for h, p in spec["cluster"]]
        return RedisCluster(startup_nodes=nodes, **options)
    module = redis.asyncio if aio else redis
    return module.Redis.from_url(spec["url"], **options)


def handles(kind: str, name: str, client: Any, cfg: Dict[str, Any], aio: bool,
            on_lost: Callable[[str, str], Callable[[Any], None]],
            passed: Callable[[str], Callable[[], None]] = lambda obj: lambda: None,
            ) -> Dict[str, Any]:
    """The objects a workload's actions name: ``a``/``b`` (two of one name, different
    ttls), ``c`` (a Condition), ``spare`` (a BoundedSemaphore nothing is taken through)."""
    mod = rlocks.asyncio if aio else rlocks
    common = dict(client=client, namespace=cfg["namespace"], fair=cfg["fair"],
                  entry_lease=cfg["entry_lease"])
    ttls = {"a": cfg["ttl"], "b": cfg["ttl2"]}
    made: Dict[str, Any] = {}
    for obj, ttl in ttls.items():
        each = dict(common, ttl=ttl, on_lost=on_lost(kind, obj))
        if kind == "rlock":
            made[obj] = mod.RLock(name, **each)
        elif kind == "lock":
            made[obj] = mod.Lock(name, **each)
        elif kind == "rw":
            rw = mod.RWLock(name, **each)
            made[obj + "r"], made[obj + "w"] = rw.read_lock, rw.write_lock
        elif kind == "sem":
            made[obj] = mod.Semaphore(name, cfg["permits"], **each)
        elif kind == "bsem":
            made[obj] = mod.BoundedSemaphore(name, cfg["permits"], **each)
    if kind == "bsem":
        made["spare"] = mod.BoundedSemaphore(name, cfg["permits"], **dict(common, ttl=cfg["ttl"]))
    if kind == "barrier":
        for obj in ("a", "b"):
            made[obj] = mod.Barrier(name, PARTIES, action=passed(obj), client=client,
                                    namespace=cfg["namespace"], entry_lease=cfg["entry_lease"])
        return made
    if kind == "cond":
        lock = mod.RLock(name, **dict(common, ttl=cfg["ttl"], on_lost=on_lost(kind, "c")))
        made["c"] = mod.Condition(lock)
        made["c.lock"] = lock
    return made


def handle_for(made: Dict[str, Any], obj: str, side: str) -> Any:
    return made[obj + side] if obj + side in made else made[obj]


def token_of(made: Dict[str, Any], obj: str, side: str) -> Optional[int]:
    if side == "p":
        return None
    target = made["c.lock"] if obj == "c" else handle_for(made, obj, side)
    return target.token


class Stop:
    def __init__(self, folder: str) -> None:
        self._path = os.path.join(folder, "stop")

    def __bool__(self) -> bool:
        return os.path.exists(self._path)


# -- one action, for either driver ----------------------------------------------------


class _Performer:
    """One action at a time, for either driver: ``steps(action)`` is a generator that
    yields ``(callable, args)`` to be called (or awaited) and receives the result, and
    returns the outcome after recording the event. The drivers only run the calls."""

    def __init__(self, kind: str, thread: str, made: Dict[str, Any], rec: Recorder,
                 fence: Any) -> None:
        self.kind, self.thread, self.made, self.rec, self.fence = kind, thread, made, rec, fence

    def steps(self, action: Any):  # -> Generator[Tuple[Callable, tuple], Any, str]
        kind, th, rec, made = self.kind, self.thread, self.rec, self.made
        base = dict(th=th, p=kind)
        inv = time.monotonic()
        try:
            if isinstance(action, Acquire):
                target = self._cond() if action.obj == "c" else handle_for(made, action.obj, action.side)
                got = yield (target.acquire, (True, action.timeout))
                o = "ok" if got else "false"
                tok = token_of(made, action.obj, action.side) if got else None
                rec(a="acquire", s=action.side, h=action.hold, d=action.depth, new=action.new,
                    inv=inv, ret=time.monotonic(), o=o, tok=tok, obj=action.obj, **base)
                return o
            if isinstance(action, Release):
                if action.end:
                    rec(a="release_call", s=action.side, h=action.hold, inv=inv, **base)
                target = self._cond() if action.obj == "c" else handle_for(made, action.obj, action.side)
                yield (target.release, ())
                o = "ok"
            elif isinstance(action, Write):
                tok = token_of(made, action.obj, action.side)
                if tok is None:
                    o = "false"
                else:
                    accepted = yield (self.fence, (list(_fence_keys()), [f"{kind}", tok, action.hold]))
                    o = "ok" if accepted else "refused"
                rec(a="write", s=action.side, h=action.hold, tok=tok, inv=inv,
                    ret=time.monotonic(), o=o, **base)
                return o
            elif isinstance(action, Owned):
                target = self._cond_lock() if action.obj == "c" else handle_for(made, action.obj, action.side)
                o = "ok" if target.owned() else "false"
                rec(a="owned", s=action.side, h=action.hold, t=inv, o=o, **base)
                return o
            elif isinstance(action, Wait):
                rec(a="wait_call", s="x", h=action.hold, inv=inv, to=action.timeout, **base)
                got = yield (made["c"].wait, (action.timeout,))
                o = "ok" if got else "false"
                tok = token_of(made, "c", "x")
                rec(a="wait", s="x", h=action.hold, new=action.new, inv=inv, ret=time.monotonic(),
                    o=o, tok=tok, to=action.timeout, **base)
                return o
            elif isinstance(action, Notify):
                cond = made["c"]
                if action.n:
                    yield (cond.notify, (action.n,))
                else:
                    yield (cond.notify_all, ())
                rec(a="notify", s="x", h=action.hold, n=action.n, inv=inv, ret=time.monotonic(),
                    o="ok", **base)
                return "ok"
            elif isinstance(action, Spurious):
                yield (made["spare"].release, ())
                o = "ok"
            elif isinstance(action, BarrierWait):
                rec(a="bwait_call", inv=inv, obj=action.obj, to=action.timeout, tid=_tid(),
                    **base)
                index = yield (made[action.obj].wait, (action.timeout,))
                rec(a="bwait", inv=inv, ret=time.monotonic(), o="ok", idx=index,
                    obj=action.obj, **base)
                return "ok"
            elif isinstance(action, BarrierReset):
                yield (made[action.obj].reset, ())
                rec(a="breset", inv=inv, ret=time.monotonic(), o="ok", **base)
                return "ok"
            else:
                raise TypeError(action)
        except BaseException as exc:  # noqa: BLE001 - every outcome is recorded
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            o = outcome(exc)
            extra = dict(x=type(exc).__name__, msg=str(exc)[:200])
            if isinstance(action, Acquire):
                rec(a="acquire", s=action.side, h=action.hold, d=action.depth, new=action.new,
                    inv=inv, ret=time.monotonic(), o=o, **extra, **base)
                return o
            if isinstance(action, Wait):
                rec(a="wait", s="x", h=action.hold, new=action.new, inv=inv,
                    ret=time.monotonic(), o=o, to=action.timeout, **extra, **base)
                return o
            if isinstance(action, (BarrierWait, BarrierReset)):
                rec(a="bwait" if isinstance(action, BarrierWait) else "breset", inv=inv,
                    ret=time.monotonic(), o=o, **extra, **base)
                return o
            self._record_end(action, inv, o, extra, base)
            return o
        self._record_end(action, inv, o, {}, base)
        return o

    def _record_end(self, action: Any, inv: float, o: str, extra: Dict[str, Any],
                    base: Dict[str, Any]) -> None:
        if isinstance(action, Release):
            self.rec(a="release", s=action.side, h=action.hold, end=action.end, inv=inv,
                     ret=time.monotonic(), o=o, **extra, **base)
        elif isinstance(action, Spurious):
            self.rec(a="spurious", s="p", inv=inv, ret=time.monotonic(), o=o, **extra, **base)
        else:
            self.rec(a="error", inv=inv, ret=time.monotonic(), o=o, what=type(action).__name__,
                     **extra, **base)

    def _cond(self) -> Any:
        return self.made["c"]

    def _cond_lock(self) -> Any:
        return self.made["c.lock"]


def _fence_keys() -> Tuple[str, str]:
    return FENCE_KEYS


def perform_blocking(performer: _Performer, action: Any) -> str:
    steps = performer.steps(action)
    value: Any = None
    try:
        while True:
            fn, args = steps.send(value)
            value = None
            try:
                value = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the steps to record
                fn, args = steps.throw(exc)
                raise AssertionError("an action makes one call") from None
    except StopIteration as done:
        return str(done.value)


async def perform_awaited(performer: _Performer, action: Any, cancel: float,
                          rng: random.Random) -> str:
    """As ``perform_blocking``, awaiting each call. With probability ``cancel`` an
    acquire or a release is cancelled after a random fraction of a second (in the task
    itself, as ``asyncio.timeout`` does), which records ``cancelled``."""
    steps = performer.steps(action)
    value: Any = None
    try:
        while True:
            fn, args = steps.send(value)
            value = None
            try:
                result = fn(*args)
                if asyncio.iscoroutine(result):
                    if isinstance(action, (Acquire, Release)) and rng.random() < cancel:
                        async with asyncio.timeout(rng.uniform(0.0, 0.05)):
                            result = await result
                    else:
                        result = await result
                value = result
            except BaseException as exc:  # noqa: BLE001 - handed to the steps to record
                if isinstance(exc, asyncio.CancelledError):
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # a real cancellation of the worker's task
                steps.throw(exc)
                raise AssertionError("an action makes one call") from None
    except StopIteration as done:
        return str(done.value)


def _between(action: Any) -> bool:
    """Whether the thread holds nothing before ``action`` (it may stop there)."""
    return isinstance(action, Acquire) and action.depth == 1 or isinstance(action, BarrierWait)


def _passed(rec: Recorder) -> Callable[[str], Callable[[], None]]:
    """The Barrier's action: it records the generation's pass (once per generation, by
    the last party to arrive, before any wait of the generation returns)."""
    return lambda obj: lambda: rec(a="bpass", p="barrier", obj=obj, t=time.monotonic(),
                                   tid=_tid())


def _tid() -> int:
    """Who runs this: the asyncio task, or the thread (the action runs in the wait of the
    party that arrived last, so its tid names that wait)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return id(task) if task is not None else threading.get_ident()


def _fence_call(store: Any) -> Any:
    script = store.register_script(FENCE)
    return lambda keys, args: script(keys=keys, args=args)


# -- the process ---------------------------------------------------------------------------


def main(config_path: str, worker: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)["worker"]
    folder = cfg["dir"]
    rec = Recorder(folder, worker)
    stop = Stop(folder)
    aio = cfg["driver"] == "asyncio"

    def on_lost(kind: str, obj: str) -> Callable[[Any], None]:
        return lambda _lock: rec(a="on_lost", p=kind, obj=obj, t=time.monotonic())

    plan: List[Tuple[str, str, int]] = []
    for kind in cfg["kinds"]:
        for i in range(cfg["threads"]):
            plan.append((kind, f"{worker}.{kind}{i}", i))
    if aio:
        asyncio.run(_main_async(cfg, worker, rec, stop, on_lost, plan))
    else:
        _main_threads(cfg, worker, rec, stop, on_lost, plan)


def _main_threads(cfg, worker, rec, stop, on_lost, plan) -> None:
    client = make_client(cfg["client"], aio=False)
    store = redis.Redis.from_url(cfg["store"], socket_timeout=10)
    fence = _fence_call(store)
    made = {kind: handles(kind, f"{cfg['name']}-{kind}", client, cfg, False, on_lost,
                          _passed(rec))
            for kind in cfg["kinds"]}
    rec(a="start", pid=os.getpid(), t=time.monotonic())
    threads = []
    for kind, thread, role in plan:
        performer = _Performer(kind, thread, made[kind], rec, fence)
        t = threading.Thread(target=_thread_loop, name=thread,
                             args=(performer, kind, thread, role, cfg, stop), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    rec(a="exit", t=time.monotonic())


def _thread_loop(performer: _Performer, kind: str, thread: str, role: int,
                 cfg: Dict[str, Any], stop: Stop) -> None:
    work = workload(kind, thread, cfg["seed"], Shape(**cfg["shape"]), role)
    result: Optional[str] = None
    while True:
        action = work.send(result)  # type: ignore[arg-type]
        if stop and _between(action):
            return
        if isinstance(action, Sleep):
            time.sleep(action.seconds)
            result = "ok"
        else:
            result = perform_blocking(performer, action)


async def _main_async(cfg, worker, rec, stop, on_lost, plan) -> None:
    client = make_client(cfg["client"], aio=True)
    store = redis.asyncio.Redis.from_url(cfg["store"], socket_timeout=10)
    fence = _fence_call(store)
    made = {kind: handles(kind, f"{cfg['name']}-{kind}", client, cfg, True, on_lost,
                          _passed(rec))
            for kind in cfg["kinds"]}
    rec(a="start", pid=os.getpid(), t=time.monotonic())
    tasks = []
    for kind, thread, role in plan:
        performer = _Performer(kind, thread, made[kind], rec, fence)
        tasks.append(asyncio.create_task(_task_loop(performer, kind, thread, role, cfg, stop),
                                         name=thread))
    await asyncio.gather(*tasks)
    rec(a="exit", t=time.monotonic())


async def _task_loop(performer: _Performer, kind: str, thread: str, role: int,
                     cfg: Dict[str, Any], stop: Stop) -> None:
    work = workload(kind, thread, cfg["seed"], Shape(**cfg["shape"]), role)
    rng = random.Random(f"{cfg['seed']}/{thread}/cancel")
    result: Optional[str] = None
    while True:
        action = work.send(result)  # type: ignore[arg-type]
        if stop and _between(action):
            return
        if isinstance(action, Sleep):
            await asyncio.sleep(action.seconds)
            result = "ok"
        else:
            result = await perform_awaited(performer, action, cfg["cancel"], rng)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
