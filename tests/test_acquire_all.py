"""``rlocks.acquire_all`` / ``rlocks.asyncio.acquire_all``: several primitives, all or none,
in one order every process shares."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any, List

import pytest
import redis.asyncio

import rlocks
import rlocks.asyncio as ra
from rlocks._engine import multi

from ._procs import EXIT_OK, all_of_worker
from .conftest import NAMESPACE, snapshot

SPAWN = multiprocessing.get_context("spawn")


def four(client: Any, name: str) -> List[Any]:
    """A Lock, an RLock, an RWLock's write side and a Semaphore(1) of ``name``."""
    common = dict(client=client, namespace=NAMESPACE)
    return [rlocks.Lock(f"{name}-l", **common), rlocks.RLock(f"{name}-r", **common),
            rlocks.RWLock(f"{name}-w", **common).write_lock,
            rlocks.Semaphore(f"{name}-s", 1, **common)]


def test_all_are_taken_in_key_order_whatever_the_argument_order(target: Any, name: str) -> None:
    client = target[0]
    prims = four(client, name)
    forward, backward = multi.check_all(prims, True, None, aio=False)[0], multi.check_all(
        prims[::-1], True, None, aio=False)[0]
    assert forward == backward == sorted(prims, key=lambda p: p._keys.hash)
    held = rlocks.acquire_all(*prims[::-1], timeout=5)
    assert held and held.primitives == tuple(forward)
    assert all(p.owned() for p in prims)
    held.release()
    assert not any(p.owned() for p in prims)
    with pytest.raises(RuntimeError, match="holds nothing"):
        held.release()
    with rlocks.acquire_all(*prims) as holding:
        assert all(p.owned() for p in holding.primitives)
    assert not any(p.owned() for p in prims)
    assert not any(client.exists(p._keys.hash) for p in prims)


def test_none_is_held_when_one_cannot_be_had(client: Any, name: str) -> None:
    prims = four(client, name)
    # Another process holds the RLock (second in order): a Lock of this process cannot
    # stand in, so a thread holds it for the test's length.
    blocker = rlocks.RLock(f"{name}-r", client=client, namespace=NAMESPACE)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with blocker:
            held.set()
            done.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    before = snapshot(client)
    held = rlocks.acquire_all(*prims, timeout=0.2)
    assert not held and held.primitives == ()
    assert not any(p.owned() for p in prims)
    assert not rlocks.acquire_all(*prims, blocking=False)
    with pytest.raises(TimeoutError, match="none is held"):
        with rlocks.acquire_all(*prims, timeout=0.1):
            pass  # pragma: no cover
    assert {k: v for k, v in snapshot(client).items() if not k.endswith(b":q")} == {
        k: v for k, v in before.items() if not k.endswith(b":q")}
    done.set()
    thread.join(10)
    with rlocks.acquire_all(*prims, timeout=5):
        pass


def test_both_sides_of_one_rwlock_are_taken_writer_first(client: Any, name: str) -> None:
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    with rlocks.acquire_all(rw.read_lock, rw.write_lock, timeout=5) as held:
        assert held.primitives == (rw.write_lock, rw.read_lock)
    assert not client.exists(rw.write_lock._keys.hash)


def test_an_error_while_taking_gives_back_what_was_taken(client: Any, name: str) -> None:
    first = rlocks.Lock(f"{name}-a", client=client, namespace=NAMESPACE)
    # The same name in Redis as a semaphore of another value: its acquire raises.
    rlocks.Semaphore(f"{name}-b", 2, client=client, namespace=NAMESPACE).acquire()
    mismatched = rlocks.Semaphore(f"{name}-b", 3, client=client, namespace=NAMESPACE)
    with pytest.raises(ValueError):
        rlocks.acquire_all(mismatched, first, timeout=1)
    assert not first.owned() and not first.locked()


