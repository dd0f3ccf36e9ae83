"""Every operation is applied at most once (issue 13, part 3; lua/op_lib.lua).

A proxy in front of a real server lets the first copy of one chosen command through to
the server, drops its reply and closes that connection: the client's own retry (redis-py's
``Retry`` on a plain client, the cluster client's retry) then sends the very same command
again. Each test checks the holds on the server afterwards: without op ids the re-sent
acquire adds a level nobody releases, the re-sent release gives back one level too many
(or finds nothing and reports the hold lost), the re-sent renewal finds its hand-over
grant adopted already and reports it revoked.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import rlocks
from rlocks._engine import identity
from rlocks._engine import keys as keys_module
from rlocks._engine.queued import GRANT_STREAM
from rlocks._engine.scripts import Call, run
from rlocks.server import free_port

from ._servers import LocalCluster, server_version, wait_until
from ._threads import hub_waiters
from .conftest import NAMESPACE, load_scripts, sent_as


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
def retrying(proxy: ReplyDropper) -> Iterator[Any]:
    """A plain client with redis-py's Retry, as a user would configure it. One connection
    (``single_connection_client``): rlocks then sends through this client as given, so
    redis-py's retry is what re-sends a command whose reply was lost."""
    c = redis.Redis(
        port=proxy.port, socket_timeout=5, socket_connect_timeout=5,
        single_connection_client=True, retry=Retry(NoBackoff(), 3),
    )
    yield c
    c.close()


def _holds(client: Any, lock: Any, owner: str) -> int:
    raw = client.hget(lock._keys.hash, lock._hold_field(owner))
    return 0 if raw is None else int(raw)


def _load(direct: Any, prim: Any) -> None:
    """Load the scripts first: a NOSCRIPT (or "function not found") answer would be one
    more send to count."""
    load_scripts(direct, prim._acquire_script, prim._release_script, prim._renew_script)


def _check_acquire_release(lock: Any, proxy: ReplyDropper, direct: Any, drop: str) -> None:
    """Acquire, re-enter, release twice; the reply of the ``drop`` step is lost once
    (``acquire``, ``reentry``, ``release``: the inner release, ``last``: the outer one)
    and redis-py sends that step again. The count on the server is right after each."""
    owner = identity.thread_owner()
    _load(direct, lock)
    steps = [
        ("acquire", lock._acquire_script, lambda: lock.acquire(timeout=5), 1),
        ("reentry", lock._acquire_script, lambda: lock.acquire(timeout=5), 2),
        ("release", lock._release_script, lock.release, 1),
        ("last", lock._release_script, lock.release, 0),
    ]
    for step, script, call, holds in steps:
        if step == drop:
            proxy.arm(sent_as(lock, script))
        assert call() in (True, None)
        if step == drop:
            assert proxy.dropped.is_set() and len(proxy.passed) == 2  # sent, re-sent once
        assert _holds(direct, lock, owner) == holds, step
    assert not lock.locked()


def _check_renewal_adopts_once(lock: Any, proxy: ReplyDropper, retrying: Any, direct: Any) -> None:
    """A renewal that adopts a hand-over grant, re-sent: the grant counts as adopted."""
    holder, waiter = "holder-1", "waiter-1"
    _load(direct, lock)
    # The scripts by hand (the engine's own KEYS and ARGV builders): holder takes the lock,
    # waiter queues, holder's release hands it to the waiter (an unadopted grant).
    acquire = lock._acquire_arguments
    keys, args = acquire(holder, 1, False, "entry-1")
    assert Call(lock._acquire_script, keys, args)(direct).granted
    keys, args = acquire(waiter, 1, False, "entry-2")
    assert Call(lock._acquire_script, keys, args)(direct).queued
    keys, args = lock._release_arguments(holder, 1)
    assert Call(lock._release_script, keys, args)(direct).wakes  # granted to the waiter

    renew = lock._items_call((*lock._renew_items(waiter), "a", waiter))
    proxy.arm(sent_as(lock, lock._renew_script), waiter.encode())
    reply = renew(retrying)
    assert proxy.dropped.is_set() and len(proxy.passed) == 2
    assert reply.items == (1, 1)  # renewed, and the grant adopted (not "revoked")
    assert _holds(direct, lock, waiter) == 1
    keys, args = lock._release_arguments(waiter, 1)
    assert Call(lock._release_script, keys, args)(direct).status == 1


