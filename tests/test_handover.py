"""The engine on the queue-and-hand-over scripts (issue 12), across processes.

Dead waiters (killed while queued, or killed after being handed the primitive before
they could adopt it) delay the next holder at most the entry lease; a time-out or a
cancel racing a grant leaves no hold and passes it on; waiters of several processes are
served in arrival order; ``fair=False`` lets a free primitive be taken past the queue.
Every kind, on a single server and on the local cluster. Bounds come from the entry
lease (``entry_lease``, default ``ENTRY_LEASE``) and are polled with a deadline.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Dict, List, Tuple

import pytest
import redis

import rlocks
import rlocks.asyncio
from rlocks._engine import aio, identity, primitive, queued, waiting, wakehub
from rlocks._engine.keys import keys_for
from rlocks._engine.primitive import ENTRY_LEASE, Primitive
from rlocks._engine.scripts import run

from . import _procs
from ._servers import wait_until
from ._threads import hub_waiters, in_thread, joined, listening, parked, started

SPAWN = multiprocessing.get_context("spawn")
NS = "rlocks-handover-test"
ENTRY_S = ENTRY_LEASE
# A dead waiter's grant lives one entry lease; the survivor looks again at least every
# entry lease (its renewal every third of it tidies and hands over too); plus slack for a
# loaded machine, well under the 30 s holder lease a wrong fix would wait for.
BOUND = 2 * ENTRY_S + 3.0
_KEY_KIND = {"rlock": "rlock", "write": "rw", "read": "rw", "sem": "sem", "bsem": "sem"}


def _queue_key(kind: str, name: str) -> str:
    return keys_for(NS, _KEY_KIND[kind], name).queued()[2]


def _worker(spec: Dict[str, Any], kind: str, name: str, data: str, timeout: float = 60.0,
            hold: float = 0.0, fair: bool = True) -> Any:
    proc = SPAWN.Process(
        target=_procs.queue_worker, args=(spec, kind, name, NS, data, timeout, hold, fair)
    )
    proc.start()
    return proc


def _pids(client: Any, key: str) -> List[int]:
    return [int(x) for x in client.lrange(key, 0, -1)]


def _one_async(kind: str, name: str, client: Any, **options: Any) -> Any:
    """An asyncio primitive of ``kind`` ("rlock", "write" or "sem") on ``client``, built
    with ``options`` (e.g. ``entry_lease``)."""
    if kind == "rlock":
        return rlocks.asyncio.RLock(name, client=client, namespace=NS, **options)
    if kind == "write":
        return rlocks.asyncio.RWLock(name, client=client, namespace=NS, **options).write_lock
    return rlocks.asyncio.Semaphore(name, 1, client=client, namespace=NS, **options)


def _reap(*procs: Any) -> None:
    for proc in procs:
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except OSError:
                pass
            proc.kill()
        proc.join(10)


class _Scene:
    """A test's primitive ``(kind, name)`` held by this thread at every level it nests,
    and the worker processes queued on it. On exit, the workers still running are
    killed (stopped ones woken first) and the workers' data keys deleted."""

    def __init__(
        self, client: Any, kind: str, name: str, fair: bool = True, entry_lease: float = ENTRY_S
    ) -> None:
        self.client = client
        self.kind = kind
        self.name = name
        self.data = f"{NS}:data:{{{name}}}"  # the workers' lists: got, timed-out, errors
        self.queue = _queue_key(kind, name)
        self.procs: List[Any] = []
        _prim, acquire, self._release, self._nesting = _procs.make_mutex(
            kind, name, client, NS, ttl=30, fair=fair, entry_lease=entry_lease
        )
        for _ in range(self._nesting):
            assert acquire(timeout=10)

    def worker(self, spec: Dict[str, Any], **options: Any) -> Any:
        """Start a :func:`_procs.queue_worker` on the primitive (reaped on exit)."""
        proc = _worker(spec, self.kind, self.name, self.data, **options)
        self.procs.append(proc)
        return proc

    def release(self) -> None:
        """Release this thread's hold, every level of it."""
        for _ in range(self._nesting):
            self._release()

    def errors(self) -> Any:
        """What the workers reported failing (the assertion messages show it)."""
        return self.client.lrange(f"{self.data}:errors", 0, -1)

    def __enter__(self) -> "_Scene":
        return self

    def __exit__(self, *exc: Any) -> None:
        _reap(*self.procs)
        self.client.delete(f"{self.data}:got", f"{self.data}:errors", f"{self.data}:timed-out")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["killed-while-queued", "killed-after-hand-over"])
@pytest.mark.parametrize("kind", _procs.KINDS)
def test_a_dead_waiter_delays_the_next_holder_at_most_the_entry_lease(
    target: Tuple[Any, Dict[str, Any]], kind: str, mode: str, name: str
) -> None:
    client, spec = target
    with _Scene(client, kind, name) as scene:
        data, queue = scene.data, scene.queue
        victim = scene.worker(spec)
        wait_until(lambda: client.zcard(queue) == 1, 60, "the victim to queue")
        survivor = scene.worker(spec)
        wait_until(lambda: client.zcard(queue) == 2, 60, "the survivor to queue")
        entries = keys_for(NS, _KEY_KIND[kind], name).queued()[3]
        if mode == "killed-while-queued":
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(10)
        else:
            # Stopped, it cannot read its grant nor adopt it; killed once it was handed.
            os.kill(victim.pid, signal.SIGSTOP)
        began = time.monotonic()
        scene.release()
        if mode == "killed-after-hand-over":
            wait_until(lambda: any(k.startswith(b"g:") for k in client.hkeys(entries)), 10,
                       "the hand-over to the stopped victim")
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(10)
        wait_until(lambda: client.llen(f"{data}:got") == 1, BOUND, "the survivor's grant")
        assert time.monotonic() - began < BOUND
        survivor.join(30)
        assert survivor.exitcode == _procs.EXIT_OK, scene.errors()
        assert _pids(client, f"{data}:got") == [survivor.pid]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", _procs.KINDS)
def test_a_time_out_racing_a_grant_leaves_no_hold_and_passes_it_on(
    target: Tuple[Any, Dict[str, Any]], kind: str, name: str
) -> None:
    client, spec = target
    # The grant this process's release hands the stopped victim lives the releaser's entry
    # lease. At 2 s a loaded machine that ran the continued victim late let it end first:
    # the grant was revoked, the victim's acquire still returned True (no round trip for
    # a grant) and its release raised LockLostError, as for any hold paused past its
    # lease ([cluster-sem] failed so). 60 s: the race the test is about, time-out against
    # grant, stays; the victim's and the survivor's own entry leases stay 2 s.
    with _Scene(client, kind, name, entry_lease=60.0) as scene:
        data, queue = scene.data, scene.queue
        timeout = ENTRY_S / 2  # its deadline passes while stopped, before its grant's lease ends
        victim = scene.worker(spec, timeout=timeout)
        wait_until(lambda: client.zcard(queue) == 1, 60, "the victim to queue")
        os.kill(victim.pid, signal.SIGSTOP)
        queued_at = time.monotonic()
        survivor = scene.worker(spec)
        # By its entry (ids are host:pid:nonce): on a slow machine the stopped victim's
        # entry may have ended before the survivor's process got going (then the release
        # goes to the survivor; the checks below hold either way).
        wait_until(lambda: any(f":{survivor.pid}:".encode() in member
                               for member in client.zrange(queue, 0, -1)),
                   60, "the survivor to queue")
        scene.release()  # handed to the stopped victim
        wait_until(lambda: time.monotonic() - queued_at > timeout, 10, "the victim's deadline")
        os.kill(victim.pid, signal.SIGCONT)  # its time-out and its grant now race
        victim.join(30)
        assert victim.exitcode == _procs.EXIT_OK, scene.errors()
        wait_until(lambda: survivor.pid in _pids(client, f"{data}:got"), BOUND,
                   "the survivor's grant")
        survivor.join(30)
        assert survivor.exitcode == _procs.EXIT_OK
        # Whichever won, nothing is left held: the victim released, or passed it on.
        outcomes = _pids(client, f"{data}:got") + _pids(client, f"{data}:timed-out")
        assert sorted(outcomes) == sorted([victim.pid, survivor.pid])
        holds = {k: v for k, v in client.hgetall(keys_for(NS, _KEY_KIND[kind], name).hash)
                 .items() if not k.startswith(b"#")}
        assert holds == {}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", _procs.KINDS)
def test_waiting_processes_are_served_in_arrival_order(
    target: Tuple[Any, Dict[str, Any]], kind: str, name: str
) -> None:
    client, spec = target
    with _Scene(client, kind, name) as scene:
        for i in range(4):
            scene.worker(spec, hold=0.05)
            wait_until(lambda: client.zcard(scene.queue) == i + 1, 60, f"waiter {i} to queue")
        scene.release()
        for proc in scene.procs:
            proc.join(60)
            assert proc.exitcode == _procs.EXIT_OK, scene.errors()
        assert _pids(client, f"{scene.data}:got") == [proc.pid for proc in scene.procs]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", _procs.KINDS)
def test_an_unfair_primitive_wakes_its_waiter_which_takes_it(
    target: Tuple[Any, Dict[str, Any]], kind: str, name: str
) -> None:
    client, spec = target
    with _Scene(client, kind, name, fair=False) as scene:
        worker = scene.worker(spec, fair=False)
        wait_until(lambda: client.zcard(scene.queue) == 1, 60, "the waiter")
        began = time.monotonic()
        scene.release()
        # Woken ("w"), it asks again and takes the free primitive: no lease to wait for.
        wait_until(lambda: client.llen(f"{scene.data}:got") == 1, BOUND, "the woken waiter")
        assert time.monotonic() - began < BOUND
        worker.join(30)
        assert worker.exitcode == _procs.EXIT_OK


