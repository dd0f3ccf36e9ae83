"""Every operation is applied at most once, and a lost reply is not the caller's problem.

Each call names the count the owner holds before it (``docs/design/core.md``), so a call
sent again is recognised: applied already (status 2), applied now, or refused. A proxy in
front of a real server lets the first copy of one chosen command through to the server,
drops its reply and closes that connection: rlocks sees a broken link and sends the very
same call again (``steps.call``). Each test checks the holds on the server afterwards:
without the expected count, a re-sent acquire would add a level nobody releases and a
re-sent release would give back one level too many (or find nothing and report the hold
lost).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, Iterator, List, Optional, Set, Tuple

import pytest
import redis

import rlocks
from rlocks._engine import identity
from rlocks._engine.keys import keys_for
from rlocks.server import free_port

from ._servers import LocalCluster, server_version
from .conftest import NAMESPACE, load_scripts, without_counters


class ReplyDropper:
    """A loopback TCP proxy to ``target_port``. Once :meth:`arm`-ed with byte patterns, the
    first client command (one read from the client) containing all of them is passed to
    the server, and its reply is dropped: the connection is closed in both directions."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._patterns: Optional[Tuple[bytes, ...]] = None
        self.dropped = threading.Event()
        self.passed: List[bytes] = []  # every command chunk that matched since arm()
        self._sockets: Set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.1)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, *patterns: bytes) -> None:
        with self._lock:
            self._patterns = patterns
            self.dropped.clear()
            self.passed = []

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                near, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            far = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets.update((near, far))
            state = {"drop": False}
            threading.Thread(target=self._up, args=(near, far, state), daemon=True).start()
            threading.Thread(target=self._down, args=(far, near, state), daemon=True).start()

    def _up(self, near: socket.socket, far: socket.socket, state: dict) -> None:
        try:
            while True:
                chunk = near.recv(65536)
                if not chunk:
                    break
                with self._lock:
                    patterns = self._patterns
                    if patterns is not None and all(p in chunk for p in patterns):
                        self.passed.append(chunk)
                        if not self.dropped.is_set() and not state["drop"]:
                            state["drop"] = True  # set before the server can answer
                far.sendall(chunk)
        except OSError:
            pass
        self._close(near, far)

    def _down(self, far: socket.socket, near: socket.socket, state: dict) -> None:
        try:
            while True:
                chunk = far.recv(65536)
                if not chunk:
                    break
                if state["drop"]:
                    self.dropped.set()
                    break  # the command ran; its reply never reaches the client
                near.sendall(chunk)
        except OSError:
            pass
        self._close(near, far)

    def _close(self, *socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            socks = list(self._sockets)
        self._close(*socks)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture
def proxy(redis_url: str) -> Iterator[ReplyDropper]:
    p = ReplyDropper(_port(redis_url))
    yield p
    p.close()


@pytest.fixture
def via(proxy: ReplyDropper) -> Iterator[Any]:
    """A plain client whose every connection goes through the proxy."""
    c = redis.Redis(port=proxy.port, socket_timeout=5, socket_connect_timeout=5)
    yield c
    c.close()


def _holds(client: Any, prim: Any, owner: str) -> int:
    raw = client.hget(prim._keys.hash, prim._spec.field(owner))
    return 0 if raw is None else int(raw)


def _load(direct: Any, prim: Any) -> None:
    """Load the scripts first: a NOSCRIPT answer would be one more send to count."""
    spec = prim._spec
    load_scripts(direct, spec.acquire_script, spec.release_script, spec.renew_script)


def _check_acquire_release(lock: Any, proxy: ReplyDropper, direct: Any, drop: str) -> None:
    """Acquire, re-enter, release twice; the reply of the ``drop`` step is lost once
    (``acquire``, ``reentry``, ``release``: the inner release, ``last``: the outer one)
    and rlocks sends that step again. The count on the server is right after each, and
    no step raises: its outcome could be known."""
    owner = identity.thread_owner()
    _load(direct, lock)
    spec = lock._spec
    steps = [
        ("acquire", spec.acquire_script, lambda: lock.acquire(timeout=5), 1),
        ("reentry", spec.acquire_script, lambda: lock.acquire(timeout=5), 2),
        ("release", spec.release_script, lock.release, 1),
        ("last", spec.release_script, lock.release, 0),
    ]
    for step, script, call, holds in steps:
        if step == drop:
            proxy.arm(script.sha.encode())
        assert call() in (True, None)
        if step == drop:
            assert proxy.dropped.is_set() and len(proxy.passed) == 2  # sent, re-sent once
        assert _holds(direct, lock, owner) == holds, step
    assert not lock.locked()


STEPS = ["acquire", "reentry", "release", "last"]


@pytest.mark.parametrize("drop", STEPS)
@pytest.mark.parametrize("kind", ["rlock", "write", "read"])
def test_a_resent_acquire_or_release_is_applied_once(
    kind: str, drop: str, name: str, proxy: ReplyDropper, via: Any, client: Any
) -> None:
    if kind == "rlock":
        lock: Any = rlocks.RLock(name, client=via, namespace=NAMESPACE)
    else:
        rw = rlocks.RWLock(name, client=via, namespace=NAMESPACE)
        lock = rw.write_lock if kind == "write" else rw.read_lock
    _check_acquire_release(lock, proxy, client, drop)


def test_a_resent_semaphore_acquire_or_release_is_applied_once(
    name: str, proxy: ReplyDropper, via: Any, client: Any
) -> None:
    sem = rlocks.BoundedSemaphore(name, 3, client=via, namespace=NAMESPACE)
    owner = identity.thread_owner()
    _load(client, sem)
    proxy.arm(sem._spec.acquire_script.sha.encode())
    assert sem.acquire(timeout=5)
    assert proxy.dropped.is_set() and len(proxy.passed) == 2
    assert _holds(client, sem, owner) == 1
    proxy.arm(sem._spec.release_script.sha.encode())
    sem.release()  # re-sent without the expected count: OVER (released too often)
    assert proxy.dropped.is_set() and len(proxy.passed) == 2
    assert _holds(client, sem, owner) == 0
    assert without_counters(client.keys(f"{NAMESPACE}:*{name}*")) == []


def test_a_resent_renewal_renews_once(name: str, proxy: ReplyDropper, via: Any,
                                      client: Any) -> None:
    """extend() re-sent after a lost reply: the hold is renewed, not reported lost."""
    lock = rlocks.RLock(name, client=via, namespace=NAMESPACE, auto_renew=False, ttl=5)
    _load(client, lock)
    assert lock.acquire(timeout=5)
    proxy.arm(lock._spec.renew_script.sha.encode())
    lock.extend(20)
    assert proxy.dropped.is_set() and len(proxy.passed) == 2
    assert client.pttl(lock._keys.hash) > 15000
    lock.release()


@pytest.mark.parametrize("drop", STEPS)
def test_asyncio_a_resent_acquire_or_release_is_applied_once(
    drop: str, name: str, proxy: ReplyDropper, client: Any
) -> None:
    import redis.asyncio as aredis

    import rlocks.asyncio as ra

    async def main() -> None:
        c = aredis.Redis(port=proxy.port, socket_timeout=5, socket_connect_timeout=5)
        try:
            lock = ra.RLock(name, client=c, namespace=NAMESPACE)
            owner = identity.task_owner()
            _load(client, lock)
            spec = lock._spec
            steps = [
                ("acquire", spec.acquire_script, lock.acquire, 1),
                ("reentry", spec.acquire_script, lock.acquire, 2),
                ("release", spec.release_script, lock.release, 1),
                ("last", spec.release_script, lock.release, 0),
            ]
            for step, script, call, holds in steps:
                if step == drop:
                    proxy.arm(script.sha.encode())
                await call()
                if step == drop:
                    assert proxy.dropped.is_set() and len(proxy.passed) == 2
                assert _holds(client, lock, owner) == holds, step
        finally:
            await c.aclose()

    asyncio.run(main())


def test_a_released_name_leaves_no_key(name: str, client: Any) -> None:
    """No record outlives a hold: a released name leaves nothing but the slot's fencing
    counter (shared by every name of the slot)."""
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    for prim in (rlocks.RLock(name, client=client, namespace=NAMESPACE), rw.write_lock,
                 rw.read_lock, rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE)):
        assert prim.acquire(timeout=5)
        prim.release()
    assert without_counters(client.keys(f"{NAMESPACE}:*{name}*")) == []


