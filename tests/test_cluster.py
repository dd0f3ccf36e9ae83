"""rlocks on a real Redis Cluster (3 masters on loopback), through ``RedisCluster``.

Proves: each primitive's keys sit in one slot, so every script runs on one node; the
primitives spread over the nodes; wake-ups travel by pub/sub (a script PUBLISHes on the
waiter's process channel, which the cluster carries to every node; the process has one
subscription, on one node), so a waiter is woken by a release and not by its own re-check;
renewal (a cluster pipeline of EVALSHA) keeps short leases alive on every node; and the
cross-process mutual-exclusion suite holds through the cluster client for every
primitive.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest
import redis
import redis.asyncio.cluster

import rlocks
import rlocks.asyncio
from rlocks._engine import identity

from . import _procs
from ._servers import RENEWED_TTL, LocalCluster, server_version, wait_all_renewed, wait_until
from ._threads import hub_waiters
from .conftest import without_counters

SPAWN = multiprocessing.get_context("spawn")
NAMESPACE = "rlocks-cluster-test"

pytestmark = pytest.mark.skipif(
    server_version() < (7, 0),
    reason="the local cluster (its cluster-port setting) needs redis-server 7.0 or newer; "
    f"found {server_version() or 'none'}",
)


@pytest.fixture(scope="module")  # as the shared cluster it runs on (conftest)
def cclient(cluster: LocalCluster) -> Iterator[Any]:
    client = cluster.client()
    yield client
    client.close()


def node_of(client: Any, key: str) -> str:
    return client.nodes_manager.get_node_from_slot(client.keyslot(key)).name


def names_on_every_node(client: Any, prefix: str, count: int) -> List[str]:
    """``count`` fresh names whose hash tags cover all three nodes.

    Random names miss a node now and then (9 names: ~8% of the time), which would make
    a test's "spread over the nodes" precondition a coin toss.
    """
    stamp = time.monotonic_ns()
    for attempt in range(1000):
        names = [f"{prefix}-{i}-{stamp}-{attempt}" for i in range(count)]
        if len({node_of(client, f"{NAMESPACE}:x:{{{n}}}") for n in names}) == 3:
            return names
    raise AssertionError(f"no {count} names covering every node")


def slow_recheck(kind: str) -> Dict[str, Any]:
    """Keywords that put a waiter's own re-check long after the wake-up bounds below: a
    30 s entry lease (it asks again after a third of it, 10 s) and, for the locks, no
    deadlock check (which would make it ask again every ``deadlock_timeout``)."""
    if kind in ("sem", "bsem"):
        return {"entry_lease": 30.0}
    return {"entry_lease": 30.0, "deadlock_timeout": None}


def channel_of(prim: Any) -> str:
    """The wake-up channel of this process for ``prim``'s namespace."""
    return str(prim._keys.wake + identity.process_token())


def subscriptions(client: Any, channel: str) -> int:
    """Subscribers of ``channel`` on every node of the cluster, summed (PUBSUB NUMSUB
    answers for its own node only)."""
    total = 0
    for node in client.get_nodes():
        total += sum(n for _, n in node.redis_connection.pubsub_numsub(channel))
    return total


def listening(prim: Any) -> bool:
    """Whether this process's wake-up subscriber for ``prim``'s client and namespace has
    its subscription confirmed by the server (no I/O)."""
    hub = prim._backend._hubs.get(prim._keys.wake)
    return hub is not None and hub.ready.is_set()


def cluster_keys(client: Any) -> List[bytes]:
    found: List[bytes] = []
    for node in client.get_primaries():
        found.extend(without_counters(node.redis_connection.keys(f"{NAMESPACE}:*")))
    return found


def test_cluster_is_three_masters(cluster: LocalCluster, cclient: Any) -> None:
    assert len(cclient.get_primaries()) == 3
    assert cclient.cluster_info()["cluster_state"] == "ok"