@pytest.mark.parametrize("fair", [True, False])
@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_fair_decides_whether_a_free_primitive_goes_past_the_queue(
    client: "redis.Redis[bytes]", kind: str, fair: bool, name: str
) -> None:
    prim, acquire, release, nesting = _procs.make_mutex(kind, name, client, NS, 30, fair=fair)
    other, try_other, release_other, _ = _procs.make_mutex(kind, name, client, NS, 30, fair=fair)
    for _ in range(nesting):
        assert acquire(timeout=10)
    # A waiter of another process (its entry made by the script itself) queues.
    ghost = "ghost:1:x"
    owner = f"{ghost}:1"
    if kind == "sem":
        args = [*prim._context(), owner, owner, ghost, 30000, 1, 1]
    else:
        args = [*prim._context(), owner, ghost, 30000, 1, 0, 1]
    assert run(client, prim._acquire_script, prim._keys.queued(), args).queued
    for _ in range(nesting):
        release()
    box: List[Any] = []

    def barge() -> None:
        box.append(try_other(blocking=False))
        if box[0]:
            release_other()

    thread = threading.Thread(target=barge)
    thread.start()
    thread.join(10)
    # Fair: the release handed it to the ghost, and a try never barges. Unfair: the
    # release only woke the ghost, so a try takes the free primitive.
    assert box == [not fair]
    client.delete(*prim._keys.queued()[:5])


@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_an_unfair_releaser_keeps_barging_while_the_woken_waiter_is_patient(
    client: "redis.Redis[bytes]", kind: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A patience far longer than the test: every release below falls within it.
    monkeypatch.setattr(Primitive, "_patience_ms", 600_000)
    prim, acquire, release, _ = _procs.make_mutex(kind, name, client, NS, 30, fair=False)
    assert acquire(timeout=10)
    ghost = "ghost:1:x"  # a waiter of another process that never asks again
    owner = f"{ghost}:1"
    if kind == "sem":
        args = [*prim._context(), owner, owner, ghost, 30000, 1, 1]
    else:
        args = [*prim._context(), owner, ghost, 30000, 1, 0, 1]
    assert run(client, prim._acquire_script, prim._keys.queued(), args).queued
    try:
        # The first release wakes the ghost; it and the later ones leave the primitive
        # free for the releasing process, section after section (the old rule handed it
        # to the ghost at the second release).
        for _ in range(5):
            release()
            assert acquire(blocking=False)
        release()
        assert client.zrange(prim._keys.queued()[2], 0, -1) == [ghost.encode()]
    finally:
        client.delete(*prim._keys.queued()[:5])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["rlock", "write", "sem"])
def test_an_unfair_primitive_hammered_by_one_thread_starves_no_waiter(
    redis_url: str, kind: str, name: str
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    data = f"{NS}:data:{{{name}}}"
    _prim, acquire, release, _ = _procs.make_mutex(kind, name, client, NS, 30, fair=False)
    stop = threading.Event()
    errors: List[BaseException] = []
    local: List[bool] = []

    def hammer() -> None:
        # re-acquires the moment it releases, as a busy worker does
        try:
            while not stop.is_set():
                assert acquire(timeout=60)
                # Busy most of the time, as a loaded lock is: a waiter's periodic re-check
                # then rarely finds it free, so only the hand-over can serve it.
                time.sleep(0.02)
                release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    def local_waiter() -> None:
        try:
            got = acquire(timeout=20)
            local.append(got)
            if got:
                release()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=hammer)]
    threads[0].start()
    worker = _worker({"url": redis_url}, kind, name, data, timeout=20, fair=False)
    try:
        # a waiter of another process and one of this process both get their turn
        wait_until(lambda: client.llen(f"{data}:got") == 1 or not worker.is_alive(), 90,
                   "the other process's waiter")
        threads.append(threading.Thread(target=local_waiter))
        threads[1].start()
        threads[1].join(90)
        worker.join(30)
        assert worker.exitcode == _procs.EXIT_OK, client.lrange(f"{data}:errors", 0, -1)
        assert _pids(client, f"{data}:got") == [worker.pid]
        assert local == [True]
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        _reap(worker)
        client.delete(f"{data}:got", f"{data}:errors", f"{data}:timed-out")
        client.close()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("kind", ["rlock", "write", "sem"])
def test_an_unfair_thread_does_not_queue_behind_its_own_process_s_waiters(
    client: "redis.Redis[bytes]", kind: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Primitive, "_patience_ms", 600_000)
    prim, acquire, release, _ = _procs.make_mutex(kind, name, client, NS, 30, fair=False)
    assert acquire(timeout=10)
    queue = prim._keys.queued()[2]
    # the queue head: a waiter of another process that never asks again
    ghost = "ghost:1:x"
    owner = f"{ghost}:1"
    if kind == "sem":
        args = [*prim._context(), owner, owner, ghost, 30000, 1, 1]
    elif kind == "write":
        args = [*prim._context(), owner, ghost, "w", 30000, 1, 0, 1]
    else:
        args = [*prim._context(), owner, ghost, 30000, 1, 0, 1]
    assert run(client, prim._acquire_script, prim._keys.queued(), args).queued
    box: List[Any] = []

    def wait_behind() -> None:
        try:
            got = acquire(timeout=3)
            box.append(got)
            if got:  # its re-check found the primitive free: that is barging too
                release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            box.append(exc)

    thread = threading.Thread(target=wait_behind)
    thread.start()
    try:
        wait_until(lambda: client.zcard(queue) == 2, 30, "this process's waiter to queue")
        # The release only wakes the ghost (patient for long): the primitive stays free.
        release()
        # A blocking acquire of another thread of this process tries first, as any
        # barger: it does not line up behind the local waiter (which would wait for
        # the ghost's turn to come and go).
        assert acquire(timeout=2)
        release()
        thread.join(30)
        assert box in ([False], [True])
    finally:
        thread.join(30)
        client.delete(*prim._keys.queued()[:5])


def test_an_unfair_asyncio_lock_hammered_by_one_task_starves_no_other(
    redis_url: str, name: str
) -> None:
    async def main() -> None:
        import redis.asyncio as aredis

        client = aredis.Redis.from_url(redis_url, socket_timeout=10)
        lock = rlocks.asyncio.RLock(name, client=client, ttl=30, namespace=NS, fair=False)
        stop = asyncio.Event()

        async def hammer() -> int:
            n = 0
            while not stop.is_set():
                assert await lock.acquire(timeout=60)
                n += 1
                await lock.release()
            return n

        async def wait_once() -> bool:
            got = bool(await lock.acquire(timeout=60))
            if got:
                await lock.release()
            return got

        busy = asyncio.ensure_future(hammer())
        try:
            # the waiter is handed the lock although the hammer re-acquires at once
            assert await asyncio.wait_for(wait_once(), 90)
        finally:
            stop.set()
        assert await asyncio.wait_for(busy, 60) > 0
        await client.aclose()

    asyncio.run(main())


def test_fair_must_be_a_bool(client: "redis.Redis[bytes]", name: str) -> None:
    for make in (
        lambda: rlocks.RLock(name, client=client, fair="yes"),  # type: ignore[arg-type]
        lambda: rlocks.RWLock(name, client=client, fair=1),  # type: ignore[arg-type]
        lambda: rlocks.Semaphore(name, 2, client=client, fair=None),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match="fair must be a bool"):
            make()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["rlock", "write", "sem"])
