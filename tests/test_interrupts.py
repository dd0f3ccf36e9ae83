"""An exception raised by a signal handler while an acquire's script is in flight.

``KeyboardInterrupt`` and ``signal.alarm``-style timeouts raise in the main thread wherever
it is, here while it waits for the acquire script's answer. The script runs anyway; a grant
nobody records would stay in Redis, unrenewed and unreleasable, until its lease ends. The
acquire must give back exactly what it was granted (never an outer level the thread still
holds) and then let the exception through.

The round trip is slowed by a proxy (tests/_proxy.py) on a server of this module's own,
and a real ``SIGALRM`` from ``signal.setitimer`` interrupts it. A keyspace notification of
the grant's own write says when the slowed acquire script has surely run (whatever other
scripts the engine sends meanwhile), so the check waits for state.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any, Callable, Iterator, List, Tuple

import pytest
import redis

import rlocks
from rlocks._engine.identity import thread_owner
from rlocks._engine.renewal import renewer_for
from rlocks.server import TemporaryRedisServer

from ._proxy import FaultyLink
from ._servers import wait_until
from .conftest import NAMESPACE, load_scripts

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"),
    reason="needs signal.setitimer in the main thread",
)

DELAY = 0.4  # s the proxy holds each chunk, each way
ALARM = 0.1  # s after the acquire starts, the signal handler raises


class Interrupted(Exception):
    """What the test's signal handler raises (an alarm-based timeout)."""


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryRedisServer]:
    with TemporaryRedisServer() as srv:
        yield srv


@pytest.fixture
def direct(server: TemporaryRedisServer) -> Iterator["redis.Redis[bytes]"]:
    c = redis.Redis.from_url(server.url, socket_timeout=10, socket_connect_timeout=5)
    yield c
    c.close()


@pytest.fixture
def link(server: TemporaryRedisServer) -> Iterator[FaultyLink]:
    with FaultyLink(server.port) as faulty:
        yield faulty


@pytest.fixture
def slowed(link: FaultyLink) -> Iterator["redis.Redis[bytes]"]:
    """A client through ``link``, which :func:`interrupted` slows during the acquire."""
    c = redis.Redis.from_url(link.url, socket_timeout=10, socket_connect_timeout=5)
    yield c
    c.close()


class Granted:
    """Waits for the acquire script itself to have run, whatever other scripts the
    engine sends meanwhile (a queue leave, a give-back): a grant writes the hash with
    HSET (a fresh hold) or HINCRBY (a re-entry), which keyspace notifications report."""

    def __init__(self, direct: "redis.Redis[bytes]", key: str) -> None:
        direct.config_set("notify-keyspace-events", "Kh")  # this module's own server
        self.sub = direct.pubsub()
        self.sub.subscribe(f"__keyspace@0__:{key}")
        assert self.sub.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]

    def wait(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                message = self.sub.get_message(timeout=0.1)
                if message is not None and message["data"] in (b"hset", b"hincrby"):
                    return
            raise AssertionError(f"the acquire script did not run within {timeout} s")
        finally:
            self.sub.close()


def interrupted(
    direct: "redis.Redis[bytes]", link: FaultyLink, action: Callable[[], Any], key: str
) -> None:
    """Run ``action`` (one acquire script) over ``link`` slowed by DELAY s each way, with a
    SIGALRM raising in its round trip; return once that script has surely run."""
    granted = Granted(direct, key)

    def handler(signum: int, frame: Any) -> None:
        link.heal()  # what follows (the answer, a give-back) need not be slow
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        link.slow(DELAY)
        signal.setitimer(signal.ITIMER_REAL, ALARM)
        with pytest.raises(Interrupted):
            action()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        link.heal()
    granted.wait()


def make(kind: str, name: str, client: Any) -> Tuple[Any, str, Any]:
    """(primitive, its hash key, the field its owner's count is kept in)."""
    if kind == "rlock":
        lock = rlocks.RLock(name, client=client, ttl=30, namespace=NAMESPACE)
        return lock, lock._keys.hash, thread_owner()
    if kind in ("write", "read"):
        rw = rlocks.RWLock(name, client=client, ttl=30, namespace=NAMESPACE)
        side = rw.write_lock if kind == "write" else rw.read_lock
        return side, side._keys.hash, f"{kind[0]}:{thread_owner()}"
    sem = rlocks.Semaphore(name, 3, client=client, ttl=30, namespace=NAMESPACE)
    return sem, sem._keys.hash, thread_owner()  # a permit is the taking thread's


def scripts_of(prim: Any) -> List[Any]:
    spec = prim._spec
    return [spec.acquire_script, spec.release_script, spec.renew_script, spec.leave_script]


def preload(direct: "redis.Redis[bytes]", prim: Any) -> None:
    """Load every script of ``prim`` (a NOSCRIPT answer and its retry would count twice),
    and open ``prim``'s connection while the link is fast: the signal must come during
    the script's round trip, not during the connection's handshake."""
    prim.client.ping()
    warm = rlocks.RLock(f"warm-{uuid.uuid4().hex}", client=prim.client, namespace=NAMESPACE,
                        auto_renew=False)
    assert warm.acquire()  # (the connection rlocks sends its own calls through, too)
    warm.release()
    load_scripts(direct, *scripts_of(prim))


def renewed(prim: Any) -> int:
    """Live holds of ``prim``'s name its renewer keeps (other tests' come and go)."""
    schedule = renewer_for(prim._backend).schedule
    holds = {id(h): h for _, _, ref in list(schedule.heap) if (h := ref()) is not None}
    return sum(1 for h in holds.values() if h.alive and h.ident[1] == prim._keys.hash)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "write", "read", "sem"])