STEPS = ["acquire", "reentry", "release", "last"]


@pytest.mark.parametrize("drop", STEPS)
@pytest.mark.parametrize("kind", ["rlock", "write", "read"])
def test_a_resent_acquire_or_release_is_applied_once(
    kind: str, drop: str, name: str, proxy: ReplyDropper, retrying: Any, client: Any
) -> None:
    if kind == "rlock":
        lock: Any = rlocks.RLock(name, client=retrying, namespace=NAMESPACE)
    else:
        rw = rlocks.RWLock(name, client=retrying, namespace=NAMESPACE)
        lock = rw.write_lock if kind == "write" else rw.read_lock
    _check_acquire_release(lock, proxy, client, drop)


def test_a_resent_semaphore_acquire_or_release_is_applied_once(
    name: str, proxy: ReplyDropper, retrying: Any, client: Any
) -> None:
    sem = rlocks.BoundedSemaphore(name, 3, client=retrying, namespace=NAMESPACE)
    owner = identity.thread_owner()
    _load(client, sem)
    proxy.arm(sent_as(sem, sem._acquire_script))
    assert sem.acquire(timeout=5)
    assert proxy.dropped.is_set() and len(proxy.passed) == 2
    assert _holds(client, sem, owner) == 1
    proxy.arm(sent_as(sem, sem._release_script))
    sem.release()  # re-sent without op ids: OVER (a BoundedSemaphore released too often)
    assert proxy.dropped.is_set() and len(proxy.passed) == 2
    assert _holds(client, sem, owner) == 0
    assert int(client.hget(sem._keys.hash, "#free") or 3) == 3


def test_a_resent_renewal_adopts_its_grant_once(
    name: str, proxy: ReplyDropper, retrying: Any, client: Any
) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    _check_renewal_adopts_once(lock, proxy, retrying, client)