def test_a_head_waiter_timing_out_keeps_its_process_place(
    redis_url: str, kind: str, name: str
) -> None:
    """The thread holding its process's queue entry times out while another thread of the
    process still waits: the entry is re-pointed to that thread, keeping its place ahead
    of a process that queued later, which is then served after it."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    data = f"{NS}:data:{{{name}}}"
    prim, acquire, release, nesting = _procs.make_mutex(kind, name, client, NS, ttl=30)
    queue = _queue_key(kind, name)
    hub = waiting.hub_for(client, NS)
    for _ in range(nesting):
        assert acquire(timeout=10)
    results: Dict[str, Any] = {}
    got_b = threading.Event()
    leave_b = threading.Event()

    def local(tag: str, timeout: float) -> None:
        try:
            ok = results[tag] = acquire(timeout=timeout)
            if ok and tag == "b":
                got_b.set()
                assert leave_b.wait(30)
                release()
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            results[tag] = exc
            got_b.set()

    a = threading.Thread(target=local, args=("a", 3.0))
    a.start()
    wait_until(lambda: client.zcard(queue) == 1, 15, "A to queue")
    b = threading.Thread(target=local, args=("b", 60.0))
    b.start()
    wait_until(lambda: len(hub._channels[prim._channel()].waiters) == 2, 15, "B to wait")
    other = _worker({"url": redis_url}, kind, name, data)
    try:
        wait_until(lambda: client.zcard(queue) == 2, 60, "the other process to queue")
        a.join(30)
        assert results.get("a") is False, results
        mine = hub.entry.encode()
        # Without the re-pointing, A's leave took the entry out and B queued at the tail.
        assert client.zrange(queue, 0, -1)[0] == mine, client.zrange(queue, 0, -1)
        for _ in range(nesting):
            release()
        assert got_b.wait(30) and results.get("b") is True, results
        assert client.llen(f"{data}:got") == 0, "the later process was served first"
        leave_b.set()
        wait_until(lambda: client.llen(f"{data}:got") == 1, 30, "the other process's turn")
        other.join(30)
        assert other.exitcode == _procs.EXIT_OK, client.lrange(f"{data}:errors", 0, -1)
    finally:
        leave_b.set()
        b.join(30)
        _reap(other)
        client.delete(f"{data}:got", f"{data}:errors", f"{data}:timed-out")
        client.close()


@pytest.mark.timeout(120)
def test_two_local_waiters_timing_out_together_pass_the_place_to_the_third(
    redis_url: str, name: str
) -> None:
    """The head and the thread it names time out at about the same time (either may
    stop first): the process's entry ends up named to the third thread, which keeps the
    process's place ahead of a process that queued later."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    data = f"{NS}:data:{{{name}}}"
    lock = rlocks.RLock(name, client=client, namespace=NS)
    queue = _queue_key("rlock", name)
    hub = waiting.hub_for(client, NS)
    assert lock.acquire()
    results: Dict[str, Any] = {}

    def local(tag: str, timeout: float) -> None:
        try:
            ok = results[tag] = lock.acquire(timeout=timeout)
            if ok:
                lock.release()
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            results[tag] = exc

    threads = {tag: threading.Thread(target=local, args=(tag, t))
               for tag, t in (("a", 2.0), ("b", 2.0), ("c", 60.0))}
    threads["a"].start()
    wait_until(lambda: client.zcard(queue) == 1, 15, "A to queue")
    for k, tag in enumerate("bc"):
        threads[tag].start()
        wait_until(lambda: len(hub._channels[lock._channel()].waiters) == 2 + k, 15, "to wait")
    other = _worker({"url": redis_url}, "rlock", name, data)
    try:
        wait_until(lambda: client.zcard(queue) == 2, 60, "the other process to queue")
        threads["a"].join(30)
        threads["b"].join(30)
        assert results.get("a") is False and results.get("b") is False, results
        mine = hub.entry.encode()
        wait_until(lambda: client.zrange(queue, 0, -1)[:1] == [mine], 10,
                   "C to hold the process's place")
        lock.release()
        threads["c"].join(30)
        assert results.get("c") is True, results
        other.join(30)
        assert other.exitcode == _procs.EXIT_OK, client.lrange(f"{data}:errors", 0, -1)
    finally:
        _reap(other)
        client.delete(f"{data}:got", f"{data}:errors", f"{data}:timed-out")
        client.close()


def test_an_asyncio_head_task_timing_out_keeps_its_process_place(
    redis_url: str, name: str
) -> None:
    """The asyncio twin: the entry passes to the next task of the process."""
    client = redis.Redis.from_url(redis_url)
    queue = _queue_key("rlock", name)
    holder = rlocks.RLock(name, client=client, namespace=NS)
    assert holder.acquire()

    async def main() -> List[Any]:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        lock = rlocks.asyncio.RLock(name, client=aclient, namespace=NS)
        order: List[Any] = []

        async def task(tag: str, timeout: float) -> None:
            ok = await lock.acquire(timeout=timeout)
            order.append((tag, ok))
            if ok:
                await lock.release()

        first = asyncio.ensure_future(task("a", 2.0))
        while not await aclient.zcard(queue):
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(task("b", 60.0))
        await asyncio.sleep(0.05)  # let B register behind A
        # a queue entry of another process, behind this one's
        await aclient.zadd(queue, {"another-process": 1e15})
        await first
        head = (await aclient.zrange(queue, 0, 0))[0]
        order.append(head.decode() == aio.async_hub_for(aclient, NS).entry)
        await aclient.zrem(queue, "another-process")
        holder.release()  # (a sync call on the loop: this thread holds it)
        await second
        await aclient.aclose()
        return order

    order = asyncio.run(main())
    assert order == [("a", False), True, ("b", True)], order
    client.close()


