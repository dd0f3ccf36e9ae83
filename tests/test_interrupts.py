"""An exception raised by a signal handler while an acquire's script is in flight.

``KeyboardInterrupt`` and ``signal.alarm``-style timeouts raise in the main thread wherever
it is, here while it waits for the acquire script's answer. The script runs anyway; a grant
nobody records would stay in Redis, unrenewed and unreleasable, until its lease ends. The
acquire must give back exactly what it was granted (never an outer level the thread still
holds) and then let the exception through.

The round trip is slowed by a proxy (tests/_proxy.py) on a server of this module's own,
and a real ``SIGALRM`` from ``signal.setitimer`` interrupts it. The server's count of script runs
says when the slowed acquire script has surely run, so the check waits for state.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Tuple

import pytest
import redis

import rlocks
from rlocks._engine import renewal
from rlocks._engine.identity import process_owner, thread_owner
from rlocks.server import TemporaryRedisServer

from ._proxy import FaultyLink
from ._servers import wait_until
from .conftest import NAMESPACE, has_functions, load_scripts, script_calls

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


def interrupted(
    direct: "redis.Redis[bytes]", link: FaultyLink, action: Callable[[], Any], kind: str
) -> None:
    """Run ``action`` (one acquire script) over ``link`` slowed by DELAY s each way, with a
    SIGALRM raising in its round trip; return once that script has surely run.

    A writer also withdraws its claim when it stops waiting: one more script, which may
    run before the slowed acquire does.
    """
    before = script_calls(direct)

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
    scripts = 2 if kind == "write" else 1
    wait_until(lambda: script_calls(direct) >= before + scripts, 10, "the acquire to run")


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
    return sem, sem._keys.hash, process_owner()


def preload(direct: "redis.Redis[bytes]", prim: Any) -> None:
    """Load every script of ``prim`` (a NOSCRIPT answer and its retry would count twice),
    and open ``prim``'s connection while the link is fast: the signal must come during
    the script's round trip, not during the connection's handshake."""
    prim.client.ping()
    # Its pool learns whether the server runs functions (Redis 6.2: one refused FCALL).
    warm = rlocks.RLock(f"warm-{uuid.uuid4().hex}", client=prim.client, namespace=NAMESPACE,
                        auto_renew=False)
    assert warm.acquire()
    warm.release()
    attrs = ("_acquire_script", "_release_script", "_renew_script", "_unclaim_script")
    load_scripts(direct, *(getattr(prim, a) for a in attrs if getattr(prim, a, None)))


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
    leases = renewal.lease_count()
    try:
        interrupted(direct, link, prim.acquire, kind)
        # The grant came back after the interrupt and was given back before it propagated.
        assert not direct.exists(key), direct.hgetall(key)
        assert renewal.lease_count() == leases
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
    """A server that lost the queue library (restart, FUNCTION FLUSH), or a pool that has
    not learnt yet that its server has no FCALL (Redis 6.2), refuses the first call; the
    library is loaded, or EVALSHA chosen, and the call sent again. An interrupt in that
    second round trip must leave nothing held, as one in a first round trip does (before,
    the second send went through a path that gave nothing back)."""
    client = redis.Redis.from_url(link.url, socket_timeout=10, socket_connect_timeout=5)
    prim, key, _field = make(kind, name, client)
    client.ping()  # connected while the link is fast
    functions = has_functions(direct)
    direct.script_load(prim._acquire_script.source)  # no NOSCRIPT round trip on 6.2
    if functions:
        direct.function_flush()
    errors = int(direct.info("stats")["total_error_replies"])
    runs = script_calls(direct)

    def refused() -> bool:
        """The server has done what comes before the second send."""
        if functions:
            return bool(direct.function_list())  # the refused FCALL, then the load
        return int(direct.info("stats")["total_error_replies"]) > errors

    main = threading.get_ident()

    def interrupt() -> None:
        wait_until(refused, 20, "the refusal before the second send")
        # The load's answer (or the refusal) takes DELAY back; the second send is then
        # held DELAY on its way there: the signal comes half-way, before the server runs
        # it. (A give-back that only reads the hold after the signal, on another
        # connection, reads it before the script has run: it must be fenced.)
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
        wait_until(lambda: script_calls(direct) > runs, 10, "the second send to run")
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
        interrupted(direct, link, prim.acquire, kind)
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