@pytest.mark.timeout(30)
def test_each_primitive_lives_in_one_slot_and_they_spread_over_nodes(cclient: Any) -> None:
    nodes = set()
    for i in range(24):
        name = f"spread-{i}"
        lock = rlocks.RLock(name, client=cclient, namespace=NAMESPACE)
        rw = rlocks.RWLock(name, client=cclient, namespace=NAMESPACE)
        sem = rlocks.Semaphore(name, 2, client=cclient, namespace=NAMESPACE)
        assert lock.acquire(blocking=False)
        assert rw.read_lock.acquire(blocking=False)
        assert sem.acquire(blocking=False)
        for prim in (lock, rw.read_lock, rw.write_lock, sem):
            keys = prim._keys
            slots = {cclient.keyslot(k) for k in
                     (keys.hash, keys.queue, keys.leases, keys.fence, keys.condition("c"))}
            assert len(slots) == 1, (prim, slots)
        owner = node_of(cclient, lock._keys.hash)
        nodes.add(owner)
        # The hash is really on that node (the others would answer MOVED).
        node = cclient.get_node(node_name=owner)
        assert node.redis_connection.exists(lock._keys.hash) == 1
        lock.release()
        rw.read_lock.release()
        sem.release()
    assert len(nodes) == 3, f"24 locks all landed on {nodes}"
    assert cluster_keys(cclient) == []


def _holder_thread(acquire, release, held: threading.Event, go: threading.Event, errors: list):
    def run() -> None:
        try:
            assert acquire(timeout=10)
            held.set()
            assert go.wait(20)
            release()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            errors.append(exc)
            held.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["rlock", "write", "read-waits-for-write", "sem", "bsem"])
@pytest.mark.timeout(30)
def test_release_wakes_a_waiter_through_pubsub(cclient: Any, kind: str) -> None:
    """The waiter's only way in within 3 s is the wake-up: its own re-check comes after
    10 s, the holder's lease (30 s, renewed) later still."""
    name = f"wake-{kind}-{time.monotonic_ns()}"
    if kind == "read-waits-for-write":
        rw = rlocks.RWLock(name, client=cclient, ttl=30, namespace=NAMESPACE,
                           **slow_recheck("read"))
        h_acq, h_rel = rw.write_lock.acquire, rw.write_lock.release
        w_acq, w_rel = rw.read_lock.acquire, rw.read_lock.release
        prim = rw.read_lock
    else:
        prim, h_acq, h_rel, _n = _procs.make_mutex(kind, name, cclient, NAMESPACE, ttl=30)
        _other, w_acq, w_rel, _n = _procs.make_mutex(kind, name, cclient, NAMESPACE, ttl=30,
                                                     **slow_recheck(kind))
    held, go, errors = threading.Event(), threading.Event(), []
    holder = _holder_thread(h_acq, h_rel, held, go, errors)
    assert held.wait(10) and not errors, errors
    result: Dict[str, Any] = {}

    def wait_for_it() -> None:
        began = time.monotonic()
        result["ok"] = w_acq(timeout=20)
        result["waited"] = time.monotonic() - began
        if result["ok"]:
            w_rel()

    waiter = threading.Thread(target=wait_for_it, daemon=True)
    waiter.start()
    wait_until(lambda: hub_waiters(prim) and listening(prim), 10,
               "the waiter to wait, its subscriber listening")
    assert subscriptions(cclient, channel_of(prim)) == 1  # one subscription, on one node
    released = time.monotonic()
    go.set()
    waiter.join(15)
    holder.join(15)
    assert not errors, errors
    assert result.get("ok") is True, result
    # Woken by the release, not by its own re-check 10 s on.
    assert time.monotonic() - released < 3.0
    wait_until(lambda: cluster_keys(cclient) == [], 5, "the primitive's keys to go")