@pytest.mark.parametrize(
    "bad, error",
    [(True, TypeError), ("2", TypeError), (None, TypeError), (0, ValueError),
     (0.005, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
     (float("inf"), ValueError)],
)
def test_entry_lease_is_checked_before_any_io(bad: Any, error: type, name: str) -> None:
    # No server at that port: a Redis call would fail with a ConnectionError instead.
    dead = redis.Redis(port=1, socket_connect_timeout=0.2)
    for make in (
        lambda: rlocks.RLock(name, client=dead, entry_lease=bad),
        lambda: rlocks.RWLock(name, client=dead, entry_lease=bad),
        lambda: rlocks.Semaphore(name, 2, client=dead, entry_lease=bad),
        lambda: rlocks.BoundedSemaphore(name, 2, client=dead, entry_lease=bad),
        lambda: rlocks.asyncio.RLock(name, client=redis.asyncio.Redis(port=1), entry_lease=bad),
    ):
        with pytest.raises(error, match="entry_lease"):
            make()


@pytest.mark.parametrize("kind", ["rlock", "read", "sem"])
def test_the_entry_lease_is_the_one_the_constructor_was_given(
    client: "redis.Redis[bytes]", name: str, kind: str
) -> None:
    """A queued entry, and a hand-over grant until adopted, live ``entry_lease``."""

    def make(**kw: Any) -> Tuple[Any, Any]:
        if kind == "rlock":
            lock = rlocks.RLock(name, client=client, namespace=NS, **kw)
            return lock, lock
        if kind == "read":
            rw = rlocks.RWLock(name, client=client, namespace=NS, **kw)
            return rw.read_lock, rw.write_lock
        sem = rlocks.Semaphore(name, 1, client=client, namespace=NS, **kw)
        return sem, sem

    waiting, _ = make(entry_lease=0.25)
    _, holding = make()
    assert waiting._entry_ms == 250
    queue, times = waiting._keys.queued()[2], waiting._keys.queued()[4]
    assert holding.acquire()
    results: List[Any] = []

    def waiter() -> None:
        try:
            results.append(waiting.acquire(timeout=20))
            waiting.release()
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            results.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        wait_until(lambda: client.zcard(queue) == 1, 15, "the waiter to queue")
        (member, ends), = client.zrange(times, 0, -1, withscores=True)
        assert member.startswith(b"e:")
        secs, micros = client.time()
        left = ends - (secs * 1000 + micros // 1000)
        assert 0 < left <= 250, left  # the default (2 s) would leave up to 2000 ms
    finally:
        holding.release()
        thread.join(20)
    assert results == [True]


# The cancel-racing-a-grant test's entry lease, and its bound on the cancel, the give-back
# and task c's turn: a few round trips normally, the whole entry lease on the bug; the
# bound leaves a loaded machine seconds of slack and is a third of what the bug costs.
CANCEL_LEASE_S = 30.0
CANCEL_BOUND_S = 10.0


@pytest.mark.parametrize("kind", ["rlock", "write", "sem"])
def test_a_cancel_racing_a_grant_gives_it_back_and_the_next_task_gets_it(
    redis_url: str, kind: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race needs b granted by a's release reply and not run since: b must wait for
    # the hub, not read its own line from the list (it would then run at once).
    monkeypatch.setattr(wakehub.WakeHub, "listen", lambda self, waiter: False)

    async def main() -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10)

        # A long entry lease makes the bug cost far more than the bound below allows: a
        # grant b kept instead of giving it back would stand until its entry lease ran
        # out (30 s), while giving it back takes a few round trips.
        a, b, c = (_one_async(kind, name, client, entry_lease=CANCEL_LEASE_S)
                   for _ in range(3))
        assert await a.acquire()
        queue = a._keys.queued()[2]
        task_b = asyncio.ensure_future(b.acquire())
        deadline = time.monotonic() + 20
        while await client.zcard(queue) != 1:
            assert time.monotonic() < deadline, "task b never queued"
            await asyncio.sleep(0.01)
        seen: List[Any] = []

        async def take_c() -> bool:
            got = bool(await c.acquire())
            seen.append({k: v for k, v in (await client.hgetall(a._keys.hash)).items()
                         if not k.startswith(b"#")})
            await c.release()
            return got

        task_c = asyncio.ensure_future(take_c())
        hub = aio.async_hub_for(client, NS)
        while len(hub._channels[a._channel()].waiters) != 2:
            assert time.monotonic() < deadline, "task c never waited"
            await asyncio.sleep(0.01)
        await a.release()  # hands it to b (its reply signals b at once)...
        head = hub._channels[a._channel()].waiters[0]
        assert head.state == wakehub.GRANTED
        task_b.cancel()  # ...and b is cancelled before it ran again
        cancelled = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task_b
        done, _ = await asyncio.wait([task_c], timeout=CANCEL_BOUND_S)
        # Given back at once by b, not revoked when its grant's entry lease ran out.
        assert task_c in done, f"task c waited over {CANCEL_BOUND_S} s: b kept its grant"
        assert task_c.result()
        assert time.monotonic() - cancelled < CANCEL_BOUND_S
        assert len(seen[0]) == 1  # c's hold, and nothing of b's
        assert not await client.exists(a._keys.hash)
        await client.aclose()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", _procs.KINDS)
def test_alternating_processes_never_wait_out_the_entry_lease(
    client: "redis.Redis[bytes]", redis_url: str, kind: str, name: str
) -> None:
    # Two processes take turns with short holds: every wait is about one critical section
    # and one hand-over. (A direct grant once made the hub drop the next hand-over's line,
    # so every later wait ran into the entry-lease re-check: 2 s each.)
    data = f"{NS}:data:{{{name}}}"
    spec = {"url": redis_url}
    workers = [
        SPAWN.Process(target=_procs.alternating_worker, args=(spec, kind, name, NS, data, 40))
        for _ in range(2)
    ]
    try:
        for proc in workers:
            proc.start()
        for proc in workers:
            proc.join(120)
            assert proc.exitcode == _procs.EXIT_OK, client.lrange(f"{data}:errors", 0, -1)
        longest = [float(x) for x in client.lrange(f"{data}:longest", 0, -1)]
        assert len(longest) == 2 and max(longest) < ENTRY_S / 2, longest
    finally:
        _reap(*workers)
        client.delete(f"{data}:longest", f"{data}:errors")


def _handed_pair(kind: str, name: str, client: Any, **waiting_options: Any) -> Tuple[Any, Any]:
    """(the object a thread waits on, the object this thread holds it through): one
    primitive's name; the holder's entry lease is short, the waiter's as given."""
    if kind == "rlock":
        return (rlocks.RLock(name, client=client, namespace=NS, ttl=10, **waiting_options),
                rlocks.RLock(name, client=client, namespace=NS, entry_lease=0.25))
    waiting_rw = rlocks.RWLock(name, client=client, namespace=NS, ttl=10, **waiting_options)
    holding_rw = rlocks.RWLock(name, client=client, namespace=NS, entry_lease=0.25)
    waiting = waiting_rw.read_lock if kind == "read" else waiting_rw.write_lock
    return waiting, holding_rw.write_lock


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "write", "read"])
def test_a_handed_lock_returns_at_once_and_its_renewer_adopts_the_grant(
    target: Tuple[Any, Dict[str, Any]], kind: str, name: str
) -> None:
    """A lock's waiter handed the lock returns with no round trip after its wake-up: the
    grant is still unadopted on the server when acquire returns. It lives the waiter's
    own entry lease (not the releaser's shorter one), and the waiter's renewer adopts it
    and extends it to the ttl well before that ends: nobody else gets in meanwhile."""
    client, _ = target
    waiting, holding = _handed_pair(kind, name, client, entry_lease=6.0)
    keys = waiting._keys.queued()
    hash_key, queue, entries, times = keys[0], keys[2], keys[3], keys[4]
    seen: Dict[str, Any] = {}
    done = threading.Event()

    def waiter() -> None:
        try:
            seen["got"] = waiting.acquire(timeout=20)
            owner = identity.thread_owner()
            seen["marker"] = client.hexists(entries, f"g:{owner}")
            seen["owner"] = owner
            assert done.wait(30)
            waiting.release()
            # the release adopted it: the next acquire of the owner need not adopt first
            seen["pending"] = waiting._hold_key(owner)[1:] in primitive._unadopted
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            seen["error"] = exc

    assert holding.acquire(timeout=10)
    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        wait_until(lambda: client.zcard(queue) == 1, 15, "the waiter to queue")
        holding.release()
        secs, micros = client.time()
        released = secs * 1000 + micros // 1000
        wait_until(lambda: "owner" in seen or "error" in seen, 15, "the waiter to return")
        assert seen.get("got") is True, seen
        assert seen["marker"], "the grant was adopted before acquire returned"
        owner = seen["owner"]
        field = owner if kind == "rlock" else f"{'r' if kind == 'read' else 'w'}:{owner}"
        grant_end = client.zscore(times, f"g:{owner}")
        if grant_end is not None:  # (None: the renewer adopted it already)
            assert grant_end - released > 1000, "the grant lives the releaser's lease"
        wait_until(lambda: not client.hexists(entries, f"g:{owner}"), 10,
                   "the renewer to adopt the grant")
        secs, micros = client.time()
        left = client.zscore(keys[1], field) - (secs * 1000 + micros // 1000)
        assert left > 6000, left  # extended to the ttl (10 s), past the entry lease
        other = rlocks.RLock(name, client=client, namespace=NS) if kind == "rlock" else (
            rlocks.RWLock(name, client=client, namespace=NS).write_lock)
        assert not other.acquire(blocking=False)
        assert client.hget(hash_key, field) == b"1"
    finally:
        done.set()
        thread.join(20)
    assert "error" not in seen, seen
    assert seen["pending"] is False
    assert {k for k in client.hkeys(hash_key) if not k.startswith(b"#")} == set()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("second_client", ["same", "other"])
def test_another_object_acquiring_before_the_renewer_adopted_adds_its_level(
    client: "redis.Redis[bytes]", redis_url: str, name: str, second_client: str
) -> None:
    """Re-entry through a second object of the name (on the same client or another),
    while the thread's hand-over grant is recorded but not adopted yet, adds a level on
    the server: it is not taken for a waiter's re-check (ADOPTED, nothing added), so the
    outer hold outlives the inner."""
    first, holding = _handed_pair("rlock", name, client, entry_lease=6.0)
    other_client = client if second_client == "same" else redis.Redis.from_url(redis_url)
    second = rlocks.RLock(name, client=other_client, namespace=NS)
    hash_key, queue, entries = first._keys.hash, first._keys.queued()[2], first._keys.queued()[3]
    seen: Dict[str, Any] = {}
    inner = threading.Event()
    done = threading.Event()

    def waiter() -> None:
        try:
            assert first.acquire(timeout=20)
            owner = identity.thread_owner()
            seen["marker"] = client.hexists(entries, f"g:{owner}")
            assert second.acquire(timeout=5)
            seen["levels"] = client.hget(hash_key, owner)
            second.release()
            inner.set()
            assert done.wait(30)
            first.release()
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            seen["error"] = exc
            inner.set()

    assert holding.acquire(timeout=10)
    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        wait_until(lambda: client.zcard(queue) == 1, 15, "the waiter to queue")
        holding.release()
        assert inner.wait(20)
        assert "error" not in seen, seen
        assert seen["marker"], "the grant was adopted before acquire returned"
        assert seen["levels"] == b"2"
        other = rlocks.RLock(name, client=redis.Redis.from_url(redis_url), namespace=NS)
        assert not other.acquire(blocking=False), "the inner release freed the outer hold"
    finally:
        done.set()
        thread.join(20)
    assert "error" not in seen, seen


def test_a_grant_is_kept_unadopted_only_when_it_is_surely_this_waits_and_young(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """The fast path's rule (no I/O): the grant line's token must be above the one the
    waiter's last QUEUED reply reported (an older line, read late, is of a grant made
    before, maybe revoked since), most of the entry lease must be left, something must
    renew it, and a semaphore (whose hold does not prove its grant) always adopts."""
    from rlocks._engine.queued import RENEW_SLACK, _AcquireState, _short_lease_end

    lock = rlocks.RLock(name, client=client, namespace=NS, entry_lease=3.0)
    st = _AcquireState()
    assert _short_lease_end(lock, st, 5) is None  # never queued: no basis
    now = time.monotonic()
    st.basis = (now, 100)
    end = _short_lease_end(lock, st, 101)
    assert end is not None and abs(end - (now + 3.0)) < 1e-6
    assert _short_lease_end(lock, st, 100) is None  # not above the QUEUED reply's token
    st.basis = (now - 3.0 + RENEW_SLACK - 0.05, 100)
    assert _short_lease_end(lock, st, 101) is None  # too little of the lease left
    st.basis = (now, 100)
    unrenewed = rlocks.RLock(name, client=client, namespace=NS, auto_renew=False)
    assert _short_lease_end(unrenewed, st, 101) is None
    sem = rlocks.Semaphore(name, 1, client=client, namespace=NS)
    assert _short_lease_end(sem, st, 101) is None
    short = rlocks.RLock(name, client=client, namespace=NS, entry_lease=1.0)
    assert _short_lease_end(short, st, 101) is None  # 1 s leaves the renewer no slack


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry_lease", [2.0, 1.0], ids=["kept-unadopted", "adopted-first"])
def test_a_hold_handed_over_after_a_long_wait_is_renewed_from_its_grant(
    client: "redis.Redis[bytes]", name: str, entry_lease: float
) -> None:
    """The renewer counts a handed hold's lease from the grant, not from the acquire
    that waited for it. Counted from the acquire, a wait longer than the ttl left the
    lease's end already past (one failed renewal: a loss) and its renewal due at once,
    which, racing the holder's release, reported a false loss (bug hunt). Both ways of
    taking the grant: kept on its short lease (the default entry lease), and adopted
    before returning (1 s leaves the renewer too little of a short lease to keep)."""
    holder = rlocks.RLock(name, client=client, namespace=NS, ttl=1.0)
    waiting = rlocks.RLock(name, client=client, namespace=NS, ttl=1.0, entry_lease=entry_lease)
    holder.acquire()

    def wait_for_it() -> float:
        began = time.monotonic()
        assert waiting.acquire(timeout=30)
        try:
            assert time.monotonic() - began > 1.0  # waited longer than the ttl
            lease = waiting._holds[identity.thread_owner()].lease
            assert lease is not None
            return lease.expires - time.monotonic()
        finally:
            waiting.release()

    thread, out = started(wait_for_it)
    wait_until(lambda: bool(hub_waiters(waiting)), 10, "the waiter to wait")
    time.sleep(1.5)  # the holder's renewer keeps its hold
    holder.release()
    # (the end as the renewer counts it; a ttl away at most, at least most of it)
    assert joined(thread, out) > 0.5


@pytest.mark.timeout(60)
def test_an_asyncio_waiter_handed_the_lock_returns_at_once_and_its_renewer_adopts_it(
    redis_url: str, name: str
) -> None:
    """The same on the asyncio twin: the waiting task returns before anything adopted its
    grant, and the renewer task adopts it and extends it to the ttl in time."""
    check = redis.Redis.from_url(redis_url)

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        waiting = rlocks.asyncio.RLock(name, client=client, namespace=NS, ttl=10,
                                       entry_lease=6.0)
        holding = rlocks.asyncio.RLock(name, client=client, namespace=NS, entry_lease=0.25)
        keys = waiting._keys.queued()
        entries, queue = keys[3], keys[2]
        assert await holding.acquire()
        seen: Dict[str, Any] = {}
        release = asyncio.Event()

        async def waiter() -> None:
            assert await waiting.acquire(timeout=20)
            owner = identity.task_owner()
            seen["owner"] = owner
            seen["marker"] = await client.hexists(entries, f"g:{owner}")
            await release.wait()
            await waiting.release()

        task = asyncio.ensure_future(waiter())
        try:
            for _ in range(1500):
                if await client.zcard(queue) == 1:
                    break
                await asyncio.sleep(0.01)
            await holding.release()
            for _ in range(1500):
                if "marker" in seen or task.done():
                    break
                await asyncio.sleep(0.01)
            assert seen.get("marker"), "the grant was adopted before acquire returned"
            owner = seen["owner"]
            for _ in range(1000):
                if not await client.hexists(entries, f"g:{owner}"):
                    break
                await asyncio.sleep(0.01)
            assert not await client.hexists(entries, f"g:{owner}"), "never adopted"
            secs, micros = await client.time()
            left = await client.zscore(keys[1], owner) - (secs * 1000 + micros // 1000)
            assert left > 6000, left
            other = rlocks.RLock(name, client=check, namespace=NS)
            assert not other.acquire(blocking=False)
        finally:
            release.set()
            await asyncio.wait_for(task, 20)
            await client.aclose()

    asyncio.run(main())
    assert {k for k in check.hkeys(keys_for(NS, "rlock", name).hash)
            if not k.startswith(b"#")} == set()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_process_stopped_right_after_a_hand_over_loses_the_lock_and_knows_it(
    target: Tuple[Any, Dict[str, Any]], kind: str, name: str
) -> None:
    """A waiter returns from a hand-over before its grant is adopted; stopped right then
    (SIGSTOP, before its renewer adopts the grant), it keeps the others out at most the
    grant's short lease (its entry lease). The next process then gets the lock, and the
    stopped one, continued, finds its hold lost (LockLostError on release): never two
    holders that both believe they hold it."""
    client, spec = target
    entry = 3.0
    with _Scene(client, kind, name) as scene:
        data, queue = scene.data, scene.queue
        victim = SPAWN.Process(target=_procs.stop_after_grant_worker,
                               args=(spec, kind, name, NS, data, entry))
        victim.start()
        scene.procs.append(victim)
        wait_until(lambda: client.zcard(queue) == 1, 60, "the victim to queue")
        scene.release()  # handed to the victim, which stops at once
        wait_until(lambda: _stopped(victim.pid), 20, "the victim to stop itself")
        began = time.monotonic()
        _prim, acquire, release, _nesting = _procs.make_mutex(kind, name, client, NS, ttl=30)
        assert acquire(timeout=entry + 20), "the stopped victim kept the lock"
        assert time.monotonic() - began < entry + 5.0
        os.kill(victim.pid, signal.SIGCONT)
        victim.join(30)
        assert victim.exitcode == _procs.EXIT_OK, scene.errors()
        assert _pids(client, f"{data}:lost") == [victim.pid]
        assert _pids(client, f"{data}:kept") == []
        # the survivor's hold is intact: the victim's release took nothing of it
        owner = identity.thread_owner()
        field = owner if kind == "rlock" else f"w:{owner}"
        assert client.hget(keys_for(NS, _KEY_KIND[kind], name).hash, field) == b"1"
        release()
        client.delete(f"{data}:lost", f"{data}:kept")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_two_clients_of_one_process_keep_their_own_places(
    redis_url: str, name: str, kind: str
) -> None:
    """Two objects of one name on two clients in one process have two wake-up hubs, so
    two heads: each queues as its own entry. (With one entry per process, the second
    head's queueing call re-pointed the entry to itself, the first lost its place with
    no word, and waited for its re-check, 1-2 s, after a hand-over of milliseconds: bug
    hunt 9.)"""
    def make(client: Any) -> Any:
        if kind == "rlock":
            return rlocks.RLock(name, client=client, namespace=NS, deadlock_timeout=None)
        return rlocks.Semaphore(name, 1, client=client, namespace=NS)

    clients = [redis.Redis.from_url(redis_url) for _ in range(3)]
    holder, first, second = (make(c) for c in clients)
    queue = _queue_key(kind, name)
    got: Dict[str, float] = {}

    def wait(tag: str, lock: Any) -> None:
        assert lock.acquire(timeout=30)
        got[tag] = time.monotonic()
        time.sleep(0.1)
        lock.release()

    assert holder.acquire()
    threads = [threading.Thread(target=wait, args=("first", first))]
    threads[0].start()
    wait_until(lambda: clients[0].zcard(queue) == 1, 15, "the first to queue")
    threads.append(threading.Thread(target=wait, args=("second", second)))
    threads[1].start()
    wait_until(lambda: clients[0].zcard(queue) == 2, 15, "the second to queue as well")
    holder.release()
    for thread in threads:
        thread.join(30)
    assert set(got) == {"first", "second"}
    # FIFO across the two hubs, each handed over as soon as the one before released
    assert got["first"] < got["second"] < got["first"] + 1.0, got
    for c in clients:
        c.close()


# -- wake-up lines read from the entry's list ----------------------------------------------


def _takes_and_releases(prim: Any) -> Tuple[threading.Thread, List[bool]]:
    """A started thread that acquires ``prim`` (30 s at most), notes the result in the
    returned list, and releases it."""
    got: List[bool] = []

    def wait() -> None:
        got.append(prim.acquire(timeout=30))
        if got[-1]:
            prim.release()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, got


def _blocked(admin: Any, client_name: str) -> int:
    """How many connections named ``client_name`` wait in a blocking command now (CLIENT
    LIST flag ``b``; ``cmd`` is only the last command, which an idle pooled connection
    that once ran a BLPOP keeps showing)."""
    return sum(c.get("name") == client_name and "b" in c.get("flags", "")
               for c in admin.client_list())


def _one(kind: str, name: str, client: Any) -> Any:
    if kind == "rlock":
        return rlocks.RLock(name, client=client, namespace=NS)
    if kind == "write":
        return rlocks.RWLock(name, client=client, namespace=NS).write_lock
    return rlocks.Semaphore(name, 1, client=client, namespace=NS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "write", "sem"])
def test_a_listening_waiter_reads_its_grant_from_the_list_and_nothing_is_published(
    client: "redis.Redis[bytes]", kind: str, name: str
) -> None:
    holder, other = _one(kind, name, client), _one(kind, name, client)
    hub = waiting.hub_for(client, NS)
    channel = holder._channel()
    spy = client.pubsub()
    spy.subscribe(channel)
    assert spy.get_message(timeout=5)["type"] == "subscribe"
    assert holder.acquire()
    thread, got = _takes_and_releases(other)
    wait_until(lambda: hub._listener is not None and client.zcard(_queue_key(kind, name)) == 1,
               15, "the waiter to queue as the hub's listener")
    holder.release()
    thread.join(30)
    assert got == [True]
    # Its grant line went to the entry's list only: nobody subscribed to the channel heard
    # it (the hub would have had to wake and switch to the waiting thread).
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        message = spy.get_message(timeout=0.1)
        assert message is None, message
    assert hub._listener is None  # the wait is over: the slot is free again
    spy.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_line_left_from_an_earlier_place_in_the_queue_never_grants_a_new_wait(
    client: "redis.Redis[bytes]", kind: str, name: str
) -> None:
    # A grant whose line stayed in the list (its waiter learnt of it from a reply) must
    # not grant the next wait of the same thread: the new place deletes the list. Token
    # above any real one: the waiter would keep such a grant without asking Redis.
    holder, other = _one(kind, name, client), _one(kind, name, client)
    channel = holder._channel()
    assert holder.acquire()
    got: List[bool] = []

    def wait() -> None:
        client.rpush(channel, f"g {identity.thread_owner()} {10 ** 18}")
        got.append(other.acquire(timeout=1.5))

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(30)
    assert got == [False]
    assert holder._held(identity.thread_owner()) == 1
    holder.release()
    assert not client.exists(holder._keys.hash)


@pytest.mark.timeout(60)
def test_one_listener_per_hub_the_other_waiters_are_woken_through_the_hub(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    own = redis.Redis.from_url(redis_url, client_name=f"one-listener-{os.getpid()}")
    locks = [rlocks.RLock(f"{name}-{i}", client=client, namespace=NS) for i in range(3)]
    waiters = [rlocks.RLock(f"{name}-{i}", client=own, namespace=NS) for i in range(3)]
    hub = waiting.hub_for(own, NS)
    for lock in locks:
        assert lock.acquire()
    runs = [_takes_and_releases(w) for w in waiters]
    queues = [keys_for(NS, "rlock", f"{name}-{i}").queued()[2] for i in range(3)]
    wait_until(lambda: all(client.zcard(q) == 1 for q in queues), 15, "all three to queue")
    # One of them listens (one BLPOP holds a connection), the other two wait on the hub.
    # Checked once all three sleep (parked: a waiter sleeps in the step it chose, on its
    # event or in its BLPOP), so no waiter can still be on its way to a second BLPOP; the
    # BLPOP's line may be run before the server has it, hence the wait for CLIENT LIST.
    label = f"one-listener-{os.getpid()}"
    threads = [thread for thread, _ in runs]

    def one_listens() -> bool:
        return (all(parked(t) for t in threads) and sum(map(listening, threads)) == 1
                and _blocked(client, label) == 1)

    wait_until(one_listens, 15, "one waiter in its BLPOP and two asleep on the hub")
    assert hub._listener is not None
    for lock in locks:
        lock.release()
    for thread, got in runs:
        thread.join(30)
        assert not thread.is_alive() and got == [True]
    own.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "write", "sem"])
def test_a_task_cancelled_in_its_blpop_leaves_the_queue_and_the_client_stays_usable(
    redis_url: str, kind: str, name: str
) -> None:
    async def main() -> None:
        import redis.asyncio

        label = f"cancelled-blpop-{os.getpid()}"
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10, client_name=label)

        async def in_blpop() -> bool:
            # the server has the BLPOP: a connection of this pool blocked (CLIENT LIST)
            return any(c.get("name") == label and "b" in c.get("flags", "")
                       for c in await client.client_list())

        holder, other = (_one_async(kind, name, client) for _ in range(2))
        assert await holder.acquire()
        hub = aio.async_hub_for(client, NS)
        task = asyncio.ensure_future(other.acquire())
        deadline = time.monotonic() + 15
        while (hub._listener is None or await client.zcard(_queue_key(kind, name)) != 1
               or not await in_blpop()):
            assert time.monotonic() < deadline, "the task never blocked in its BLPOP"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await client.zcard(_queue_key(kind, name)) == 0
        assert hub._listener is None
        assert await client.ping()
        await holder.release()
        assert await other.acquire(timeout=5)  # the pool's connections still answer right
        await other.release()
        assert not await client.exists(holder._keys.hash)
        await client.aclose()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_on_a_small_pool_waiters_wait_on_the_hub_not_in_a_blpop(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    # A BLPOP would hold one of the pool's few connections for the whole wait, and the
    # holder's release in the same process could then wait for (or fail to get) one.
    label = f"small-pool-{os.getpid()}"
    small = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(
        redis_url, max_connections=wakehub.LISTEN_POOL_MIN - 1, timeout=5, client_name=label))
    holder, other = (rlocks.RLock(name, client=small, namespace=NS) for _ in range(2))
    assert holder.acquire()
    thread, got = _takes_and_releases(other)
    wait_until(lambda: small.zcard(_queue_key("rlock", name)) == 1, 15, "the waiter to queue")
    # Once it sleeps on its event its choice is made, so no window is needed: a listening
    # waiter would be in its LISTEN step (BLPOP) instead, every time it sleeps.
    wait_until(lambda: parked(thread) or listening(thread), 15, "the waiter to sleep")
    assert not listening(thread)
    assert _blocked(client, label) == 0
    assert waiting.hub_for(small, NS)._listener is None
    holder.release()
    thread.join(30)
    assert not thread.is_alive() and got == [True]
    small.close()


