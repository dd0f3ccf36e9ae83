"""A lost hold stops its critical section: ``async with lock.guard():`` cancels the body;
threads look with ``check()`` and the ``lost`` event."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, List

import pytest
import redis.asyncio

import rlocks
import rlocks.asyncio as ra

from ._servers import wait_until
from .conftest import NAMESPACE


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("kind", ["rlock", "lock", "write", "semaphore"])
def test_a_guard_cancels_the_body_when_the_hold_is_found_lost(
    redis_url: str, name: str, kind: str
) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        common = dict(client=c, namespace=NAMESPACE, ttl=0.6)  # renewed every 0.2 s
        if kind == "rlock":
            prim: Any = ra.RLock(name, **common)
        elif kind == "lock":
            prim = ra.Lock(name, **common)
        elif kind == "write":
            prim = ra.RWLock(name, **common).write_lock
        else:
            prim = ra.Semaphore(name, 2, **common)
        steps: List[str] = []

        async def body() -> None:
            async with prim.guard():
                steps.append("in")
                await c.delete(prim._keys.hash)  # as an expiry or a forced release would
                await asyncio.sleep(60)
                steps.append("ran on")  # pragma: no cover - the guard stops it

        task = asyncio.create_task(body())
        # Not wait_for: its own cancel at the end would end the body too.
        await asyncio.wait({task}, timeout=20)
        assert task.done(), "the body ran on after its hold was lost"
        with pytest.raises(rlocks.LockLostError) as raised:
            task.result()
        assert steps == ["in"]
        assert raised.value.lock is prim  # type: ignore[attr-defined]
        assert not prim.owned()
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
        await c.aclose()

    run(main())


def test_a_grant_elsewhere_in_the_process_stops_a_guarded_body_at_once(
    redis_url: str, name: str
) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        lock = ra.Lock(name, client=c, namespace=NAMESPACE, auto_renew=False)
        entered = asyncio.Event()

        async def body() -> None:
            async with lock.guard():
                entered.set()
                await asyncio.sleep(60)

        guarded = asyncio.create_task(body())
        await entered.wait()
        await c.delete(lock._keys.hash)
        # No renewer runs: the grant to another task is what tells this process.
        assert await lock.acquire(timeout=5)
        await asyncio.wait({guarded}, timeout=10)
        assert guarded.done(), "the body ran on after its hold was lost"
        with pytest.raises(rlocks.LockLostError):
            guarded.result()
        await lock.release()
        await c.aclose()

    run(main())


def test_a_guard_passes_other_cancellations_and_errors_and_releases(
    redis_url: str, name: str
) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE)
        entered = asyncio.Event()

        async def body() -> None:
            async with lock.guard():
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await lock.locked()

        with pytest.raises(KeyError):
            async with lock.guard():
                raise KeyError("mine")
        assert not await lock.locked()

        async with lock.guard() as held:
            assert held is lock and lock.owned()
        assert not await lock.locked()
        await c.aclose()

    run(main())


def test_a_body_that_swallows_the_cancellation_still_hears_of_the_loss(
    redis_url: str, name: str
) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        lock = ra.RLock(name, client=c, namespace=NAMESPACE, ttl=0.6)
        stopped: List[bool] = []

        async def body() -> None:
            async with lock.guard():
                await c.delete(lock._keys.hash)
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    stopped.append(True)  # a body that does not let go

        task = asyncio.create_task(body())
        await asyncio.wait({task}, timeout=20)
        assert task.done() and stopped == [True]
        with pytest.raises(rlocks.LockLostError):
            task.result()
        await c.aclose()

    run(main())


def test_a_guard_that_cannot_acquire_in_time_raises_timeout_and_holds_nothing(
    redis_url: str, client: Any, name: str
) -> None:
    holder = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    assert holder.acquire()
    try:
        async def main() -> None:
            c = redis.asyncio.Redis.from_url(redis_url)
            lock = ra.RLock(name, client=c, namespace=NAMESPACE)
            with pytest.raises(TimeoutError, match="not acquired within 0.1 s"):
                async with lock.guard(timeout=0.1):
                    pass  # pragma: no cover
            assert not lock.owned()
            with pytest.raises(ValueError):
                lock.guard(timeout=-3)
            with pytest.raises(TypeError):
                lock.guard(timeout="soon")  # type: ignore[arg-type]
            await c.aclose()

        run(main())
    finally:
        holder.release()


@pytest.mark.parametrize("kind", ["rlock", "lock", "semaphore"])
def test_threads_look_with_check_and_the_lost_event(client: Any, name: str, kind: str) -> None:
    common = dict(client=client, namespace=NAMESPACE, ttl=0.6)
    if kind == "rlock":
        prim: Any = rlocks.RLock(name, **common)
    elif kind == "lock":
        prim = rlocks.Lock(name, **common)
    else:
        prim = rlocks.Semaphore(name, 2, **common)
    with pytest.raises(rlocks.NotOwnedError):
        prim.check()
    with pytest.raises(rlocks.NotOwnedError):
        prim.lost  # noqa: B018 - the property is the call
    assert prim.acquire()
    prim.check()  # held: returns
    lost = prim.lost
    assert isinstance(lost, threading.Event) and not lost.is_set()
    assert prim.lost is lost
    client.delete(prim._keys.hash)
    assert lost.wait(20)  # set by the renewal that found it gone
    with pytest.raises(rlocks.LockLostError):
        prim.check()
    assert prim.lost.is_set()
    with pytest.raises(rlocks.LockLostError):
        prim.release()
    # A new grant has a new, unset event.
    assert prim.acquire()
    assert not prim.lost.is_set()
    prim.release()
    wait_until(lambda: not client.exists(prim._keys.hash), 5, "released")


def test_a_cancellation_from_elsewhere_that_comes_with_the_loss_goes_on(
    redis_url: str, name: str
) -> None:
    """The loss is found and, before the task runs again, someone else cancels it too (a
    TaskGroup sibling failed): the guard must not turn both into one LockLostError that
    a caller could handle and carry on from, with the outside cancellation gone."""
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        lock = ra.Lock(name, client=c, namespace=NAMESPACE, ttl=5)
        entered = asyncio.Event()

        async def worker() -> str:
            try:
                async with lock.guard():
                    entered.set()
                    await asyncio.sleep(30)
            except rlocks.LockLostError:
                await asyncio.sleep(0.05)  # handles the loss and goes on
            return "went on"

        task = asyncio.create_task(worker())
        await entered.wait()
        hold = lock._current()
        assert hold is not None
        hold.lose("found gone (as the renewer reports it)")
        task.cancel()  # someone else's cancellation
        with pytest.raises(asyncio.CancelledError):
            await task
        await c.aclose()

    run(main())
