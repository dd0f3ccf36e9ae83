"""``on_lost`` callbacks: where they run, and that they cannot starve lease renewal.

A loss is found by the renewer. A callback run right there would hold up every other
renewal of the process: a clean-up that takes longer than another hold's lease would cost
that healthy hold too. Callbacks run on a thread of their own; asyncio twins await an
``async def`` callback on their loop; a threading primitive refuses one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio as ra

from ._servers import wait_until
from .conftest import NAMESPACE


@pytest.mark.timeout(60)
def test_slow_on_lost_does_not_starve_renewal_of_other_holds(
    client: "redis.Redis[bytes]", name: str
) -> None:
    entered = threading.Event()
    finish = threading.Event()
    lost: List[Any] = []

    def slow(lock: Any) -> None:
        lost.append(lock)
        entered.set()
        finish.wait(30)  # a long clean-up

    ttl_b = 0.6
    a = rlocks.RLock(name + "-a", client=client, ttl=3.0, namespace=NAMESPACE, on_lost=slow)
    b = rlocks.RLock(
        name + "-b", client=client, ttl=ttl_b, namespace=NAMESPACE, on_lost=lost.append
    )
    try:
        assert a.acquire() and b.acquire()
        client.delete(a._keys.hash)  # A is lost; its renewer finds out within ttl/3
        assert entered.wait(10), "on_lost of A was never called"
        assert threading.current_thread().name != "rlocks-renewer"
        # While A's callback is busy, B must be renewed: it outlives several of its leases.
        until = time.monotonic() + 5 * ttl_b
        while time.monotonic() < until:
            assert client.exists(b._keys.hash), "B's lease ran out while on_lost(A) ran"
            time.sleep(0.02)
        assert lost == [a], "B was reported lost"
        b.release()  # still held, in Redis too: no LockLostError
        assert not client.exists(b._keys.hash)
    finally:
        finish.set()
        client.delete(a._keys.hash, b._keys.hash)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("answered", [True, False], ids=["release-answered", "reply-lost"])
def test_a_renewal_that_crosses_the_release_of_a_hold_reports_no_false_loss(
    client: "redis.Redis[bytes]", name: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, answered: bool,
) -> None:
    """The release reaches Redis first, the renewal (sent meanwhile) finds the hold gone,
    then the release's answer comes. Nothing was lost: no loss is reported (bug hunt: a
    false ``on_lost`` after a normal release). Only when that answer never comes (the
    release is sent again while its lease lasts, and the link stays down) does the
    renewer's finding stand: then nothing tells the two apart, and a loss is reported."""
    from rlocks._engine import holds, scripts

    lost: List[Any] = []
    lock = rlocks.RLock(name, client=client, ttl=0.6, namespace=NAMESPACE, on_lost=lost.append)
    found = threading.Event()  # the renewer reported its renewal's answer: hold gone
    real_found_gone = holds.Hold.found_gone

    def found_gone(self: Any, reason: str) -> None:
        real_found_gone(self, reason)
        if self.ident == lock._ident(self.owner):
            found.set()

    real_call = scripts.Call.__call__
    sends: List[int] = []

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.script is not lock._spec.release_script:
            return real_call(self, *args, **kwargs)
        sends.append(1)
        if len(sends) > 1:
            # The link stays broken: every later send fails before it reaches Redis.
            raise redis.exceptions.ConnectionError("the link is down")
        reply = real_call(self, *args, **kwargs)
        # The release ran in Redis; its answer is held back until the renewal due
        # within ttl/3 has found the hold gone.
        assert found.wait(10), "the renewal never came"
        if not answered:
            raise redis.exceptions.ConnectionError("the release's reply was lost")
        return reply

    monkeypatch.setattr(holds.Hold, "found_gone", found_gone)
    monkeypatch.setattr(scripts.Call, "__call__", call)
    assert lock.acquire()
    if answered:
        lock.release()
        assert not [r for r in caplog.records if "lost by" in r.getMessage()]
    else:
        with pytest.raises(redis.exceptions.ConnectionError):
            lock.release()
        assert [r for r in caplog.records if "lost by" in r.getMessage()]
        wait_until(lambda: lost == [lock], 10, "on_lost call")
    assert not client.exists(lock._keys.hash)