# -- the next local waiter queues at its sibling's release --------------------------------


def _sibling_setup(kind: str, name: str, redis_url: str) -> Tuple[Any, Any, Any, str]:
    """(a holder on a client of its own: another hub, as another process would be; the
    primitive two threads of this test share on a second client; an admin client; the
    queue key)."""
    other, mine = (redis.Redis.from_url(redis_url) for _ in range(2))
    return _one(kind, name, other), _one(kind, name, mine), other, _queue_key(kind, name)


def _taken_at(prim: Any) -> float:
    """Acquire ``prim`` (60 s at most), release it; returns when it was granted."""
    assert prim.acquire(timeout=60)
    at = time.monotonic()
    prim.release()
    return at


def _granted_sibling(prim: Any) -> Tuple[threading.Thread, threading.Event, threading.Event]:
    """A started thread that acquires ``prim`` (it waits: the holder has it), sets the
    first event once granted, and releases when the second is set."""
    got, go = threading.Event(), threading.Event()

    def run() -> None:
        assert prim.acquire(timeout=30)
        got.set()
        go.wait(30)
        prim.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got, go


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_next_local_waiter_queues_after_the_limit_and_may_time_out_before(
    redis_url: str, name: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for a sibling's release is bounded (DEFER_LIMIT): then the waiter queues
    anyway. And one whose timeout ends first returns False leaving nothing in Redis."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup(kind, name, redis_url)
    assert holder.acquire()
    first, got, go = _granted_sibling(prim)
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first sibling to queue")
    holder.release()
    assert got.wait(15), "the first sibling was not handed the lock"
    began = time.monotonic()
    assert in_thread(lambda: prim.acquire(timeout=0.3)) is False
    assert time.monotonic() - began < 10
    assert admin.zcard(queue) == 0 and admin.exists(queue) == 0
    go.set()
    first.join(10)
    # now a short limit: the waiter queues after it while the sibling still holds
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 0.3)
    assert holder.acquire()
    first, got, go = _granted_sibling(prim)
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first sibling to queue again")
    holder.release()
    assert got.wait(15), "the first sibling was not handed the lock again"
    other, out = started(lambda: _taken_at(holder))
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the holder's hub to queue")
    second, out2 = started(lambda: _taken_at(prim))
    wait_until(lambda: admin.zcard(queue) == 2, 15, "the second sibling to queue after the limit")
    go.set()
    # FIFO: the holder's hub queued first
    assert joined(other, out, 30) < joined(second, out2, 30)
    first.join(10)