@pytest.mark.parametrize("drop", STEPS)
def test_asyncio_a_resent_acquire_or_release_is_applied_once(
    drop: str, name: str, proxy: ReplyDropper, client: Any
) -> None:
    """The asyncio twins: each script call runs in a task of its own (shielded), yet it
    counts as its owner's operation (one stream), and redis.asyncio's Retry re-sends."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry as AsyncRetry

    import rlocks.asyncio as ra

    async def main() -> None:
        c = aredis.Redis(
            port=proxy.port, socket_timeout=5, socket_connect_timeout=5,
            single_connection_client=True, retry=AsyncRetry(NoBackoff(), 3),
        )
        try:
            # Connected first: redis.asyncio 8.1 does not retry the very first command of
            # a single-connection client (its connection is made inside that attempt).
            await c.ping()
            lock = ra.RLock(name, client=c, namespace=NAMESPACE)
            owner = identity.task_owner()
            _load(client, lock)
            steps = [
                ("acquire", lock._acquire_script, lock.acquire, 1),
                ("reentry", lock._acquire_script, lock.acquire, 2),
                ("release", lock._release_script, lock.release, 1),
                ("last", lock._release_script, lock.release, 0),
            ]
            for step, script, call, holds in steps:
                if step == drop:
                    proxy.arm(sent_as(lock, script))
                await call()
                if step == drop:
                    assert proxy.dropped.is_set() and len(proxy.passed) == 2
                assert _holds(client, lock, owner) == holds, step
            # The owner's records, though its calls ran in tasks of their own: its
            # releases' stream and its acquires' (queued.GRANT_STREAM, see _settle).
            assert sorted(client.hkeys(lock._keys.queued()[7])) == [
                owner.encode(), (owner + GRANT_STREAM).encode()]
        finally:
            await c.aclose()

    asyncio.run(main())


def test_op_records_are_bounded_and_expire(name: str, client: Any) -> None:
    """One record per stream (a thread's two here: its acquires' and its releases', see
    queued.GRANT_STREAM), and the record keys carry an expiry (at most twice the 60 s a
    record lives: see lua/op_lib.lua)."""
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    for _ in range(20):
        with lock:
            pass
    ops, ends = lock._keys.queued()[7:9]
    assert client.hlen(ops) == 2 and client.zcard(ends) == 2
    assert 0 < client.pttl(ops) <= 120_000 and 0 < client.pttl(ends) <= 120_000


def test_ended_op_records_are_swept_by_new_streams(name: str, client: Any) -> None:
    """Records are only added by a new stream, which first removes up to 8 ended ones:
    their number never exceeds the most alive at one time. (Server time is driven by
    ARGV[1], as in test_handover_scripts.)"""
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    ops = lock._keys.queued()[7]
    seq = iter(range(1, 1000))

    def op(stream: str, now: int) -> None:
        """Acquire and release by ``stream`` at server time ``now``: two recorded ops."""
        for script, (keys, args) in (
            (lock._acquire_script, lock._acquire_arguments(stream, 1, False, None)),
            (lock._release_script, lock._release_arguments(stream, 1)),
        ):
            args = (str(now), *args[1:])  # ARGV[1]: '' = server TIME; here a given time
            args = tuple(f"#{next(seq)}:{stream}" if a == "#" else a for a in args)
            assert run(client, script, keys, args).status == 1

    now = 1_000_000
    for i in range(20):
        op(f"old-{i}", now)
    assert client.hlen(ops) == 20
    later = now + 90_001  # every old record has ended (1.5 x 60 s after its refresh)
    sizes = []
    for i in range(3):
        op(f"new-{i}", later)
        sizes.append(client.hlen(ops))
    assert sizes == [13, 6, 3]
    op("new-0", later + 1)  # a stream that has a record adds none, removes none
    assert client.hlen(ops) == 3


def test_a_record_outlives_its_operation_by_a_minute_between_refreshes(
    name: str, client: Any
) -> None:
    """A stream sets its record's end only every 30 s (half the record's life), 90 s
    ahead: an operation between two settings is still answered from the record 60 s
    later, and a new stream sweeps it once the end set with the record has passed."""
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    keys = lock._keys.queued()
    ops, ends = keys[7], keys[8]

    def release(stream: str, seq: int, now: int) -> int:
        """Acquire (unrecorded id) and the release ``#seq:stream`` at server time ``now``;
        the release's status (1 released, -1 nothing held)."""
        k, args = lock._acquire_arguments(stream, 1, False, None)
        args = (str(now), *args[1:])
        run(client, lock._acquire_script, k, args)
        k, args = lock._release_arguments(stream, 1)
        args = tuple(f"#{seq}:{stream}" if a == "#" else a for a in (str(now), *args[1:]))
        return run(client, lock._release_script, k, args).status

    t0 = 1_000_000
    assert release("s", 1, t0) == 1
    assert client.zscore(ends, "s") == t0 + 90_000
    assert release("s", 2, t0 + 29_999) == 1  # within 30 s: the end stays
    assert client.zscore(ends, "s") == t0 + 90_000
    # The re-send of op 2, 60 s after it ran: answered from the record (released, 1),
    # where a fresh run would find nothing held (-1).
    k, args = lock._release_arguments("s", 1)
    resend = tuple("#2:s" if a == "#" else a for a in (str(t0 + 89_999), *args[1:]))
    assert run(client, lock._release_script, k, resend).status == 1
    assert release("s", 3, t0 + 30_000) == 1  # 30 s after the setting: set again
    assert client.zscore(ends, "s") == t0 + 120_000
    assert client.hget(ops, "s") is not None
    assert release("new", 1, t0 + 120_001) == 1  # a new stream sweeps the ended record
    assert client.hget(ops, "s") is None


def test_a_malformed_op_id_is_refused_and_changes_nothing(name: str, client: Any) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    keys, args = lock._acquire_arguments("o", 1, False, None)
    args = tuple("#x:y" if a == "#" else a for a in args)
    with pytest.raises(redis.ResponseError, match="RLOCKS_BAD_ARG op"):
        run(client, lock._acquire_script, keys, args)
    assert client.exists(*keys[:5], *keys[7:]) == 0


