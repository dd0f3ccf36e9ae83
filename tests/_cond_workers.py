"""Spawnable workers for the Condition tests (``test_condition.py``).

Like ``_workers.py`` they import only rlocks, redis and the stdlib, report through Redis
(lists, exit codes) and are picklable under "spawn".
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any, Dict

import redis

import rlocks

from ._procs import make_client

EXIT_OK = 0
EXIT_FAILED = 3
CAPACITY = 16  # the bounded buffer's size


def _client(url: str) -> "redis.Redis[bytes]":
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def _report(client: Any, key: str) -> None:
    text = f"pid {os.getpid()} {threading.current_thread().name}:\n{traceback.format_exc()}"
    try:
        client.rpush(key, text)
    except Exception:  # noqa: BLE001 - the exit code still says it failed
        pass


def waiter_worker(
    spec: Dict[str, Any], name: str, namespace: str, ttl: float, keys: Dict[str, str]
) -> None:
    """Wait on the condition of RLock ``name`` (no time-out); push the result when woken.

    ``spec``: a client spec of ``_procs.make_client`` (a URL or cluster nodes). The test
    SIGKILLs it while it waits, to leave an entry behind that nobody renews.
    """
    client = make_client(spec)
    cond = rlocks.Condition(rlocks.RLock(name, client=client, namespace=namespace, ttl=ttl))
    try:
        with cond:
            client.rpush(keys["entered"], os.getpid())
            notified = cond.wait()
        client.rpush(keys["woken"], f"{os.getpid()}:{notified}")
    except BaseException:
        _report(client, keys["errors"])
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def _conditions(client: Any, name: str, namespace: str) -> Any:
    """The bounded buffer's lock and its two conditions, as in the threading docs."""
    lock = rlocks.RLock(name, client=client, namespace=namespace)
    return rlocks.Condition(lock, name="not full"), rlocks.Condition(lock, name="not empty")


def producer_worker(
    url: str, name: str, namespace: str, keys: Dict[str, str], tag: str, count: int, start: Any
) -> None:
    """Put ``count`` items ``<tag>:<i>`` into the bounded buffer (a Redis list of at most
    CAPACITY items guarded by RLock ``name``), waiting on "not full" while it is full."""
    client = _client(url)
    not_full, not_empty = _conditions(client, name, namespace)
    buffer = keys["buffer"]
    items = [f"{tag}:{i}" for i in range(count)]
    try:
        start.wait(30)
        while items:
            with not_full:
                not_full.wait_for(lambda: client.llen(buffer) < CAPACITY)
                # As many as fit: fewer critical sections keep the test short.
                room = CAPACITY - client.llen(buffer)
                client.rpush(buffer, *items[:room])
                del items[:room]
                # Every consumer waiting now found the buffer empty; wake them all.
                not_empty.notify_all()
    except BaseException:
        _report(client, keys["errors"])
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)


def consumer_worker(
    url: str, name: str, namespace: str, keys: Dict[str, str], total: int, start: Any
) -> None:
    """Take items from the bounded buffer until ``total`` were taken by all consumers;
    each taken item is appended to the ``seen`` list (checked for loss and duplicates)."""
    client = _client(url)
    not_full, not_empty = _conditions(client, name, namespace)
    buffer, taken = keys["buffer"], keys["taken"]

    def ready() -> bool:
        return bool(client.llen(buffer)) or int(client.get(taken) or 0) >= total

    try:
        start.wait(30)
        while True:
            with not_empty:
                not_empty.wait_for(ready)
                # At most half the buffer, so both consumers get work.
                items = client.lpop(buffer, CAPACITY // 2)
                if not items:  # every item was taken
                    not_empty.notify_all()  # so is the other consumer, maybe waiting
                    break
                with client.pipeline(transaction=False) as pipe:
                    pipe.incrby(taken, len(items)).rpush(keys["seen"], *items).execute()
                if int(client.get(taken) or 0) >= total:
                    not_empty.notify_all()  # the end: nobody waits for more items
                # Every producer waiting now found the buffer full; wake them all.
                not_full.notify_all()
    except BaseException:
        _report(client, keys["errors"])
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)