@pytest.mark.timeout(90)
def test_a_condition_wait_of_the_sibling_lets_the_next_local_waiter_in(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold that ends in Condition.wait (a release_save, not release) lets the waiter
    it kept from queueing queue at once too."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup("rlock", name, redis_url)
    cond = rlocks.Condition(prim)
    assert holder.acquire()
    got = threading.Event()

    def first() -> bool:
        with cond:
            got.set()
            return cond.wait(timeout=20)

    waiting, out = started(first)
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first sibling to queue")
    second, out2 = started(lambda: _taken_at(prim))
    wait_until(lambda: parked(second), 15, "the second sibling to wait behind the first")
    began = time.monotonic()
    holder.release()
    assert got.wait(15), "the first sibling was not handed the lock"
    assert joined(second, out2, 30) - began < 10, "the wait's release did not let it in"
    with cond:
        cond.notify()
    assert joined(waiting, out, 30) is True


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_the_next_local_task_queues_only_when_its_sibling_releases(
    redis_url: str, name: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The asyncio twin: a task handed the lock keeps the loop's next waiting task from
    queueing until its release, which queues it in its own script (the task sends no
    queueing call, and no adoption: the same release granted it, nobody else waiting)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    admin = redis.Redis.from_url(redis_url)
    queue = _queue_key(kind, name)
    owners = _counting_queue_calls(monkeypatch)

    async def main() -> None:
        other, mine = (redis.asyncio.Redis.from_url(redis_url) for _ in range(2))
        holder, prim = _one_async(kind, name, other), _one_async(kind, name, mine)
        got, go = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            assert await prim.acquire(timeout=30)
            got.set()
            await go.wait()
            await prim.release()

        async def second() -> Tuple[str, float]:
            assert await prim.acquire(timeout=60)
            at = time.monotonic()
            await prim.release()
            return identity.task_owner(), at

        assert await holder.acquire()
        tasks = [asyncio.ensure_future(first())]
        for _ in range(1500):
            if admin.zcard(queue) == 1:
                break
            await asyncio.sleep(0.01)
        tasks.append(asyncio.ensure_future(second()))
        await asyncio.sleep(0.3)
        assert admin.zcard(queue) == 1
        await holder.release()
        await asyncio.wait_for(got.wait(), 15)
        await asyncio.sleep(0.5)
        assert admin.zcard(queue) == 0, "the second task queued while the first held"
        began = time.monotonic()
        owners.clear()
        go.set()
        owner, at = await asyncio.wait_for(tasks[1], 30)
        assert at - began < 10, "the release did not let the second task queue"
        assert owner not in owners, "the second task sent a queueing call of its own"
        assert "adopt " + owner not in owners, owners
        await asyncio.wait_for(tasks[0], 30)
        assert admin.zcard(queue) == 0 and await holder.acquire(blocking=False)
        await holder.release()
        for c in (other, mine):
            await c.aclose()

    asyncio.run(main())


def _counting_queue_calls(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """Record the owner of every queueing acquire call (``entry`` given), and ``adopt
    <owner>`` for every adoption call, from now on."""
    owners: List[str] = []
    real = Primitive._acquire_call

    def counted(self: Any, owner: str, count: int, reentry: bool, entry: Any,
                listen: bool = False) -> Any:
        if entry is not None:
            owners.append(owner)
        return real(self, owner, count, reentry, entry, listen)

    monkeypatch.setattr(Primitive, "_acquire_call", counted)
    real_adopt = Primitive._adopt_call

    def adopting(self: Any, owner: str) -> Any:
        owners.append("adopt " + owner)
        return real_adopt(self, owner)

    monkeypatch.setattr(Primitive, "_adopt_call", adopting)
    return owners


def _handed_with_a_giving_up_waiter_behind(
    holder: Any, prim: Any, admin: Any, queue: str, got: threading.Event
) -> Tuple[threading.Event, threading.Thread, Dict[str, Any]]:
    """A first thread of ``prim`` (started by the caller, ``got`` set once granted) queues
    behind ``holder``, a second waits behind it with a 1 s timeout, and ``holder``
    releases, handing the first thread the lock: (the event the second sets as it gives
    up, the second thread and its result)."""
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first thread to queue")
    gave_up = threading.Event()
    second, out = started(lambda: (prim.acquire(timeout=1.0), gave_up.set())[0])
    wait_until(lambda: parked(second), 15, "the second thread to wait behind the first")
    holder.release()
    assert got.wait(15), "the first thread was not handed the lock"
    return gave_up, second, out


def _free_with_nobody_queued(holder: Any, admin: Any, queue: str) -> None:
    """The gone waiter's grant was taken back at once: ``holder`` gets the lock with a
    single try (its entry lease would still hold it), and nobody is left queued."""
    assert holder.acquire(blocking=False), "the gone waiter's grant was left to its lease"
    holder.release()
    assert admin.zcard(queue) == 0


def _granted_and_one_behind(
    holder: Any, prim: Any, behind: Any, admin: Any, queue: str
) -> Tuple[threading.Thread, threading.Event, threading.Thread, Dict[str, Any]]:
    """``holder`` (another hub) holds; a thread of ``prim`` queues and is handed the lock
    at ``holder``'s release, while a second thread, of ``behind`` (the same client),
    waits behind it: (the first thread, the event that lets it release, the second
    thread and its result, (its owner id, when it was granted))."""
    assert holder.acquire()
    first, got, go = _granted_sibling(prim)
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first sibling to queue")
    second, out = started(lambda: (identity.thread_owner(), _taken_at(behind)))
    wait_until(lambda: parked(second), 15, "the second sibling to wait behind the first")
    holder.release()
    assert got.wait(15), "the first sibling was not handed the lock"
    return first, go, second, out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["rlock", "write"])
@pytest.mark.parametrize("others", [False, True])
def test_a_release_queues_the_next_local_waiter_in_its_own_script(
    redis_url: str, name: str, kind: str, others: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread handed an exclusive hold keeps this process's next waiter from queueing
    (queued at once, that waiter's call landed on the holder's critical section), and
    the hold's release queues it in its own script: the waiter sends no queueing call,
    and gets the lock at once when nobody else waits (with no adoption call: the same
    release granted it), else when the waiter ahead of it (``others``) is done."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup(kind, name, redis_url)
    first, go, second, out = _granted_and_one_behind(holder, prim, prim, admin, queue)
    time.sleep(0.5)
    assert admin.zcard(queue) == 0, "the second sibling queued while the first held"
    owners = _counting_queue_calls(monkeypatch)
    if others:
        other, other_out = started(lambda: _taken_at(holder))
        wait_until(lambda: admin.zcard(queue) == 1, 15, "the other hub to queue")
    began = time.monotonic()
    go.set()
    owner, at = joined(second, out, 30)
    assert at - began < 10, "the release did not let the second sibling in"
    assert owner not in owners, "the second sibling sent a queueing call of its own"
    # the grant is surely its own: recorded with no adoption round trip
    assert "adopt " + owner not in owners, owners
    if others:
        assert joined(other, other_out, 30) < at  # FIFO: the other hub queued first
    first.join(10)
    assert admin.zcard(queue) == 0 and holder.acquire(blocking=False)
    holder.release()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_waiter_gone_while_a_release_queued_it_is_taken_out_by_that_release(
    redis_url: str, name: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter times out while its sibling's release, which queues it, is on its way
    (held back here until the waiter has returned): that release's script queued a
    waiter that is gone (and, nobody else waiting, granted it the lock), so the releasing
    thread takes it out in its name at once; the lock is free when its release returns,
    not after the entry lease."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup(kind, name, redis_url)
    assert holder.acquire()
    first, got, go = _granted_sibling(prim)
    gave_up, second, out = _handed_with_a_giving_up_waiter_behind(holder, prim, admin, queue, got)
    real = Primitive._carry_begin
    carried: List[Any] = []

    def late(self: Any, owner: str) -> Any:
        carry = real(self, owner)
        carried.append(carry)
        assert gave_up.wait(30)
        return carry

    monkeypatch.setattr(Primitive, "_carry_begin", late)
    go.set()
    assert joined(second, out, 30) is False
    first.join(30)
    assert carried and carried[0] is not None, "the release carried nothing"
    _free_with_nobody_queued(holder, admin, queue)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_waiter_gone_just_after_a_release_queued_it_takes_itself_out(
    redis_url: str, name: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter times out just after its sibling's release, which queued it behind
    another process's waiter, ended (the release saw it still waiting, so it leaves
    nothing in its name), before the waiter took that queueing's answer: the waiter takes
    itself out as it gives up. Left in the queue, it was handed the lock by the other
    process's release and held it, gone, for the entry lease (a stress run's writers
    waited those 2 s)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup(kind, name, redis_url)
    third = _one(kind, name, redis.Redis.from_url(redis_url))  # another process's hub
    assert holder.acquire()
    first, got, go = _granted_sibling(prim)
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first thread to queue")
    other, other_got, other_go = _granted_sibling(third)
    wait_until(lambda: admin.zcard(queue) == 2, 15, "the other process to queue")
    claiming, ended = threading.Event(), threading.Event()
    real_claim, real_end = wakehub.WakeHub.claim, wakehub.WakeHub.carry_end
    spared = (first, other, threading.main_thread())

    def claim(self: Any, waiter: Any, leaving: bool = False) -> bool:
        if leaving and threading.current_thread() not in spared:
            # the second thread gives up: only once the release that carries it ended
            claiming.set()
            assert ended.wait(30), "the release carried nothing"
        return real_claim(self, waiter, leaving)

    def carry_end(self: Any, *args: Any) -> bool:
        try:
            return real_end(self, *args)
        finally:
            ended.set()

    monkeypatch.setattr(wakehub.WakeHub, "claim", claim)
    monkeypatch.setattr(wakehub.WakeHub, "carry_end", carry_end)
    second, out = started(lambda: prim.acquire(timeout=1.0))
    wait_until(lambda: parked(second), 15, "the second thread to wait behind the first")
    holder.release()
    assert got.wait(15), "the first thread was not handed the lock"
    assert claiming.wait(30), "the second thread did not give up"
    go.set()
    assert other_got.wait(15), "the other process was not handed the lock"
    assert joined(second, out, 30) is False
    first.join(30)
    assert admin.zcard(queue) == 0, "the gone waiter is still queued"
    other_go.set()
    other.join(30)
    _free_with_nobody_queued(holder, admin, queue)


@pytest.mark.timeout(90)
def test_a_grant_a_leave_makes_at_once_to_a_waiter_that_gave_up_is_passed_on(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer times out; its leave re-points the process's entry to the reader behind
    it, who gives up before that leave arrives (held back here until then). The reader
    fits beside the holding reader and is granted at once by the leave: the grant is
    passed on in its name, not left to hold writers off for the entry lease."""
    other, mine = (redis.Redis.from_url(redis_url) for _ in range(2))
    reading = rlocks.RWLock(name, client=other, namespace=NS).read_lock
    lock = rlocks.RWLock(name, client=mine, namespace=NS)
    queue = _queue_key("write", name)
    assert reading.acquire()
    gave_up = threading.Event()
    real_claim, real_leave = wakehub.WakeHub.claim, Primitive._leave_call
    reader: List[threading.Thread] = []
    named: List[Any] = []

    def claim(self: Any, waiter: Any, leaving: bool = False) -> bool:
        try:
            return real_claim(self, waiter, leaving)
        finally:
            if leaving and threading.current_thread() in reader:
                gave_up.set()

    def leave_call(self: Any, owner: str, entry: str, ask: Any = None) -> Any:
        if ask is not None:  # the writer's leave, naming the reader: once it gave up
            named.append(ask)
            assert gave_up.wait(30), "the reader did not give up"
        return real_leave(self, owner, entry, ask)

    monkeypatch.setattr(wakehub.WakeHub, "claim", claim)
    monkeypatch.setattr(Primitive, "_leave_call", leave_call)
    writer, wrote = started(lambda: lock.write_lock.acquire(timeout=3.0))
    wait_until(lambda: other.zcard(queue) == 1, 15, "the writer to queue")
    second, read = started(lambda: lock.read_lock.acquire(timeout=4.0))
    reader.append(second)
    assert joined(writer, wrote, 30) is False
    assert joined(second, read, 30) is False
    assert named, "the writer's leave did not name the reader"
    reading.release()
    # nobody holds the lock: a writer of another client gets it with a single try
    assert rlocks.RWLock(name, client=other, namespace=NS).write_lock.acquire(
        blocking=False
    ), "the reader's grant was left to its lease"
    assert other.zcard(queue) == 0


def test_a_passed_grant_of_a_waiter_whose_wait_is_over_leaves_no_echo(
    client: "redis.Redis[bytes]", monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub, step by step, through what a stress run showed (bug hunt): head A leaves,
    re-pointing the process's entry to B; B gives up before it is named, and its thread
    waits again (B2, the same id); the entry's grant line, read now, goes to B2 by id.
    The leave in B's name then answers PASSED: no echo may be kept for B's line, or B2's
    own next grant line is dropped as that echo and B2 sleeps through its grant."""
    hub = wakehub.WakeHub(client, "rlocks-test")
    hub._runner = threading.current_thread()  # a running stand-in: register() starts none
    monkeypatch.setattr(hub, "_nudge", lambda: None)
    channel = f"rlocks-test:rlock:{{x}}:wake:{hub.entry}"
    mine = f"{identity.process_token()}:"
    first = hub.register(channel, mine + "1")
    second = hub.register(channel, mine + "2")
    first.channel.confirmed.set()
    assert not hub.claim(first, leaving=True)
    assert hub.successor(first) is second  # the leave re-points the entry to B
    assert not hub.claim(second, leaving=True) and second.gone
    hub.unregister(second)
    again = hub.register(channel, mine + "2")  # B's thread waits again
    again.counts = True
    hub._lines_locked(first.channel, f"g {mine}2 5")  # the entry's grant, read now
    assert again.state == wakehub.GRANTED  # (its adoption will fail: a round trip)
    assert not hub.take_over(second)  # gone: a second leave, in B's name, ...
    hub.note_grant(second)  # ... answers PASSED
    hub.rewait(again)  # the adoption failed: B2 waits on
    again.event.clear()
    hub._lines_locked(first.channel, f"g {mine}2 9")  # B2's own grant
    assert again.state == wakehub.GRANTED and again.event.is_set(), "its grant line was dropped"
    assert again.token == 9


@pytest.mark.timeout(90)
def test_a_release_does_not_queue_a_waiter_of_an_object_with_another_entry_lease(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two objects of one name on one client share the process's entry: a waiter of the
    one with the longer entry_lease is not queued by the other's release (its grant would
    live the releaser's shorter lease, not the one the waiter counts on to keep it
    unadopted), so it queues itself, and still gets the lock."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    other, mine = (redis.Redis.from_url(redis_url) for _ in range(2))
    holder = rlocks.RLock(name, client=other, namespace=NS)
    short = rlocks.RLock(name, client=mine, namespace=NS, entry_lease=2.0)
    long = rlocks.RLock(name, client=mine, namespace=NS, entry_lease=6.0)
    queue = _queue_key("rlock", name)
    first, go, second, out = _granted_and_one_behind(holder, short, long, other, queue)
    owners = _counting_queue_calls(monkeypatch)
    go.set()
    owner, _at = joined(second, out, 30)
    assert owners.count(owner) == 1, owners
    first.join(10)
    assert other.zcard(queue) == 0 and holder.acquire(blocking=False)
    holder.release()


@pytest.mark.timeout(90)
def test_a_hold_released_through_another_object_of_its_name_lets_the_next_waiter_in(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hold's last level is released through a second object of the name, which
    never waited and so keeps no hub of its own: the process's hub is found all the
    same, and the waiter the hold kept back queues at once (it slept until its timeout,
    20 s, before: bug hunt)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup("rlock", name, redis_url)
    other_object = rlocks.RLock(name, client=prim._client, namespace=NS)
    assert holder.acquire()
    holding, freed = threading.Event(), threading.Event()
    released_at: List[float] = []

    def first() -> None:
        assert prim.acquire(timeout=30)
        assert other_object.acquire(blocking=False)  # a re-entry through the other
        holding.set()
        freed.wait(30)
        prim.release()
        released_at.append(time.monotonic())
        other_object.release()  # the last level: the lock is free now

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the first thread to queue")
    second, out = started(lambda: _taken_at(prim))
    wait_until(lambda: parked(second), 15, "the second thread to wait behind the first")
    holder.release()
    assert holding.wait(15), "the first thread did not hold through both objects"
    freed.set()
    assert joined(second, out, 30) - released_at[0] < 5
    thread.join(10)


class _Interrupted(Exception):
    """What a signal handler's timeout raises (not a Redis error: 'foreign')."""


@pytest.mark.timeout(90)
def test_a_release_interrupted_after_its_script_ran_takes_out_the_gone_waiter_it_queued(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The releasing thread is interrupted after its script ran (it queued the waiter it
    carried and, nobody else waiting, granted it the lock), and that waiter timed out
    while the release travelled: the release's clean-up takes the waiter out in its
    name, so the lock is free when the interrupt reaches the caller, not after the entry
    lease (bug hunt)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    holder, prim, admin, queue = _sibling_setup("rlock", name, redis_url)
    assert holder.acquire()
    got, go = threading.Event(), threading.Event()
    outcome: List[BaseException] = []

    def first() -> None:
        assert prim.acquire(timeout=30)
        got.set()
        go.wait(30)
        try:
            prim.release()
        except _Interrupted as exc:
            outcome.append(exc)

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    gave_up, second, out = _handed_with_a_giving_up_waiter_behind(holder, prim, admin, queue, got)
    real_begin, real_call = Primitive._carry_begin, primitive.Call.__call__

    def late(self: Any, owner: str) -> Any:
        carry = real_begin(self, owner)
        assert gave_up.wait(30)  # the waiter gives up while the release travels
        return carry

    def cut(self: Any, client: Any, *args: Any, **kwargs: Any) -> Any:
        reply = real_call(self, client, *args, **kwargs)
        if self.script is prim._release_script and len(self.args) > 7 and not outcome:
            raise _Interrupted()  # after the script ran, before its answer is used
        return reply

    monkeypatch.setattr(Primitive, "_carry_begin", late)
    monkeypatch.setattr(primitive.Call, "__call__", cut)
    go.set()
    assert joined(second, out, 30) is False
    thread.join(30)
    assert outcome, "the carried release was not interrupted"
    _free_with_nobody_queued(holder, admin, queue)


@pytest.mark.timeout(90)
def test_a_cancelled_task_release_takes_out_the_gone_waiter_it_queued(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio: the releasing task is cancelled while its (shielded) release travels,
    and the waiting task it carries gives up meanwhile: once the release has run, the
    gone waiter is taken out in its name, so the lock is free long before the entry
    lease (30 s here) would free it (bug hunt)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 30.0)
    admin = redis.Redis.from_url(redis_url)
    queue = _queue_key("rlock", name)
    real = aio.AsyncPrimitive._arun_quorum_or_one

    async def main() -> None:
        other, mine = (redis.asyncio.Redis.from_url(redis_url) for _ in range(2))
        holder = _one_async("rlock", name, other, entry_lease=30.0)
        prim = _one_async("rlock", name, mine, entry_lease=30.0)
        got, gate = asyncio.Event(), asyncio.Event()

        async def gated(self: Any, call: Any, op: Any = None) -> Any:
            if call.script is prim._release_script and len(call.args) > 7:
                await gate.wait()
            return await real(self, call, op)

        monkeypatch.setattr(aio.AsyncPrimitive, "_arun_quorum_or_one", gated)

        async def first() -> None:
            assert await prim.acquire(timeout=30)
            got.set()
            await prim.release()

        assert await holder.acquire()
        releasing = asyncio.ensure_future(first())
        for _ in range(1500):
            if admin.zcard(queue) == 1:
                break
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(prim.acquire(timeout=1.0))
        await asyncio.sleep(0.3)
        await holder.release()
        await asyncio.wait_for(got.wait(), 15)
        await asyncio.sleep(0.1)  # the release is on its way, held at the gate
        assert await asyncio.wait_for(waiting, 15) is False
        releasing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await releasing
        gate.set()
        began = time.monotonic()
        while not await holder.acquire(blocking=False):
            assert time.monotonic() - began < 10, "the gone waiter's grant was left to its lease"
            await asyncio.sleep(0.05)
        await holder.release()
        assert admin.zcard(queue) == 0
        for c in (other, mine):
            await c.aclose()

    asyncio.run(main())


@pytest.mark.timeout(90)
def test_a_waiter_asleep_behind_the_head_queues_within_the_limit_of_a_long_hold(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter right behind the head sleeps before the head is granted, and the grant
    does not wake it: it looks again within DEFER_LIMIT all the same, so a long hold does
    not keep it out of the queue until its own timeout (60 s here; no deadlock_timeout,
    whose checks would wake it too)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 0.3)
    holder, _prim, admin, queue = _sibling_setup("rlock", name, redis_url)
    prim = rlocks.RLock(name, client=_prim._client, namespace=NS, deadlock_timeout=None)
    first, go, second, out = _granted_and_one_behind(holder, prim, prim, admin, queue)
    wait_until(lambda: admin.zcard(queue) == 1, 10, "the second thread to queue")
    go.set()
    joined(second, out, 30)
    first.join(10)


@pytest.mark.timeout(90)
def test_a_defer_limit_of_zero_does_not_make_the_waiter_behind_the_head_spin(
    redis_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter right behind the head looks every DEFER_LIMIT; at a limit of 0 it
    still sleeps DEFER_POLL_FLOOR between two looks (a sleep of 0 spun under the GIL:
    97 sections/s at 4 processes x 2 threads, against 2,028 at the default)."""
    monkeypatch.setattr(wakehub, "DEFER_LIMIT", 0.0)
    pauses: Dict[str, List[float]] = {}

    class Recorded(queued.Op):
        __slots__ = ()

        def __init__(self, kind: str, *args: Any, **kwargs: Any) -> None:
            super().__init__(kind, *args, **kwargs)
            if kind == queued.WAIT and self.waiter is not None:
                pauses.setdefault(self.waiter.id, []).append(self.timeout)

    monkeypatch.setattr(queued, "Op", Recorded)
    holder, prim, admin, queue = _sibling_setup("rlock", name, redis_url)
    assert holder.acquire()
    head, head_out = started(lambda: _taken_at(prim))
    wait_until(lambda: admin.zcard(queue) == 1, 15, "the head to queue")
    behind, behind_out = started(lambda: (identity.thread_owner(), _taken_at(prim)))
    wait_until(lambda: parked(behind), 15, "the second thread to wait behind the head")
    time.sleep(0.2)  # the hold goes on: the waiter behind looks again and again
    holder.release()
    joined(head, head_out, 30)
    owner, _ = joined(behind, behind_out, 30)
    looks = pauses.get(owner, [])
    assert looks, "the waiter behind the head never slept"
    assert min(looks) >= wakehub.DEFER_POLL_FLOOR, sorted(looks)[:5]
    assert admin.zcard(queue) == 0 and holder.acquire(blocking=False)
    holder.release()