# -- the local cluster: the cluster client's own retry re-sends --------------------------

cluster_only = pytest.mark.skipif(
    server_version() < (7, 0),
    reason="the local cluster needs redis-server 7.0 or newer (its cluster-port "
    f"directive); found {server_version() or 'none'}",
)


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
    hash_key = keys_module.keys_for(NAMESPACE, "rlock", name).hash  # same slot, any kind
    via, plain, proxy = _cluster_via(cluster, hash_key)
    try:
        if kind == "rlock":
            _check_acquire_release(
                rlocks.RLock(name, client=via, namespace=NAMESPACE), proxy, plain, drop
            )
        elif kind == "write":
            _check_acquire_release(
                rlocks.RWLock(name, client=via, namespace=NAMESPACE).write_lock, proxy, plain,
                drop,
            )
        else:
            sem = rlocks.BoundedSemaphore(name, 2, client=via, namespace=NAMESPACE)
            owner = identity.thread_owner()
            _load(plain, sem)
            proxy.arm(sent_as(sem, sem._acquire_script))
            assert sem.acquire(timeout=5)
            assert proxy.dropped.is_set() and len(proxy.passed) == 2
            assert _holds(plain, sem, owner) == 1
            proxy.arm(sent_as(sem, sem._release_script))
            sem.release()
            assert proxy.dropped.is_set() and len(proxy.passed) == 2
            assert _holds(plain, sem, owner) == 0
    finally:
        via.close()
        plain.close()
        proxy.close()


@cluster_only
def test_on_the_cluster_a_resent_renewal_adopts_its_grant_once(
    name: str, cluster: LocalCluster
) -> None:
    hash_key = keys_module.keys_for(NAMESPACE, "rlock", name).hash
    via, plain, proxy = _cluster_via(cluster, hash_key)
    try:
        lock = rlocks.RLock(name, client=plain, namespace=NAMESPACE)
        _check_renewal_adopts_once(lock, proxy, via, plain)
    finally:
        via.close()
        plain.close()
        proxy.close()


# -- a release whose reply was lost, then settled by the next acquire (hunt5 #2, #4) -----------


def test_a_release_that_ran_but_lost_its_reply_is_not_settled_again(
    proxy: ReplyDropper, client: Any, name: str
) -> None:
    """A thread holds a lock through X (one client) and Y (another client, so another
    pool whose books X's level is not in). Y's release runs on the server but its reply is
    lost: Y's next acquire must find that release in the op record and give nothing
    back: before, it took X's level for the failed release's and gave it back, and once
    Y released, Redis had nothing while X still held."""
    far = redis.Redis(port=proxy.port, socket_timeout=5)
    x = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    y = rlocks.RLock(name, client=far, namespace=NAMESPACE)
    _load(client, x)
    owner = identity.thread_owner()
    assert x.acquire() and y.acquire()
    proxy.arm(sent_as(y, y._release_script))
    with pytest.raises(redis.ConnectionError):
        y.release()
    assert proxy.dropped.is_set() and _holds(client, x, owner) == 1  # it ran: X's is left
    assert y.acquire()
    assert _holds(client, x, owner) == 2
    y.release()
    assert _holds(client, x, owner) == 1 and x.owned()
    x.release()
    assert _holds(client, x, owner) == 0
    far.close()


def test_another_threads_failed_release_of_a_permit_is_settled_by_its_owner(
    redis_url: str, client: Any, name: str
) -> None:
    """threading lets any thread release another's permit. When that release fails on a
    broken link before its script ran, the permit is off its owner's books but still in
    Redis: the owner's next acquire gives it back first (before, it stacked on it, and the
    permit stayed in use, renewed with the owner's others)."""
    from ._proxy import FaultyLink

    with FaultyLink(_port(redis_url)) as link:
        far = redis.Redis(port=link.port, socket_timeout=2, socket_connect_timeout=2)
        sem = rlocks.Semaphore(name, 2, client=far, namespace=NAMESPACE)
        _load(client, sem)
        owner: List[str] = []
        step = threading.Event()
        done = threading.Event()

        def holder() -> None:
            owner.append(identity.thread_owner())
            assert sem.acquire()
            step.set()
            assert done.wait(20)
            assert sem.acquire()  # settles the permit the failed release left, first
            owner.append(str(_holds(client, sem, owner[0])))
            sem.release()

        thread = threading.Thread(target=holder)
        thread.start()
        assert step.wait(20)
        link.cut(refuse=True)
        with pytest.raises(redis.ConnectionError):
            sem.release()  # the holder's permit, from this thread
        link.heal()
        assert _holds(client, sem, owner[0]) == 1
        done.set()
        thread.join(20)
        assert not thread.is_alive() and owner[1] == "1"
        assert _holds(client, sem, owner[0]) == 0
        far.close()