cluster_only = pytest.mark.skipif(
    server_version() < (7, 0), reason="the local cluster needs redis-server 7.0 or newer")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as c:
        yield c


def _cluster_via(cluster: LocalCluster, key: str) -> Tuple[Any, Any, ReplyDropper]:
    """(cluster client whose link to ``key``'s node goes through a proxy, plain cluster
    client, the proxy)."""
    plain = cluster.client()
    node = plain.get_node_from_key(key)
    proxy = ReplyDropper(node.port)

    def remap(address: Tuple[str, int]) -> Tuple[str, int]:
        return (address[0], proxy.port) if address[1] == node.port else address

    return cluster.client(address_remap=remap), plain, proxy


@cluster_only
@pytest.mark.parametrize(
    "kind, drop", [(k, d) for k in ("rlock", "write") for d in STEPS] + [("semaphore", "")]
)
def test_on_the_cluster_a_resent_operation_is_applied_once(
    kind: str, drop: str, name: str, cluster: LocalCluster
) -> None:
    hash_key = keys_for(NAMESPACE, "rlock", name).hash  # same slot, any kind
    via, plain, proxy = _cluster_via(cluster, hash_key)
    try:
        if kind == "rlock":
            _check_acquire_release(
                rlocks.RLock(name, client=via, namespace=NAMESPACE), proxy, plain, drop)
        elif kind == "write":
            _check_acquire_release(
                rlocks.RWLock(name, client=via, namespace=NAMESPACE).write_lock, proxy, plain,
                drop)
        else:
            sem = rlocks.BoundedSemaphore(name, 2, client=via, namespace=NAMESPACE)
            owner = identity.thread_owner()
            _load(plain, sem)
            proxy.arm(sem._spec.acquire_script.sha.encode())
            assert sem.acquire(timeout=5)
            assert proxy.dropped.is_set() and len(proxy.passed) == 2
            assert _holds(plain, sem, owner) == 1
            proxy.arm(sem._spec.release_script.sha.encode())
            sem.release()
            assert proxy.dropped.is_set() and len(proxy.passed) == 2
            assert _holds(plain, sem, owner) == 0
    finally:
        via.close()
        plain.close()
        proxy.close()
