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
from rlocks._engine import backends, renewal, wakeups
from rlocks.server import TemporaryRedisServer

from ._servers import wait_until
from ._threads import hub_waiters

NS = "rlocks-life"
CLIENTS = 40


@pytest.fixture
def quick_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(renewal, "IDLE", 0.2)
    monkeypatch.setattr(wakeups, "IDLE", 0.2)


def hubs() -> int:
    """Wake-up subscribers (threads' and loops') of every backend still alive."""
    servers = list(backends._servers)
    return sum(len(s._hubs) + sum(len(t) for t in list(s._async_hubs.values()))
               for s in servers)


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
    threads, hubs0, renewers = rlocks_threads(), hubs(), len(renewal._threads)

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
            and hubs() <= hubs0
            and len(renewal._threads) <= renewers
            and connections(admin) <= baseline
        )

    try:
        wait_until(gone, 60, "dropped clients' threads, hubs, renewers and connections")
    except AssertionError:
        raise AssertionError(
            f"threads {rlocks_threads()} (was {threads}), hubs {hubs()} (was "
            f"{hubs0}), renewers {len(renewal._threads)} (was {renewers}), connections "
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
    wait_until(lambda: bool(hub_waiters(late)), 10, "the waiter")
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
    before = hubs()

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
        assert hubs() > before  # (the hubs exist while their tasks run)
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            gc.collect()
            if hubs() <= before and connections(admin) <= baseline:
                return
            assert asyncio.get_running_loop().time() < deadline, (
                f"hubs {hubs()} (was {before}), connections {connections(admin)} "
                f"(was {baseline})"
            )
            await asyncio.sleep(0.05)

    asyncio.run(main())
    busy.release()
    admin.close()