@pytest.mark.timeout(60)
def test_a_release_interrupted_before_it_is_sent_leaves_later_losses_reported(
    client: "redis.Redis[bytes]", name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt (a signal handler's exception) after the release is prepared but
    before its call: the hold is still held, and a later real loss of it is reported.
    (The release once marked the hold as releasing before that point: the mark stayed,
    and the renewer's finding waited for an answer that never came. Bug hunt.)"""
    from rlocks._engine.primitive import LockSpec

    lost: List[Any] = []
    lock = rlocks.RLock(name, client=client, ttl=0.6, namespace=NAMESPACE, on_lost=lost.append)
    real_release = LockSpec.release
    calls = []

    def interrupted(self: Any, *args: Any) -> Any:
        # Building the release's call: the hold is marked releasing, nothing is sent.
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_release(self, *args)

    assert lock.acquire()
    monkeypatch.setattr(LockSpec, "release", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    assert calls, "the release took another path: the test no longer tests anything"
    assert lock._is_owned() and client.exists(lock._keys.hash)
    client.delete(lock._keys.hash)  # lost, for real
    wait_until(lambda: lost == [lock], 10, "on_lost call")
    with pytest.raises(rlocks.LockLostError):
        lock.release()


@pytest.mark.timeout(60)
def test_a_cancelled_asyncio_release_of_a_lost_hold_still_reports_the_loss(
    redis_url: str, name: str
) -> None:
    """The release runs on after its task is cancelled (shielded), and its answer is the
    only one that can tell the hold was gone: the loss is reported from it (bug hunt:
    such losses went unreported)."""
    lost: List[Any] = []

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        # (a ttl long enough that its renewer never looks while the test runs)
        lock = ra.RLock(name, client=client, ttl=30, namespace=NAMESPACE, on_lost=lost.append)
        releasing = asyncio.Event()

        async def holder() -> None:  # (the task owns the hold: it must release it too)
            await lock.acquire()
            await client.delete(lock._keys.hash)  # lost, and nothing has noticed yet
            releasing.set()
            await lock.release()

        try:
            task = asyncio.ensure_future(holder())
            await releasing.wait()  # back here once the task awaits its release's answer
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(500):
                if lost:
                    break
                await asyncio.sleep(0.02)
            assert lost == [lock]
        finally:
            await client.aclose()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_on_lost_runs_off_the_renewer_thread_and_its_errors_are_logged(
    client: "redis.Redis[bytes]", name: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: List[str] = []

    def failing(lock: Any) -> None:
        seen.append(threading.current_thread().name)
        raise ValueError("boom")

    lock = rlocks.RLock(name, client=client, ttl=0.5, namespace=NAMESPACE, on_lost=failing)
    assert lock.acquire()
    try:
        client.delete(lock._keys.hash)
        wait_until(lambda: seen, 10, "on_lost call")
        wait_until(
            lambda: any("on_lost" in r.getMessage() and r.exc_info is not None
                        and isinstance(r.exc_info[1], ValueError) for r in caplog.records),
            10,
            "the callback's error logged",
        )
        assert seen == ["rlocks-callbacks"]
        with pytest.raises(rlocks.LockLostError):
            lock.release()
    finally:
        client.delete(lock._keys.hash)


def test_threading_primitive_refuses_async_on_lost(client: "redis.Redis[bytes]") -> None:
    async def on_lost(lock: Any) -> None:  # pragma: no cover - never called
        pass

    for make in (
        lambda: rlocks.RLock("x", client=client, on_lost=on_lost),
        lambda: rlocks.RWLock("x", client=client, on_lost=on_lost),
        lambda: rlocks.Semaphore("x", 2, client=client, on_lost=on_lost),
    ):
        with pytest.raises(TypeError, match="coroutine function"):
            make()


@pytest.mark.timeout(30)
def test_asyncio_twin_awaits_async_on_lost_on_its_loop(redis_url: str, name: str) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        loop = asyncio.get_running_loop()
        called: List[Any] = []
        done = asyncio.Event()

        async def on_lost(lock: Any) -> None:
            await asyncio.sleep(0)  # really awaited: a coroutine left alone never gets here
            called.append((lock, asyncio.get_running_loop()))
            done.set()
            raise ValueError("logged, not raised")

        lock = ra.RLock(name, client=c, ttl=0.5, namespace=NAMESPACE, on_lost=on_lost)
        assert await lock.acquire()
        await c.delete(lock._keys.hash)
        await asyncio.wait_for(done.wait(), 10)
        assert called == [(lock, loop)]
        with pytest.raises(rlocks.LockLostError):
            await lock.release()
        await c.aclose()

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_asyncio_twin_runs_a_slow_sync_on_lost_without_blocking_the_loop(
    redis_url: str, name: str
) -> None:
    finish = threading.Event()
    entered = threading.Event()

    returned = threading.Event()

    def slow(lock: Any) -> None:
        entered.set()
        finish.wait(10)
        returned.set()

    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        lock = ra.RLock(name, client=c, ttl=0.5, namespace=NAMESPACE, on_lost=slow)
        assert await lock.acquire()
        await c.delete(lock._keys.hash)
        deadline = time.monotonic() + 10
        while not entered.is_set():  # the loop keeps running meanwhile
            assert time.monotonic() < deadline, "on_lost never called"
            await asyncio.sleep(0.01)
        # The callback is still running, and the loop still serves other work.
        other = ra.RLock(name + "-other", client=c, ttl=5, namespace=NAMESPACE)
        assert await other.acquire(timeout=5)
        await other.release()
        assert not returned.is_set(), "the loop was blocked until on_lost returned"
        with pytest.raises(rlocks.LockLostError):
            await lock.release()
        await c.aclose()

    try:
        asyncio.run(main())
    finally:
        finish.set()


@pytest.mark.timeout(60)
def test_on_lost_that_exits_its_thread_does_not_silence_later_callbacks(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """A callback that raises a BaseException (``sys.exit()`` in a clean-up, a
    ``KeyboardInterrupt`` re-raised) must not stop every later ``on_lost`` of the process.

    Found: the callback thread catches only Exception; SystemExit ends the thread quietly
    while ``callbacks._thread`` still names it, so later losses are queued behind a dead
    thread and never reported, for the life of the process.
    """
    called: List[str] = []

    def exits(lock: Any) -> None:
        called.append("a")
        raise SystemExit(1)

    a = rlocks.RLock(name + "-a", client=client, ttl=1.0, namespace=NAMESPACE, on_lost=exits)
    b = rlocks.RLock(
        name + "-b", client=client, ttl=1.0, namespace=NAMESPACE,
        on_lost=lambda lock: called.append("b"),
    )
    try:
        assert a.acquire()
        client.delete(a._keys.hash)  # lost; the renewer finds it within ttl/3
        wait_until(lambda: called == ["a"], 10, "on_lost of A")
        assert b.acquire()
        client.delete(b._keys.hash)
        wait_until(lambda: "b" in called, 10, "on_lost of B after A's callback exited")
    finally:
        client.delete(a._keys.hash, b._keys.hash)
