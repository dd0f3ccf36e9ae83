"""Small contracts from the bug hunt of issue 10: copying, Condition on a write lock that
also reads, and wake-up channels with a client that decodes replies in another encoding.
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
from typing import Any, List

import pytest
import redis

import rlocks
import rlocks.asyncio as ra
from rlocks._engine.identity import thread_owner

from ._servers import wait_until
from .conftest import NAMESPACE

# -- copy / pickle ----------------------------------------------------------------------------


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps])
def test_primitives_refuse_to_be_copied_or_pickled(
    client: "redis.Redis[bytes]", name: str, copier: Any
) -> None:
    # threading's locks raise TypeError ("cannot pickle '_thread.RLock' object"); a copy
    # of an rlocks primitive would share this process's held state.
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    prims = [
        rlocks.RLock(name, client=client, namespace=NAMESPACE),
        rw,
        rw.read_lock,
        rw.write_lock,
        rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE),
        rlocks.BoundedSemaphore(name, 2, client=client, namespace=NAMESPACE),
        ra.RLock(name, namespace=NAMESPACE),
        ra.RWLock(name, namespace=NAMESPACE),
        ra.Semaphore(name, 2, namespace=NAMESPACE),
    ]
    for prim in prims:
        with pytest.raises(TypeError, match="cannot pickle or copy") as info:
            copier(prim)
        assert name in str(info.value)
    with pytest.raises(TypeError):
        copier(threading.RLock())  # the control row: what threading does


# -- Condition on a write lock whose thread also reads ----------------------------------------


@pytest.mark.timeout(60)
def test_condition_wait_on_write_lock_of_a_downgraded_writer(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # A downgraded writer holds both sides. Waiting on a Condition of the write side lets
    # both go (no one could write while it still read, so no one could notify) and takes
    # both back, instead of failing to re-take the write side with UpgradeError.
    rw = rlocks.RWLock(name, client=client, ttl=10, namespace=NAMESPACE)
    key = rw.write_lock._keys.hash
    cond = threading.Condition(rw.write_lock)
    state: List[Any] = []
    errors: List[BaseException] = []

    def notifier() -> None:
        try:
            with cond:  # only possible while the waiter has let go of both sides
                state.append(dict(client.hgetall(key)))
                cond.notify()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    me = thread_owner()
    assert rw.write_lock.acquire() and rw.read_lock.acquire()
    t = threading.Thread(target=notifier)
    try:
        with cond:
            t.start()
            notified = cond.wait(timeout=20)
            assert notified, "the notifier never got the write lock"
            assert rw.write_lock._recursion_count() == 2
            assert rw.read_lock._recursion_count() == 1
            fields = client.hgetall(key)
            assert fields[f"w:{me}".encode()] == b"2" and fields[f"r:{me}".encode()] == b"1"
        t.join(10)
        assert not errors, errors
        # Exact fields: a substring test matched another thread's owner (serial 1 in 15).
        assert not {f"w:{me}".encode(), f"r:{me}".encode()} & set(state[0]), state
        rw.read_lock.release()
        rw.write_lock.release()
        assert not client.exists(key)
    finally:
        t.join(10)
        client.delete(key)


# -- wake-up channels and the client's encoding -------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("decode", [False, True])
def test_waiter_is_woken_whatever_the_clients_encoding(
    redis_url: str, name: str, decode: bool
) -> None:
    # The wake-up channel's name goes out encoded with the client's encoding; the hub must
    # recognise it coming back whether redis-py hands it over as bytes or decoded.
    c = redis.Redis.from_url(
        redis_url, decode_responses=decode, encoding="latin-1", socket_timeout=10
    )
    lock_name = f"{name}-café-ñ"
    ttl = 60.0
    holder = rlocks.RLock(lock_name, client=c, ttl=ttl, namespace=NAMESPACE)
    waiter = rlocks.RLock(lock_name, client=c, ttl=ttl, namespace=NAMESPACE)
    woken: List[float] = []
    errors: List[BaseException] = []

    def wait() -> None:
        try:
            assert waiter.acquire(timeout=ttl)
            woken.append(time.monotonic())
            waiter.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    assert holder.acquire()
    t = threading.Thread(target=wait)
    t.start()
    try:
        channel = holder._channel
        wait_until(
            lambda: dict(c.pubsub_numsub(channel)).get(
                channel if decode else channel.encode("latin-1"), 0
            )
            >= 1,
            10,
            "the waiter's subscription",
        )
        released = time.monotonic()
        holder.release()
        t.join(ttl)
        assert not errors, errors
        # Woken by the release, not by polling the holder's 60 s lease.
        assert woken and woken[0] - released < 3.0, woken and woken[0] - released
    finally:
        t.join(10)
        c.delete(holder._keys.hash)
        c.close()
