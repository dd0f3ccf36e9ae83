"""Load: 8 processes x 4 threads hammer four primitives (RLock, RWLock write side,
Semaphore(1), BoundedSemaphore(1)) for up to ~45 s, each critical section a non-atomic
read-modify-write.

Proves, under sustained contention: 0 lost updates (each counter equals the number of
sections run under its primitive), 0 overlapping holders (a gauge checked inside every
section), 0 keys left after release, and no growth in connections (each process's own
pools; in the server's CLIENT LIST, none of the workers' named connections is left once
they are gone) or threads (each process ends with no more threads than it had once warm,
minus its workers).

``RLOCKS_LOAD_SECONDS`` and ``RLOCKS_LOAD_ITERATIONS`` scale it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

from . import _procs
from .conftest import NAMESPACE, without_counters

SPAWN = multiprocessing.get_context("spawn")

PROCESSES, THREADS = 8, 4
SECONDS = float(os.environ.get("RLOCKS_LOAD_SECONDS", "45"))
ITERATIONS = int(os.environ.get("RLOCKS_LOAD_ITERATIONS", "2000"))  # per thread, at most


def clients_connected(client: Any, named: str) -> int:
    """The server's connections named ``named`` (CLIENT SETNAME, sent by redis-py on each
    connection of a client made with ``client_name``: the workers' pools, and the pools
    rlocks derives from them). Counting only those keeps connections that other code of
    the test process opens or closes meanwhile (another test's lingering hub) out."""
    return sum(1 for c in client.client_list() if c.get("name") == named)


@pytest.mark.load
@pytest.mark.slow
@pytest.mark.timeout(SECONDS + 120)
def test_sustained_contention_loses_nothing_and_leaks_nothing(
    client: Any, redis_url: str, name: str
) -> None:
    kinds = list(_procs.KINDS)
    names = [f"{name}-{kind}" for kind in kinds]
    data = f"{NAMESPACE}:data:{name}"
    tag = f"rlocks-load-{os.getpid()}"  # the workers' connections, and only theirs
    start = SPAWN.Barrier(PROCESSES + 1)
    children = [
        SPAWN.Process(
            target=_procs.counter_worker,
            args=({"url": redis_url, "client_name": tag}, kinds, names, NAMESPACE, data, ITERATIONS, THREADS, SECONDS, start),
            name=f"load-{i}",
        )
        for i in range(PROCESSES)
    ]
    try:
        for p in children:
            p.start()
        start.wait(60)
        began = time.monotonic()
        peak_clients = 0
        while any(p.is_alive() for p in children):
            peak_clients = max(peak_clients, clients_connected(client, tag))
            if time.monotonic() - began > SECONDS + 60:
                break
            time.sleep(0.5)
        for p in children:
            p.join(30)
        elapsed = time.monotonic() - began
        errors = [e.decode() for e in client.lrange(f"{data}:errors", 0, -1)]
        assert errors == []
        assert [p.exitcode for p in children] == [0] * PROCESSES

        done = [int(v) for v in client.lrange(f"{data}:done", 0, -1)]
        assert len(done) == PROCESSES * THREADS
        counters = [int(client.get(f"{data}:counter:{i}") or 0) for i in range(len(kinds))]
        # Each thread visits the primitives round-robin, so the sum is the total exactly.
        assert sum(counters) == sum(done), f"lost updates: {counters} vs {sum(done)} sections"
        assert client.lrange(f"{data}:overlaps", 0, -1) == [], "overlapping holders"
        for i in range(len(kinds)):
            assert int(client.get(f"{data}:gauge:{i}") or 0) == 0
        # Every section released, every waiter was served (a granted waiter's entry goes
        # in the script that grants it): no hash, lease set or queue of the four
        # primitives is left, not even for an entry lease.
        left = [k for k in without_counters(client.keys(f"{NAMESPACE}:*"))
                if name.encode() in k and b":data:" not in k]
        assert left == [], f"keys left after release: {left}"

        resources = client.hgetall(f"{data}:resources")
        assert len(resources) == PROCESSES
        for pid, text in resources.items():
            threads_mid, threads_end, conns_mid, conns_end, in_use_end = (
                int(v) for v in text.split(b",")
            )
            assert threads_mid > 0 and conns_mid > 0, (pid, text)
            # Once warm: the workers, main, the wake-up subscriber and the renewer; after
            # the workers joined, main and at most one subscriber and one renewer (nothing
            # started per section stays).
            assert threads_mid <= THREADS + 3, (pid, text)
            assert threads_end <= 3, (pid, text)
            # The pool grows to the most connections ever busy at once, and that peak may
            # come after the warm sample (seen: 4 workers and the subscriber busy together
            # only later), so the bound is structural: one per worker, the subscriber's
            # connection, the renewer's pipeline. A connection a section failed to give
            # back would still be checked out once the workers joined: only the
            # subscriber's (and a renewal in flight) may be.
            assert conns_mid <= THREADS + 2 and conns_end <= THREADS + 2, (pid, text)
            assert in_use_end <= 2, (pid, text)
        assert 0 < peak_clients <= PROCESSES * (THREADS + 3)
        # All worker connections closed with their processes (the server notices each
        # closed socket on its next event-loop pass: wait for that, not for a time).
        deadline = time.monotonic() + 10
        while clients_connected(client, tag) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert clients_connected(client, tag) == 0

        total = sum(done)
        print(
            f"\nload: {PROCESSES}x{THREADS} threads, {total} critical sections in "
            f"{elapsed:.1f} s ({total / elapsed:.0f}/s), per primitive {counters}, "
            f"peak worker connections {peak_clients}"
        )
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(10)
        keys = [f"{data}:{k}" for k in ("errors", "done", "overlaps", "resources")]
        keys += [f"{data}:counter:{i}" for i in range(len(kinds))]
        keys += [f"{data}:gauge:{i}" for i in range(len(kinds))]
        client.delete(*keys)