def test_an_acquire_that_ran_but_lost_its_reply_is_given_back_by_the_next_acquire(
    proxy: ReplyDropper, client: Any, name: str
) -> None:
    """An acquire's script grants, but its reply is lost (no redis-py retry): acquire
    raises ConnectionError and the books hold nothing. The owner's next acquire must find
    the grant in the op record and give it back first: before, it was re-entered on the
    server, the release left that level in Redis, and the lock stayed held by nobody
    who knew it until its 30 s lease ended."""
    far = redis.Redis(port=proxy.port, socket_timeout=5)
    lock = rlocks.RLock(name, client=far, namespace=NAMESPACE)
    _load(client, lock)
    owner = identity.thread_owner()
    proxy.arm(sent_as(lock, lock._acquire_script))
    with pytest.raises(redis.ConnectionError):
        lock.acquire()
    assert proxy.dropped.is_set() and _holds(client, lock, owner) == 1  # it ran
    assert not lock.owned()
    assert lock.acquire()
    assert _holds(client, lock, owner) == 1
    lock.release()
    assert _holds(client, lock, owner) == 0 and not client.exists(lock._keys.hash)
    far.close()


@pytest.mark.timeout(60)
def test_a_semaphore_hand_over_whose_re_check_lost_its_reply_leaks_no_permit(
    proxy: ReplyDropper, client: Any, name: str
) -> None:
    """A thread that holds one of two permits waits for a second; another thread's release
    hands it over, and the waiter's re-check (which adopts the grant on the server) loses
    its reply. The next acquire must give that permit back before it asks: before, it
    stayed with the owner, renewed with its other permit, and the pool had one permit
    too few (here: the next acquire waited for a permit that nobody else held)."""
    far = redis.Redis(port=proxy.port, socket_timeout=5)
    sem = rlocks.Semaphore(name, 2, client=far, namespace=NAMESPACE)
    other = rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE)
    _load(client, sem)
    owner = identity.thread_owner()
    queue_key = sem._keys.queued()[2]
    held, errors = threading.Event(), []

    def releaser() -> None:
        try:
            assert other.acquire()
            held.set()
            deadline = threading.Event()
            while not client.zcard(queue_key):
                deadline.wait(0.01)
            proxy.arm(sent_as(sem, sem._acquire_script), owner.encode())
            other.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    assert sem.acquire()
    thread = threading.Thread(target=releaser)
    thread.start()
    assert held.wait(20)
    with pytest.raises(redis.ConnectionError):
        sem.acquire(timeout=20)  # queued, handed the permit, its re-check's reply lost
    thread.join(20)
    assert not errors, errors
    assert proxy.dropped.is_set() and _holds(client, sem, owner) == 2  # adopted: it ran
    assert sem.acquire(timeout=5)
    assert _holds(client, sem, owner) == 2
    sem.release(2)
    assert _holds(client, sem, owner) == 0
    far.close()


def test_asyncio_an_acquire_that_ran_but_lost_its_reply_is_given_back_by_the_next(
    proxy: ReplyDropper, client: Any, name: str
) -> None:
    """The asyncio twin of the test above: the same dialogue, its calls awaited in tasks
    of their own, which must send the op id the clean-up records."""
    import redis.asyncio as aredis

    import rlocks.asyncio as ra

    async def main() -> None:
        c = aredis.Redis(port=proxy.port, socket_timeout=5, socket_connect_timeout=5)
        try:
            lock = ra.RLock(name, client=c, namespace=NAMESPACE)
            owner = identity.task_owner()
            _load(client, lock)
            proxy.arm(sent_as(lock, lock._acquire_script))
            with pytest.raises(redis.ConnectionError):
                await lock.acquire()
            assert proxy.dropped.is_set() and _holds(client, lock, owner) == 1  # it ran
            assert await lock.acquire()
            assert _holds(client, lock, owner) == 1
            await lock.release()
            assert _holds(client, lock, owner) == 0
        finally:
            await c.aclose()

    asyncio.run(main())


