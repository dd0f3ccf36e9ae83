"""Spawnable workers for the cluster, fault and load tests, generic over primitives and
over how the client is built (standalone URL, Redis Cluster, TLS, ACL user).

Like ``_workers.py`` they import only rlocks, redis and the stdlib, report through Redis
lists and exit codes, and are picklable under "spawn".

A *client spec* is a dict: ``{"url": ...}`` for ``redis.Redis.from_url``, or
``{"cluster": [(host, port), ...]}`` for ``redis.cluster.RedisCluster``; any other entries
are passed on as client options.

A *kind* names a primitive used as a mutex: ``rlock`` (re-entered once inside),
``write`` (an RWLock's write side, re-entered once), ``read`` (its read side, re-entered
once; exclusive only against writers), ``sem`` (Semaphore(1)), ``bsem``
(BoundedSemaphore(1)).
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

import rlocks

EXIT_OK = 0
EXIT_FAILED = 3

KINDS = ("rlock", "write", "sem", "bsem")


def make_client(spec: Dict[str, Any]) -> Any:
    options = {k: v for k, v in spec.items() if k not in ("url", "cluster")}
    options.setdefault("socket_timeout", 10)
    options.setdefault("socket_connect_timeout", 5)
    if "cluster" in spec:
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(h, p) for h, p in spec["cluster"]]
        return RedisCluster(startup_nodes=nodes, **options)
    return redis.Redis.from_url(spec["url"], **options)


def make_mutex(
    kind: str, name: str, client: Any, namespace: str, ttl: float, **extra: Any
) -> Tuple[Any, Callable[..., bool], Callable[[], None], int]:
    """(primitive, acquire, release, nesting): ``acquire(timeout=...)`` ``nesting`` times
    enters the critical section; ``release()`` as many times leaves it."""
    common = dict(client=client, ttl=ttl, namespace=namespace, **extra)
    if kind == "rlock":
        lock = rlocks.RLock(name, **common)
        return lock, lock.acquire, lock.release, 2
    if kind == "read":
        rw = rlocks.RWLock(name, **common)
        return rw.read_lock, rw.read_lock.acquire, rw.read_lock.release, 2
    if kind == "write":
        rw = rlocks.RWLock(name, **common)
        return rw.write_lock, rw.write_lock.acquire, rw.write_lock.release, 2
    if kind in ("sem", "bsem"):
        cls = rlocks.BoundedSemaphore if kind == "bsem" else rlocks.Semaphore
        sem = cls(name, 1, **common)
        return sem, sem.acquire, sem.release, 1
    raise ValueError(kind)


def report_error(client: Any, key: str) -> None:
    text = f"pid {os.getpid()} {threading.current_thread().name}:\n{traceback.format_exc()}"
    try:
        client.rpush(key, text)
    except Exception:  # noqa: BLE001 - the exit code still says it failed
        pass


def pool_connections(client: Any) -> int:
    """Connections the client has open (created and not disconnected), all nodes summed."""
    pools: List[Any] = []
    if hasattr(client, "get_nodes"):
        pools = [n.redis_connection.connection_pool for n in client.get_nodes() if n.redis_connection]
    else:
        pools = [client.connection_pool]
    total = 0
    for pool in pools:
        with pool._lock:
            conns = list(pool._available_connections) + list(pool._in_use_connections)
        total += sum(1 for c in conns if getattr(c, "_sock", None) is not None)
    return total


def pool_in_use(client: Any) -> int:
    """Connections of a standalone client's pool that are checked out right now (-1 for a
    cluster client)."""
    if hasattr(client, "get_nodes"):
        return -1
    pool = client.connection_pool
    with pool._lock:
        return len(pool._in_use_connections)


def counter_worker(
    spec: Dict[str, Any],
    kinds: List[str],
    names: List[str],
    namespace: str,
    data: str,
    iterations: int,
    threads: int,
    seconds: float,
    start: Any,
) -> None:
    """``threads`` threads each run up to ``iterations`` critical sections (or stop after
    ``seconds``), each on one of the mutexes ``(kinds[i], names[i])`` in turn.

    Inside, a non-atomic read-modify-write of ``{data}:counter:{i}`` (GET, SET) and a
    gauge ``{data}:gauge:{i}`` (INCR on entry, DECR on exit) whose reading must be 1.
    Reports to lists ``{data}:errors`` (tracebacks), ``{data}:done`` (sections done per
    thread), ``{data}:overlaps`` (gauge readings above 1) and a hash ``{data}:resources``
    (pid -> "threads_mid,threads_end,conns_mid,conns_end,in_use_end": threads alive and
    pool connections open once every thread is warm and after they joined, and pool
    connections still checked out after they joined).
    """
    client = make_client(spec)
    mutexes = [
        make_mutex(kind, name, client, namespace, ttl=10.0)
        for kind, name in zip(kinds, names)
    ]
    failures: List[BaseException] = []
    mid: Dict[str, int] = {}
    warmed = [0]
    warmed_mutex = threading.Lock()

    def work(index: int) -> None:
        done = 0
        try:
            deadline = time.monotonic() + seconds
            for n in range(iterations):
                if time.monotonic() > deadline:
                    break
                which = (index + n) % len(mutexes)
                _prim, acquire, release, nesting = mutexes[which]
                for _ in range(nesting):
                    assert acquire(timeout=60), "could not acquire within 60 s"
                try:
                    inside = client.incr(f"{data}:gauge:{which}")
                    if inside != 1:
                        client.rpush(f"{data}:overlaps", inside)
                    value = int(client.get(f"{data}:counter:{which}") or 0)
                    client.set(f"{data}:counter:{which}", value + 1)
                    client.decr(f"{data}:gauge:{which}")
                finally:
                    for _ in range(nesting):
                        release()
                done += 1
                if done == 20:
                    # Once every thread is warm (hub, renewer, pool all in use), the last
                    # one notes the resources; the end of the run must show no more.
                    with warmed_mutex:
                        warmed[0] += 1
                        last = warmed[0] == threads
                    if last:
                        mid["threads"] = threading.active_count()
                        mid["conns"] = pool_connections(client)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            failures.append(exc)
            report_error(client, f"{data}:errors")
        finally:
            client.rpush(f"{data}:done", done)

    try:
        start.wait(60)
        workers = [threading.Thread(target=work, args=(i,), name=f"w{i}") for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        client.hset(
            f"{data}:resources",
            str(os.getpid()),
            f"{mid.get('threads', -1)},{threading.active_count()},"
            f"{mid.get('conns', -1)},{pool_connections(client)},{pool_in_use(client)}",
        )
    except BaseException:  # noqa: BLE001
        report_error(client, f"{data}:errors")
        os._exit(EXIT_FAILED)
    os._exit(EXIT_FAILED if failures else EXIT_OK)


def holder_worker(
    spec: Dict[str, Any],
    kind: str,
    name: str,
    namespace: str,
    ttl: float,
    errors_key: str,
    held: Any,
    release: Any,
) -> None:
    """Enter the critical section of mutex ``(kind, name)``, set ``held``, stay until
    ``release`` is set (or the process is killed or stopped), then leave it.

    Exits 0 when leaving succeeded; 4 when it raised LockLostError and ``on_lost`` had been
    called before (the expected outcome after a stall longer than the lease); 3 otherwise.
    """
    client = make_client(spec)
    lost = threading.Event()
    try:
        _prim, acquire, release_, nesting = make_mutex(
            kind, name, client, namespace, ttl, on_lost=lambda _p: lost.set()
        )
        for _ in range(nesting):
            assert acquire(timeout=20), "holder could not acquire"
        held.set()
        assert release.wait(60), "the test never asked the holder to release"
        try:
            for _ in range(nesting):
                release_()
        except rlocks.LockLostError:
            # on_lost runs on the renewer thread; give it the time a renewal takes.
            os._exit(4 if lost.wait(10) else EXIT_FAILED)
    except BaseException:  # noqa: BLE001
        report_error(client, errors_key)
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def queue_worker(
    spec: Dict[str, Any],
    kind: str,
    name: str,
    namespace: str,
    data: str,
    timeout: float,
    hold: float,
    fair: bool = True,
) -> None:
    """One blocking acquire of the mutex ``(kind, name)`` (``timeout`` s): on success
    ``rpush {data}:got <pid>``, hold ``hold`` s, release; on a time-out ``rpush
    {data}:timed-out <pid>``. Errors go to ``{data}:errors`` and the exit code."""
    client = make_client(spec)
    try:
        _prim, acquire, release, _nesting = make_mutex(
            kind, name, client, namespace, ttl=30.0, fair=fair
        )
        if acquire(timeout=timeout):
            client.rpush(f"{data}:got", os.getpid())
            time.sleep(hold)
            release()
        else:
            client.rpush(f"{data}:timed-out", os.getpid())
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        report_error(client, f"{data}:errors")
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def alternating_worker(
    spec: Dict[str, Any], kind: str, name: str, namespace: str, data: str, rounds: int
) -> None:
    """``rounds`` times: acquire (timing the wait), hold 5 ms, release, pause 2 ms; the
    longest wait (s) goes to ``rpush {data}:longest``."""
    client = make_client(spec)
    try:
        _prim, acquire, release, nesting = make_mutex(kind, name, client, namespace, ttl=30.0)
        longest = 0.0
        for _ in range(rounds):
            began = time.monotonic()
            for _ in range(nesting):
                assert acquire(timeout=30)
            longest = max(longest, time.monotonic() - began)
            time.sleep(0.005)
            for _ in range(nesting):
                release()
            time.sleep(0.002)
        client.rpush(f"{data}:longest", longest)
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        report_error(client, f"{data}:errors")
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def pingpong_worker(
    spec: Dict[str, Any],
    kind: str,
    name: str,
    namespace: str,
    data: str,
    seconds: float,
    entry_lease: Optional[float] = None,
) -> None:
    """Two threads, for ``seconds``: acquire the mutex ``(kind, name)``, hold 5 ms,
    release, pause 2 ms; each acquire ``rpush {data}:waits "<when it returned> <its
    wait>"`` (monotonic s: system-wide on Linux, so comparable across processes).
    ``entry_lease`` (None: the default) is passed on to the primitive."""
    client = make_client(spec)
    extra: Dict[str, Any] = (
        {"deadlock_timeout": None} if kind in ("rlock", "write", "read") else {}
    )
    if entry_lease is not None:
        extra["entry_lease"] = entry_lease
    failed: List[BaseException] = []
    try:
        _prim, acquire, release, _nesting = make_mutex(
            kind, name, client, namespace, ttl=30.0, **extra
        )

        def loop() -> None:
            try:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    began = time.monotonic()
                    assert acquire(timeout=30)
                    got = time.monotonic()
                    client.rpush(f"{data}:waits", f"{got} {got - began}")
                    time.sleep(0.005)
                    release()
                    time.sleep(0.002)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                failed.append(exc)

        threads = [threading.Thread(target=loop) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise failed[0]
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        report_error(client, f"{data}:errors")
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def all_of_worker(
    spec: Dict[str, Any], names: List[str], namespace: str, data: str, seconds: float
) -> None:
    """For ``seconds``: take a Lock, an RLock (no deadlock detection: the order is what
    must keep it out of a circle), a write side and a Semaphore(1), named in the order of
    ``names``, with ``rlocks.acquire_all`` (waiting for ever); inside, check that nobody
    else is inside (``{data}:inside``); ``rpush {data}:rounds <monotonic s>`` per round."""
    client = make_client(spec)
    try:
        made = {
            "lock": lambda n: rlocks.Lock(n, client=client, namespace=namespace),
            "rlock": lambda n: rlocks.RLock(n, client=client, namespace=namespace,
                                            deadlock_timeout=None),
            "write": lambda n: rlocks.RWLock(n, client=client, namespace=namespace,
                                             deadlock_timeout=None).write_lock,
            "sem": lambda n: rlocks.Semaphore(n, 1, client=client, namespace=namespace),
        }
        prims = [made[n.split("-", 1)[0]](n) for n in names]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with rlocks.acquire_all(*prims):
                if client.incr(f"{data}:inside") != 1:
                    raise AssertionError("two processes inside at once")
                time.sleep(0.002)
                client.decr(f"{data}:inside")
            client.rpush(f"{data}:rounds", time.monotonic())
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        report_error(client, f"{data}:errors")
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)
