"""replicas= / replica_wait=: WAIT after grants and renewals, on a real master + replica."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Iterator, List, Tuple

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio as ra
from rlocks._engine import identity
from rlocks.server import TemporaryRedisServer

from ._servers import wait_until
from .conftest import NAMESPACE


@pytest.fixture(scope="module")
def pair() -> Iterator[Tuple[TemporaryRedisServer, TemporaryRedisServer]]:
    with TemporaryRedisServer() as master:
        with TemporaryRedisServer(["--replicaof", "127.0.0.1", str(master.port)]) as replica:
            r = redis.Redis(port=replica.port)
            wait_until(
                lambda: r.info("replication").get("master_link_status") == "up",
                15,
                "the replica to sync with its master",
            )
            yield master, replica


def key(name: str) -> str:
    return f"{NAMESPACE}:rlock:{{{name}}}"


def test_a_grant_is_on_the_replica_when_acquire_returns(pair: Any, name: str) -> None:
    master, replica = pair
    lock = rlocks.RLock(
        name, client=redis.Redis(port=master.port), namespace=NAMESPACE, replicas=1
    )
    assert lock.acquire()
    # No waiting here: WAIT already made acquire() return only after the replica had it.
    seen = redis.Redis(port=replica.port).hget(key(name), identity.thread_owner())
    assert seen == b"1"
    lock.release()


def test_too_few_replicas_gives_the_grant_back(pair: Any, name: str) -> None:
    master, _ = pair
    client = redis.Redis(port=master.port)
    # Three times the default replica_wait (1 s), so a WAIT sent with the default instead
    # of this returns 2 s early and fails the lower bound.
    lock = rlocks.RLock(
        name, client=client, namespace=NAMESPACE, replicas=2, replica_wait=3.0
    )
    start = time.monotonic()
    with pytest.raises(rlocks.errors.ReplicationError, match="1 of 2 replicas") as info:
        lock.acquire()
    # WAIT gave up after replica_wait: not at once (3 ms: milliseconds taken for seconds),
    # nor after the default 1 s, nor after 3,000 s or never (WAIT 0: the test's time-out);
    # 4 s of slack for a loaded machine. (WAIT's own timer cannot end early.)
    assert 2.95 <= time.monotonic() - start < 7.0
    assert (info.value.acknowledged, info.value.required) == (1, 2)
    assert not client.exists(key(name))  # given back
    assert lock._recursion_count() == 0


def test_reentry_short_of_replicas_gives_back_only_that_level(pair: Any, name: str) -> None:
    master, _ = pair
    client = redis.Redis(port=master.port)
    outer = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    strict = rlocks.RLock(name, client=client, namespace=NAMESPACE, replicas=2, replica_wait=0.1)
    outer.acquire()
    with pytest.raises(rlocks.errors.ReplicationError):
        strict.acquire()
    assert client.hget(key(name), identity.thread_owner()) == b"1"  # the outer level stays
    outer.release()
    assert not client.exists(key(name))


def test_asyncio_twin_waits_for_replicas_too(pair: Any, name: str) -> None:
    master, replica = pair

    async def main() -> None:
        client = redis.asyncio.Redis(port=master.port)
        ok = ra.RLock(name, client=client, namespace=NAMESPACE, replicas=1)
        async with ok:
            assert await redis.asyncio.Redis(port=replica.port).exists(key(name))
        strict = ra.RLock(name, client=client, namespace=NAMESPACE, replicas=3, replica_wait=0.1)
        with pytest.raises(rlocks.errors.ReplicationError):
            await strict.acquire()
        assert not await client.exists(key(name))

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_a_queued_waiters_grant_short_of_replicas_is_given_back_too(
    pair: Any, name: str, kind: str
) -> None:
    """A waiter that queued and is granted once the holder releases (woken by the
    release, which WAITs for nobody) gets the same WAIT as an uncontended grant: short of
    replicas, it is given back and raises."""
    master, _ = pair
    client = redis.Redis(port=master.port)

    def make(**kw: Any) -> Any:
        if kind == "rlock":
            return rlocks.RLock(name, client=client, namespace=NAMESPACE, **kw)
        return rlocks.Semaphore(name, 1, client=client, namespace=NAMESPACE, **kw)

    holder = make()
    strict = make(replicas=2, replica_wait=0.1)
    queue = strict._keys.queue
    assert holder.acquire()
    errors: List[BaseException] = []
    results: List[bool] = []

    def waiter() -> None:
        try:
            results.append(strict.acquire(timeout=20))
        except BaseException as exc:  # noqa: BLE001 - checked in the main thread
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        wait_until(lambda: client.zcard(queue) == 1, 15, "the waiter to queue")
        holder.release()
    finally:
        thread.join(30)
    assert not thread.is_alive()
    assert results == [] and len(errors) == 1, (results, errors)
    assert isinstance(errors[0], rlocks.errors.ReplicationError), errors
    assert (errors[0].acknowledged, errors[0].required) == (1, 2)
    # given back: nobody holds it, and a plain acquire gets it at once
    assert holder.acquire(blocking=False)
    holder.release()
    assert not client.exists(strict._keys.hash)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_replicas_argument(client: Any, name: str, bad: Any, error: type) -> None:
    with pytest.raises(error, match="replicas"):
        rlocks.RLock(name, client=client, replicas=bad)
    with pytest.raises(ValueError, match="replica_wait"):
        rlocks.Semaphore(name, 2, client=client, replicas=1, replica_wait=0)


def test_a_renewal_short_of_replicas_is_logged(caplog: pytest.LogCaptureFixture, name: str) -> None:
    # A pair of its own: this test stops the replica.
    with TemporaryRedisServer() as master:
        with TemporaryRedisServer(["--replicaof", "127.0.0.1", str(master.port)]) as replica:
            r = redis.Redis(port=replica.port)
            wait_until(lambda: r.info("replication").get("master_link_status") == "up", 15, "sync")
            caplog.set_level(logging.WARNING, logger="rlocks")
            lock = rlocks.RLock(
                name,
                client=redis.Redis(port=master.port),
                namespace=NAMESPACE,
                # 0.6 s was lost once under load before the warning came. replica_wait
                # 0.05 s failed the acquire itself once under load (the live replica's ack
                # took longer); 0.5 s is far above an ack's time and a renewal's WAIT of
                # 0.5 s stays well inside the lease (renewed every ttl / 3 = 2 s).
                ttl=6,
                replicas=1,
                replica_wait=0.5,
            )
            lock.acquire()
            replica.stop()
            wait_until(
                lambda: any("of 1 replicas" in rec.getMessage() and name in rec.getMessage()
                            for rec in caplog.records),
                15,
                "a renewal warning",
            )
            lock.release()  # the lease itself was renewed on the master all along