def test_a_lost_re_entry_is_settled_by_the_next_acquire_after_a_release(
    proxy: ReplyDropper, client: Any, name: str
) -> None:
    """A re-entry's reply is lost (Redis 2, books 1), then the thread releases (Redis 1,
    books 0): its next acquire must still find the re-entry in the op record. Before, the
    release's own record replaced it (one record per stream), the settle took the
    re-entry for one that never ran, and every acquire/release left a level behind."""
    far = redis.Redis(port=proxy.port, socket_timeout=5)
    lock = rlocks.RLock(name, client=far, namespace=NAMESPACE)
    _load(client, lock)
    owner = identity.thread_owner()
    assert lock.acquire()
    proxy.arm(sent_as(lock, lock._acquire_script))
    with pytest.raises(redis.ConnectionError):
        lock.acquire()
    assert proxy.dropped.is_set() and _holds(client, lock, owner) == 2
    lock.release()
    # Until the next acquire (or the lease), Redis keeps the level the books lack.
    assert _holds(client, lock, owner) == 1 and not lock.owned()
    assert lock.acquire()
    assert _holds(client, lock, owner) == 1
    lock.release()
    assert _holds(client, lock, owner) == 0
    far.close()


@pytest.mark.timeout(60)
def test_a_queued_semaphore_attempt_that_granted_but_lost_its_reply_is_settled(
    proxy: ReplyDropper, client: Any, name: str
) -> None:
    """A waiter queued behind another thread of its process becomes head and its own
    attempt is granted, but the reply is lost. A semaphore cannot ask whether it got in
    (no lost-reply check), so the error goes to the caller; the call must still be
    recorded for the next acquire to settle (before, the wait loop had forgotten the call
    before it re-raised, and the permit stayed with the owner until its lease ended)."""
    far = redis.Redis(port=proxy.port, socket_timeout=5)
    sem = rlocks.Semaphore(name, 2, client=far, namespace=NAMESPACE)
    holder = rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE)
    _load(client, sem)
    assert holder.acquire() and holder.acquire()
    first_in, release_first = threading.Event(), threading.Event()
    out: Dict[str, Any] = {}

    def first() -> None:
        # queued first, so that the second thread waits behind it in this process
        out["first"] = sem.acquire(timeout=20)
        first_in.set()
        release_first.wait(20)
        sem.release()

    def second() -> None:
        out["owner"] = identity.thread_owner()
        try:
            sem.acquire(timeout=20)
            out["second"] = "returned"
        except redis.ConnectionError:
            out["second"] = "ConnectionError"
        out["after"] = _holds(client, sem, out["owner"])
        out["again"] = sem.acquire(timeout=5)
        out["settled"] = _holds(client, sem, out["owner"])
        sem.release()
        out["end"] = _holds(client, sem, out["owner"])

    a = threading.Thread(target=first)
    a.start()
    wait_until(lambda: client.zcard(sem._keys.queued()[2]) == 1, 10, "the first to queue")
    b = threading.Thread(target=second)
    b.start()
    wait_until(lambda: "owner" in out, 10, "the second thread")
    wait_until(lambda: len(hub_waiters(sem)) == 2, 10, "both threads to wait")
    proxy.arm(sent_as(sem, sem._acquire_script), out["owner"].encode())
    holder.release(2)  # the first thread is granted; the second becomes head and asks
    assert first_in.wait(20)
    b.join(30)
    release_first.set()
    a.join(20)
    assert proxy.dropped.is_set()
    assert out["second"] == "ConnectionError" and out["after"] == 1  # it ran: granted
    assert out["again"] is True and out["settled"] == 1 and out["end"] == 0
    far.close()