@pytest.mark.timeout(30)
def test_waiters_on_every_node_are_woken(cclient: Any) -> None:
    """One subscription (one channel, on one node) hears the wake-ups published on all
    three nodes."""
    names = names_on_every_node(cclient, "multi", 12)
    locks = [rlocks.RLock(n, client=cclient, ttl=30, namespace=NAMESPACE) for n in names]
    assert len({node_of(cclient, lk._keys.hash) for lk in locks}) == 3
    for lk in locks:
        assert lk.acquire()
    results: List[Any] = [None] * len(names)

    def wait_one(i: int) -> None:
        other = rlocks.RLock(names[i], client=cclient, ttl=30, namespace=NAMESPACE,
                             **slow_recheck("rlock"))
        results[i] = other.acquire(timeout=20)
        if results[i]:
            other.release()

    threads = [threading.Thread(target=wait_one, args=(i,), daemon=True) for i in range(len(names))]
    for t in threads:
        t.start()
    wait_until(
        lambda: all(len(hub_waiters(lk)) == 1 for lk in locks) and listening(locks[0]),
        10,
        "every waiter to wait, the subscriber listening",
    )
    assert subscriptions(cclient, channel_of(locks[0])) == 1
    began = time.monotonic()
    for lk in locks:
        lk.release()
    for t in threads:
        t.join(15)
    assert results == [True] * len(names)
    # (a waiter not woken asks again after 10 s)
    assert time.monotonic() - began < 5.0
    wait_until(lambda: cluster_keys(cclient) == [], 5, "all keys to go")


@pytest.mark.timeout(60)
def test_renewal_pipeline_keeps_short_leases_alive_on_every_node(cclient: Any) -> None:
    lost: List[Any] = []
    prims: List[Any] = []
    for name in names_on_every_node(cclient, "renew", 9):
        prims.append(rlocks.RLock(name, client=cclient, ttl=3.0, namespace=NAMESPACE, on_lost=lost.append))
        prims.append(rlocks.Semaphore(name, 1, client=cclient, ttl=3.0, namespace=NAMESPACE, on_lost=lost.append))
        rw = rlocks.RWLock(name, client=cclient, ttl=3.0, namespace=NAMESPACE, on_lost=lost.append)
        prims.append(rw.read_lock)
    assert len({node_of(cclient, p._keys.hash) for p in prims}) == 3
    for p in prims:
        assert p.acquire()
    # Only renewal (batched per pipeline) keeps them: wait until every hold's keys were
    # pushed back twice by it, on every node (a sleep past the lease failed whenever the
    # renewer was late on a loaded machine: with ttl 0.6 in a full run, with ttl 1.5
    # under stress-ng at load 16 on 2 cores). A lost hold fails this (its key is gone).
    wait_all_renewed(cclient, [p._keys.hash for p in prims], times=2)
    for p in prims:
        p.release()  # raises LockLostError if any lease had lapsed
    assert not lost
    assert cluster_keys(cclient) == []