def test_bad_input_is_refused_before_any_io(client: Any, name: str) -> None:
    lock = rlocks.Lock(name, client=client, namespace=NAMESPACE)
    twin = rlocks.Lock(name, client=client, namespace=NAMESPACE)
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    before = snapshot(client)
    with pytest.raises(ValueError, match="give the primitives"):
        rlocks.acquire_all()
    with pytest.raises(ValueError, match="named twice"):
        rlocks.acquire_all(lock, lock)
    with pytest.raises(ValueError, match="named twice"):
        rlocks.acquire_all(lock, twin)
    with pytest.raises(TypeError, match="pass its read_lock or write_lock"):
        rlocks.acquire_all(rw)
    with pytest.raises(TypeError, match="pass its lock"):
        rlocks.acquire_all(rlocks.Condition(rlocks.RLock(name, client=client)))
    with pytest.raises(TypeError, match="not an rlocks lock"):
        rlocks.acquire_all(lock, "x")
    with pytest.raises(TypeError, match="use rlocks.asyncio.acquire_all"):
        rlocks.acquire_all(ra.Lock(name, client=redis.asyncio.Redis()))
    with pytest.raises(TypeError, match="use rlocks.acquire_all"):
        ra.acquire_all(lock)
    for bad, error in [(-1, ValueError), (float("nan"), ValueError), ("1", TypeError),
                       (True, TypeError), (1e300, OverflowError)]:
        with pytest.raises(error, match=r"rlocks.acquire_all\(\): "):
            rlocks.acquire_all(lock, timeout=bad)
    with pytest.raises(ValueError, match="non-blocking"):
        rlocks.acquire_all(lock, blocking=False, timeout=1)
    assert snapshot(client) == before


def test_asyncio_acquire_all_awaited_or_as_a_context(redis_url: str, name: str) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        common = dict(client=c, namespace=NAMESPACE)
        prims = [ra.Lock(f"{name}-l", **common), ra.RLock(f"{name}-r", **common),
                 ra.Semaphore(f"{name}-s", 1, **common)]
        held = await ra.acquire_all(*prims[::-1], timeout=5)
        assert held and all(p.owned() for p in prims)
        with pytest.raises(RuntimeError, match="awaited already"):
            await held
        await held.release()
        assert not any(p.owned() for p in prims)
        async with ra.acquire_all(*prims) as holding:
            assert len(holding.primitives) == 3
        assert not any([await p.locked() for p in prims[:2]])

        # Blocked on the RLock (held by another task): a cancel gives back the Lock.
        blocker_in = asyncio.Event()
        blocker_out = asyncio.Event()

        async def blocker() -> None:
            async with prims[1]:
                blocker_in.set()
                await blocker_out.wait()

        b = asyncio.create_task(blocker())
        await blocker_in.wait()
        taking = asyncio.create_task(ra.acquire_all(*prims)._take())
        await asyncio.sleep(0.2)
        assert not taking.done()
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        assert not await prims[0].locked()  # the Lock (first in order) was given back
        with pytest.raises(TimeoutError):
            async with ra.acquire_all(*prims, timeout=0.1):
                pass  # pragma: no cover
        blocker_out.set()
        await b
        await c.aclose()

    asyncio.run(main())


@pytest.mark.load
@pytest.mark.parametrize("where", ["single", "cluster"])
def test_two_processes_in_opposite_orders_never_deadlock(
    request: pytest.FixtureRequest, redis_url: str, where: str, name: str
) -> None:
    """Two processes take the same four primitives for a minute (half a minute more on
    the cluster), naming them in opposite orders, waiting for ever: both keep going
    round (a circle would stop both)."""
    if where == "cluster":
        cluster = request.getfixturevalue("cluster")
        spec: Any = {"cluster": cluster.startup_nodes}
        client = cluster.client()
    else:
        spec = {"url": redis_url}
        client = redis.Redis.from_url(redis_url)
    names = [f"lock-{name}", f"rlock-{name}", f"write-{name}", f"sem-{name}"]
    data = f"{NAMESPACE}:data:{{{name}}}"
    seconds = 60.0 if where == "single" else 30.0
    workers = [SPAWN.Process(target=all_of_worker, args=(spec, order, NAMESPACE, data, seconds))
               for order in (names, names[::-1])]
    for w in workers:
        w.start()
    last = time.monotonic()
    seen = 0
    try:
        while any(w.is_alive() for w in workers):
            rounds = client.llen(f"{data}:rounds")
            if rounds > seen:
                seen, last = rounds, time.monotonic()
            assert time.monotonic() - last < 15, "no round for 15 s: the two are stuck"
            time.sleep(0.2)
    finally:
        for w in workers:
            w.join(60)
            if w.is_alive():
                w.kill()
    errors = client.lrange(f"{data}:errors", 0, -1)
    assert not errors, errors[0].decode()
    assert [w.exitcode for w in workers] == [EXIT_OK, EXIT_OK]
    assert seen > 100
