"""Short-lived clients leave nothing behind: no renewer or hub thread, no registry entry,
no server connection, once the program dropped them and their idle time ran out.

The idle exits are lowered here (module constants) so the test does not wait 30 s; it
waits for the state, with a generous deadline, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any, Iterator

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio
from rlocks._engine import aio, renewal, waiting, wakehub
from rlocks.server import TemporaryRedisServer

from ._servers import wait_until

NS = "rlocks-life"
CLIENTS = 40


@pytest.fixture
def quick_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(renewal, "IDLE_EXIT", 0.2)
    monkeypatch.setattr(wakehub, "IDLE_EXIT", 0.2)
    monkeypatch.setattr(wakehub, "LINGER", 0.0)


@pytest.fixture
def server() -> Iterator[TemporaryRedisServer]:
    # A server of its own: its CLIENT LIST shows this test's connections and no others.
    with TemporaryRedisServer() as s:
        yield s


def rlocks_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("rlocks-"))


def connections(admin: "redis.Redis[bytes]") -> int:
    return len(admin.client_list())


@pytest.mark.timeout(90)
def test_dropped_clients_leave_no_threads_registries_or_connections(
    quick_idle: None, server: TemporaryRedisServer
) -> None:
    admin = redis.Redis(port=server.port, socket_timeout=10)
    # Held for the whole test, not renewed: each short-lived client waits on it once, so
    # each gets a wake-up hub with a subscription, as well as a renewer for its own lock.
    busy = rlocks.RLock("busy", client=admin, namespace=NS, ttl=120, auto_renew=False)
    assert busy.acquire()
    baseline = connections(admin)
    threads, hubs, renewers = rlocks_threads(), len(waiting._hubs), len(renewal._renewers)

    def use_once(i: int) -> None:
        # As the Quick start builds one; every other one with redis-py's retries, for which
        # rlocks makes a pool of its own that must go away with the client too.
        client = redis.Redis.from_url(server.url) if i % 2 else redis.Redis(port=server.port)
        with rlocks.RLock(f"short-{i}", client=client, namespace=NS, ttl=5):
            pass
        assert not rlocks.RLock("busy", client=client, namespace=NS).acquire(timeout=0.05)

    errors: list = []

    def use_all() -> None:  # in another thread: another owner than busy's holder
        try:
            for i in range(CLIENTS):
                use_once(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    worker = threading.Thread(target=use_all)
    worker.start()
    worker.join(60)
    if errors:
        raise errors[0]

    def gone() -> bool:
        gc.collect()
        return (
            rlocks_threads() <= threads
            and len(waiting._hubs) <= hubs
            and len(renewal._renewers) <= renewers
            and connections(admin) <= baseline
        )

    try:
        wait_until(gone, 60, "dropped clients' threads, hubs, renewers and connections")
    except AssertionError:
        raise AssertionError(
            f"threads {rlocks_threads()} (was {threads}), hubs {len(waiting._hubs)} (was "
            f"{hubs}), renewers {len(renewal._renewers)} (was {renewers}), connections "
            f"{connections(admin)} (was {baseline})"
        ) from None
    # Nothing was broken on the way: a new client waits and is woken as before.
    client = redis.Redis.from_url(server.url)
    late = rlocks.RLock("busy", client=client, namespace=NS)
    got = threading.Event()

    def wait_late() -> None:
        if late.acquire(timeout=30):
            got.set()
            late.release()

    waiter = threading.Thread(target=wait_late)
    waiter.start()
    wait_until(
        lambda: waiting.hub_for(client, NS).has_waiters(late._channel()), 10, "the waiter"
    )
    busy.release()
    waiter.join(30)
    assert got.is_set()
    admin.close()


@pytest.mark.timeout(90)
def test_dropped_asyncio_clients_leave_no_hubs_or_connections(
    quick_idle: None, server: TemporaryRedisServer
) -> None:
    admin = redis.Redis(port=server.port, socket_timeout=10)
    busy = rlocks.RLock("busy", client=admin, namespace=NS, ttl=120, auto_renew=False)
    assert busy.acquire()
    baseline = connections(admin)

    async def main() -> None:
        async def use_once(i: int) -> None:
            # As the README builds one: with redis-py's retries, so rlocks makes a pool of its
            # own for it, which must go away with the client too.
            client: Any = redis.asyncio.Redis(port=server.port)
            async with rlocks.asyncio.RLock(f"short-{i}", client=client, namespace=NS, ttl=5):
                pass
            lock = rlocks.asyncio.RLock("busy", client=client, namespace=NS)
            assert not await lock.acquire(timeout=0.05)

        for i in range(CLIENTS):
            await use_once(i)
        table = aio._hubs[asyncio.get_running_loop()]
        assert len(table) > 0  # (the hubs exist while their tasks run)
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            gc.collect()
            if len(table) == 0 and connections(admin) <= baseline:
                return
            assert asyncio.get_running_loop().time() < deadline, (
                f"hubs {len(table)}, connections {connections(admin)} (was {baseline})"
            )
            await asyncio.sleep(0.05)

    asyncio.run(main())
    busy.release()
    admin.close()


def test_a_lease_added_and_cancelled_while_the_renewer_slept_restarts_its_idle_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The renewer's loop sleeps up to IDLE_EXIT while it has no lease. A hold taken and
    released before it woke leaves no lease behind, but it was use: the loop must not
    exit on waking as if it had been idle all along (a new thread then starts at the next
    hold: CI's CPython lock tests counted that thread as one the test leaked)."""
    renewer = renewal.Renewer()
    now = [1000.0]
    monkeypatch.setattr(renewal, "monotonic", lambda: now[0])
    renewer._runner = threading.current_thread()  # a running stand-in: add() starts none
    idle_since = now[0] - 2 * renewal.IDLE_EXIT  # idle for long, asleep
    owner = _Holder()
    lease = renewer.add(owner, "o", 30.0, now[0])
    renewer.cancel(lease)
    now[0] += 1.0  # it wakes: nothing to renew
    with renewer._mutex:
        due, pause, _ = renewer._schedule_locked(now[0], idle_since)
    assert due == [] and pause is not None, "the renewer exited right after being used"
    assert renewer._runner is not None
    # With no further use it does exit, IDLE_EXIT after that last use.
    now[0] += renewal.IDLE_EXIT
    with renewer._mutex:
        assert renewer._schedule_locked(now[0], idle_since)[1] is None
    assert renewer._runner is None