@pytest.mark.timeout(30)
def test_scripts_reload_after_script_flush_on_all_nodes(cclient: Any) -> None:
    lock = rlocks.RLock(
        f"flush-{time.monotonic_ns()}", client=cclient, ttl=RENEWED_TTL, namespace=NAMESPACE
    )
    lost: List[Any] = []
    lock._on_lost = lost.append
    assert lock.acquire()
    for node in cclient.get_primaries():
        node.redis_connection.script_flush()
    # Wait for the renewer to meet NOSCRIPT and load the script again on the lock's node
    # (state, not a sleep), then for the renewal it redid to be applied.
    home = cclient.nodes_manager.get_node_from_slot(cclient.keyslot(lock._keys.hash))
    renew = lock._spec.renew_script.sha
    deadline = time.monotonic() + 10
    while not home.redis_connection.script_exists(renew)[0]:
        assert time.monotonic() < deadline, "the renewer never reloaded its script"
        time.sleep(0.01)
    # (the reload comes with the first renewal, a third of the ttl after the acquire:
    # only the renewal redone after it can bring the lease back above 80 %)
    while cclient.pttl(lock._keys.hash) < 0.8 * RENEWED_TTL * 1000:
        assert time.monotonic() < deadline, "no renewal after the reload"
        time.sleep(0.01)
    assert not lost
    lock.release()
    assert lock.acquire(blocking=False)  # the acquire path recovers NOSCRIPT too
    lock.release()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cross_process_mutual_exclusion_through_the_cluster_client(
    cluster: LocalCluster, cclient: Any
) -> None:
    """4 processes x 2 threads, every primitive kind, nested where reentrant: exact counts."""
    processes, threads, iterations = 4, 2, 30
    stamp = time.monotonic_ns()
    # Names that land on at least two nodes (random names all hash to one node ~1% of the
    # time, which would make the spread assertion below a coin toss).
    for attempt in range(100):
        names = [f"xproc-{k}-{stamp}-{attempt}-{i}" for i, k in enumerate(_procs.KINDS)]
        if len({node_of(cclient, f"{NAMESPACE}:x:{{{n}}}") for n in names}) >= 2:
            break
    data = f"{NAMESPACE}-data:{stamp}"
    spec = {"cluster": cluster.startup_nodes}
    start = SPAWN.Barrier(processes + 1)
    children = [
        SPAWN.Process(
            target=_procs.counter_worker,
            args=(spec, list(_procs.KINDS), names, NAMESPACE, data, iterations, threads, 60.0, start),
        )
        for _ in range(processes)
    ]
    try:
        for p in children:
            p.start()
        start.wait(45)
        for p in children:
            p.join(60)
        errors = [e.decode() for e in cclient.lrange(f"{data}:errors", 0, -1)]
        assert errors == []
        assert [p.exitcode for p in children] == [0] * processes
        done = sum(int(v) for v in cclient.lrange(f"{data}:done", 0, -1))
        assert done == processes * threads * iterations
        total = sum(
            int(cclient.get(f"{data}:counter:{i}") or 0) for i in range(len(_procs.KINDS))
        )
        assert total == done, "lost updates: critical sections overlapped"
        assert cclient.lrange(f"{data}:overlaps", 0, -1) == []
        assert len({node_of(cclient, f"{NAMESPACE}:x:{{{n}}}") for n in names}) >= 2
        assert cluster_keys(cclient) == [], "a primitive was left held"
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(10)
        for i in range(len(_procs.KINDS)):
            cclient.delete(f"{data}:counter:{i}", f"{data}:gauge:{i}")
        for k in ("errors", "done", "overlaps", "resources"):
            cclient.delete(f"{data}:{k}")


def test_replicas_option_is_refused_on_a_cluster_client(cclient: Any, cluster: LocalCluster) -> None:
    # WAIT has no key, so a cluster client could not send it to the node that holds the lock.
    with pytest.raises(ValueError, match="not supported on Redis Cluster"):
        rlocks.RLock("wait-on-cluster", client=cclient, replicas=1)
    # (the asyncio twin too: it was accepted, and no acknowledgement was ever checked)
    aclient = redis.asyncio.cluster.RedisCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in cluster.startup_nodes])
    with pytest.raises(ValueError, match="not supported on Redis Cluster"):
        rlocks.asyncio.RLock("wait-on-cluster", client=aclient, replicas=1)


@pytest.mark.timeout(30)
def test_an_asyncio_cluster_client_with_no_node_reachable_fails_as_a_link_does() -> None:
    # Its map is made at the first call: with no node up, that raised redis-py's
    # RedisClusterException at once; a link's failure is sent again until the timeout,
    # then raised as a ConnectionError, as on one server.
    from rlocks.server import free_port

    async def main() -> float:
        client = redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode("127.0.0.1", free_port())])
        lock = rlocks.asyncio.RLock("nobody-home", client=client)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError, match="cannot be connected"):
            await lock.acquire(timeout=0.5)
        return time.monotonic() - started

    assert asyncio.run(main()) >= 0.2  # sent again with back-off (at once, before)


def test_two_asyncio_cluster_clients_of_two_clusters_are_two_backends() -> None:
    # Before its first call an asyncio cluster client knows no nodes: it was named by the
    # nodes it starts from, not as "a cluster" (two clusters' locks of one name were one
    # lock to the process: a grant on one told the other's holder it was lost). No I/O.
    from rlocks._engine.backends import address_of

    def make(*ports: int) -> Any:
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode("127.0.0.1", p) for p in ports])

    assert address_of(make(7000)) != address_of(make(7100))
    assert address_of(make(7000, 7001)) == address_of(make(7001, 7000))
