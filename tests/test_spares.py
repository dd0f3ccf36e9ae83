"""rlocks' own round trips hand their connection on to each other (clients.Spares).

redis-py's pool checks every connection it hands out for unread bytes (three system
calls); a connection one of rlocks' round trips read a whole reply from is set aside and
used again without that check, for a moment. These tests hold what makes that safe: the
set-aside connections stay few and short-lived, a bounded pool keeps none, a connection
the server closed meanwhile is ridden through, a fork child never shares its parent's,
and a dropped client takes them with it.
"""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any, Callable, Iterator, List

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import rlocks
from rlocks._engine import clients
from rlocks._engine.clients import io_client

from .conftest import NAMESPACE
from .test_fork import checked, fork, reap

CYCLES = 50


def own_client(redis_url: str, **kwargs: Any) -> "redis.Redis[bytes]":
    """A client rlocks sends through as it is (short timeouts, no retries), so its pool
    is the one the round trips use."""
    client = redis.Redis.from_url(
        redis_url, socket_timeout=10, socket_connect_timeout=5, retry=Retry(NoBackoff(), 0),
        **kwargs,
    )
    assert io_client(client) is client
    return client


class Counted:
    """Counts the checked hand-outs of ``pool`` (its ``get_connection``), behaviour kept."""

    def __init__(self, pool: Any) -> None:
        self.calls = 0
        real: Callable[..., Any] = pool.get_connection

        def get_connection(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        pool.get_connection = get_connection


def cycles(lock: Any, n: int = CYCLES) -> None:
    for _ in range(n):
        assert lock.acquire(timeout=5)
        lock.release()


@pytest.fixture
def client(redis_url: str) -> Iterator["redis.Redis[bytes]"]:
    c = own_client(redis_url)
    yield c
    c.close()


def test_round_trips_in_a_row_take_one_checked_connection(
    client: "redis.Redis[bytes]", name: str
) -> None:
    pool = client.connection_pool
    counted = Counted(pool)
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    cycles(lock)  # 100 script round trips
    assert counted.calls <= 2, counted.calls
    assert len(pool._in_use_connections) <= clients.SPARES_MAX


def test_a_connection_set_aside_too_long_goes_back_to_the_pool(
    client: "redis.Redis[bytes]", name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "SPARE_FOR", 0.0)
    pool = client.connection_pool
    counted = Counted(pool)
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    cycles(lock)
    # every round trip took a checked connection; the stale ones went back
    assert counted.calls >= 2 * CYCLES
    assert len(pool._in_use_connections) <= clients.SPARES_MAX


@pytest.mark.parametrize("kind", ["blocking", "small"])
def test_a_bounded_pool_sets_nothing_aside(redis_url: str, name: str, kind: str) -> None:
    if kind == "blocking":
        pool: Any = redis.BlockingConnectionPool.from_url(
            redis_url, max_connections=4, timeout=5, socket_timeout=10,
            socket_connect_timeout=5, retry=Retry(NoBackoff(), 0),
        )
    else:
        pool = redis.ConnectionPool.from_url(
            redis_url, max_connections=clients.SPARES_MIN_POOL - 1, socket_timeout=10,
            socket_connect_timeout=5, retry=Retry(NoBackoff(), 0),
        )
    client = redis.Redis(connection_pool=pool)
    assert io_client(client) is client
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    cycles(lock)
    assert not clients.spares_for(pool).idle  # every connection is the pool's to hand out
    client.close()


@pytest.mark.parametrize("kind", ["rlock", "semaphore"])
def test_a_set_aside_connection_the_server_closed_is_ridden_through(
    client: "redis.Redis[bytes]", redis_url: str, name: str, kind: str
) -> None:
    admin = redis.Redis.from_url(redis_url, socket_timeout=10)
    prim: Any = (
        rlocks.RLock(name, client=client, namespace=NAMESPACE)
        if kind == "rlock"
        else rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE)
    )
    mine = client.client_id()  # a command of the test's own, on a connection of the pool
    for i in range(20):
        assert prim.acquire(timeout=5)
        # every connection of this pool but the admin's, set aside or not, closed by the
        # server between two round trips (a CLIENT KILL, an idle time-out, a restart)
        killed = admin.client_kill_filter(_type="normal", skipme=True) if i % 2 else 0
        prim.release()
        if i % 2 == 0:
            killed = admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
    assert prim.acquire(timeout=5)
    prim.release()
    assert client.client_id() != mine  # the test's own connection was closed too
    admin.close()


def test_a_dropped_client_takes_its_set_aside_connections_with_it(
    redis_url: str, name: str
) -> None:
    refs: List["weakref.ref[Any]"] = []

    def use() -> None:
        c = own_client(redis_url)
        cycles(rlocks.RLock(name, client=c, namespace=NAMESPACE), 3)
        assert clients.spares_for(c.connection_pool).idle
        refs.append(weakref.ref(c.connection_pool))

    use()
    for _ in range(3):
        gc.collect()
    assert refs[0]() is None, "the pool outlived its client"


def test_a_fork_child_takes_a_connection_of_its_own(redis_url: str) -> None:
    c = own_client(redis_url)
    pool = c.connection_pool
    spares = clients.Spares(pool)
    parents = pool.get_connection()
    spares.give(pool, parents)
    assert [conn for conn, _ in spares.idle] == [parents]

    def child(pipe: Any) -> None:
        taken = spares.take(pool)
        pipe.send({"parents": taken is parents, "idle": len(spares.idle)})
        taken.send_command("PING")
        pipe.send({"reply": taken.read_response().decode()})

    pid, pipe = fork(child)
    try:
        assert checked(pipe.recv(10)) == {"parents": False, "idle": 0}
        assert checked(pipe.recv(10)) == {"reply": "PONG"}
    finally:
        assert reap(pid, 10) == 0
        pipe.close()
    assert spares.take(pool) is parents  # still the parent's to use
    c.close()


def test_a_connection_on_a_descriptor_above_1024_is_handed_on(
    redis_url: str, name: str
) -> None:
    # select() refuses descriptors of FD_SETSIZE (1,024) and above: a process with many
    # open files must still hand its connections on (the check is poll's where it exists).
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        c = own_client(redis_url)
        lock = rlocks.RLock(name, client=c, namespace=NAMESPACE)
        cycles(lock, 5)
        idle = clients.spares_for(c.connection_pool).idle
        assert idle and idle[0][0]._sock.fileno() >= 1024
        counted = Counted(c.connection_pool)
        cycles(lock)
        assert counted.calls <= 2, counted.calls
        c.close()
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