def test_interrupted_acquire_leaves_nothing_in_redis(
    direct: "redis.Redis[bytes]",
    link: FaultyLink,
    slowed: "redis.Redis[bytes]",
    name: str,
    kind: str,
) -> None:
    prim, key, _field = make(kind, name, slowed)
    preload(direct, prim)
    try:
        interrupted(direct, link, prim.acquire, key)
        # The grant came back after the interrupt and was given back before it propagated.
        assert not direct.exists(key), direct.hgetall(key)
        assert renewed(prim) == 0
        assert "not held here" in repr(prim) or "held here=0" in repr(prim)
        # The primitive is usable afterwards (its connection pool was left clean).
        assert prim.acquire(timeout=10)
        prim.release()
        assert not direct.exists(key)
    finally:
        direct.delete(key)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_an_interrupt_in_the_call_sent_again_after_a_refusal_leaves_nothing(
    direct: "redis.Redis[bytes]", link: FaultyLink, name: str, kind: str
) -> None:
    """A server that lost its scripts (a restart, SCRIPT FLUSH) refuses the first call
    (NOSCRIPT); the script is loaded and the call sent again. An interrupt in that second
    round trip must leave nothing held, as one in a first round trip does."""
    client = redis.Redis.from_url(link.url, socket_timeout=10, socket_connect_timeout=5)
    prim, key, _field = make(kind, name, client)
    client.ping()  # connected while the link is fast
    sha = prim._spec.acquire_script.sha
    direct.script_flush()
    granted = Granted(direct, key)

    def refused() -> bool:
        """The server has done what comes before the second send: the refusal (NOSCRIPT),
        then the load."""
        return bool(direct.script_exists(sha)[0])

    main = threading.get_ident()

    def interrupt() -> None:
        wait_until(refused, 20, "the refusal and the load before the second send")
        # The load's answer takes DELAY back; the second send is then held DELAY on its
        # way there: the signal comes half-way, before the server runs it. (A give-back
        # that only reads the hold after the signal, on another connection, reads it
        # before the script has run: it must be fenced.)
        time.sleep(1.5 * DELAY)
        signal.pthread_kill(main, signal.SIGALRM)

    armed = threading.Event()  # the handler raises only inside the acquire

    def handler(signum: int, frame: Any) -> None:
        link.heal()
        if armed.is_set():
            armed.clear()
            raise Interrupted()

    refused()  # (its client connected and its code warm before the clock matters)
    previous = signal.signal(signal.SIGALRM, handler)
    trigger = threading.Thread(target=interrupt)
    try:
        trigger.start()
        link.slow(DELAY)
        armed.set()
        with pytest.raises(Interrupted):
            prim.acquire()
    finally:
        armed.clear()
        trigger.join(30)
        signal.signal(signal.SIGALRM, previous)
        link.heal()
    try:
        granted.wait()  # the second send ran
        assert not direct.exists(key), direct.hgetall(key)
        assert prim.acquire(timeout=10)
        prim.release()
        assert not direct.exists(key)
    finally:
        direct.delete(key)
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "write", "read"])
def test_interrupted_reentry_gives_back_only_its_own_level(
    direct: "redis.Redis[bytes]",
    link: FaultyLink,
    slowed: "redis.Redis[bytes]",
    name: str,
    kind: str,
) -> None:
    prim, key, field = make(kind, name, slowed)
    preload(direct, prim)
    try:
        assert prim.acquire()
        interrupted(direct, link, prim.acquire, key)
        # Exactly the interrupted level was given back: the outer one is still held.
        assert direct.hget(key, field) == b"1"
        assert prim._recursion_count() == 1
        prim.release()
        assert not direct.exists(key)
    finally:
        direct.delete(key)


# -- asyncio: a cancelled release ------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_release_cancelled_while_connecting_still_reaches_redis(
    direct: "redis.Redis[bytes]", link: FaultyLink, name: str, kind: str
) -> None:
    import asyncio

    import redis.asyncio

    import rlocks.asyncio as ra

    async def main() -> None:
        c = redis.asyncio.Redis.from_url(link.url, socket_timeout=10, socket_connect_timeout=5)
        if kind == "rlock":
            prim: Any = ra.RLock(name, client=c, ttl=30, namespace=NAMESPACE)
        else:
            prim = ra.Semaphore(name, 2, client=c, ttl=30, namespace=NAMESPACE)
        key = prim._keys.hash
        releasing = asyncio.Event()

        async def holder() -> None:  # the owner is the task (RLock): one task does both
            assert await prim.acquire()
            # The release must open a new connection, and opening it is slow.
            await c.connection_pool.disconnect()
            link.slow(DELAY)
            releasing.set()
            await prim.release()

        task = asyncio.ensure_future(holder())
        await releasing.wait()
        await asyncio.sleep(ALARM)  # a point in time during the connection's handshake
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        link.heal()
        try:
            # Cancelled or not, the release reaches Redis: the hold is gone long before
            # its 30 s lease would end (the loop keeps running while we look).
            deadline = time.monotonic() + 10
            while direct.exists(key):
                assert time.monotonic() < deadline, "the cancelled release never landed"
                await asyncio.sleep(0.01)
        finally:
            await c.aclose()
            direct.delete(key)

    asyncio.run(main())