def test_a_hand_over_grant_wakes_the_renewer_only_if_its_next_wake_is_too_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A grant kept unadopted (its short lease ends at ``short``) is due ADOPT_AFTER from
    now, but may be renewed as late as a third of what is left. A loop that wakes within
    that third anyway is not woken now (the thread just handed the lock needs the GIL),
    and renews the grant when it wakes; a loop that would wake later is woken."""
    renewer = renewal.Renewer()
    now = [1000.0]
    monkeypatch.setattr(renewal, "monotonic", lambda: now[0])
    renewer._runner = threading.current_thread()  # a running stand-in: add() starts none
    woken = []
    monkeypatch.setattr(renewer, "_notify_locked", lambda: woken.append(now[0]))
    owner = _Holder()
    entry = renewer.add_entry(owner, "e", 1.5)  # due in 0.5 s: the loop plans that wake
    with renewer._mutex:
        assert renewer._schedule_locked(now[0], None)[:2] == ([], 0.5)
    woken.clear()
    grant = renewer.add(owner, "o", 30.0, now[0], short=now[0] + 2.0)  # third: 0.667 s
    assert woken == [], "woken although it wakes within the grant's third anyway"
    assert grant.due == pytest.approx(now[0] + renewal.ADOPT_AFTER)
    now[0] += 0.5
    with renewer._mutex:
        due, _, _ = renewer._schedule_locked(now[0], None)
    assert grant in due and entry in due, "the grant waited past the loop's wake-up"
    renewer.cancel(grant)
    renewer.cancel(entry)
    hold = renewer.add(owner, "h", 30.0, now[0])  # due in 10 s: the loop's next wake
    with renewer._mutex:
        renewer._schedule_locked(now[0], None)
    woken.clear()
    renewer.add(owner, "o", 30.0, now[0], short=now[0] + 2.0)
    assert woken == [now[0]], "not woken, though its next wake comes after the third"
    renewer.cancel(hold)


def test_after_a_message_the_hub_goes_straight_back_to_its_blocking_read(
    client: "redis.Redis[bytes]", monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub's reader dialogue (I/O-free, driven here step by step): after dispatching a
    message that woke a waiter, its next step is the blocking read, not a poll for more.
    The woken thread needs the GIL, which the hub thread gives up only in that read."""
    hub = wakehub.WakeHub(client, "rlocks-test")
    hub._runner = threading.current_thread()  # a running stand-in: register() starts none
    monkeypatch.setattr(hub, "_nudge", lambda: None)
    mine = f"{rlocks._engine.identity.process_token()}:1:1"
    waiter = hub.register("chan", mine)
    steps = hub._reader_steps()
    assert next(steps)[0] == wakehub.HubOp.OPEN
    assert steps.send("pubsub")[0] == wakehub.HubOp.SUBSCRIBE  # the control channel
    assert steps.send(None)[:3] == (wakehub.HubOp.SUBSCRIBE, "pubsub", ("chan",))
    assert steps.send(None) == (wakehub.HubOp.READ, "pubsub", wakehub.TICK)
    step = steps.send({"type": "subscribe", "channel": b"chan", "data": 2})
    assert step == (wakehub.HubOp.READ, "pubsub", wakehub.TICK)
    assert waiter.subscribed
    step = steps.send({"type": "message", "channel": b"chan", "data": f"g {mine} 7".encode()})
    assert waiter.event.is_set() and waiter.state == wakehub.GRANTED and waiter.token == 7
    assert step == (wakehub.HubOp.READ, "pubsub", wakehub.TICK), "polled before blocking"
    hub.unregister(waiter)
    # End the dialogue as a lost connection does: pause, close, then a fresh start that
    # holds no connection, where it may be closed.
    assert steps.throw(OSError("gone"))[0] == wakehub.HubOp.PAUSE
    assert steps.send(None) == (wakehub.HubOp.CLOSE, "pubsub", None)
    assert steps.send(None)[0] == wakehub.HubOp.OPEN
    steps.close()


class _Holder:
    """Enough of a primitive for a Lease to refer to (weakly)."""
