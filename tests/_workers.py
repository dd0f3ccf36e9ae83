"""Top-level worker functions for the multi-process tests (picklable under "spawn").

Workers report through Redis (lists named by the test) and through their exit code, so a
test can check everything a child saw. They import only rlocks, redis and the stdlib: a
spawned child starts from a fresh interpreter and must not need pytest.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from typing import Any, List

import redis

import rlocks

EXIT_OK = 0
EXIT_FAILED = 3  # an assertion or an unexpected error; the traceback is in errors_key


def _client(url: str) -> "redis.Redis[bytes]":
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def _report_error(client: Any, errors_key: str) -> None:
    text = f"pid {os.getpid()} {threading.current_thread().name}:\n{traceback.format_exc()}"
    try:
        client.rpush(errors_key, text)
    except Exception:  # noqa: BLE001 - the exit code still says it failed
        pass


def counter_worker(
    url: str,
    name: str,
    namespace: str,
    keys: dict,
    iterations: int,
    threads: int,
    start: Any,
) -> None:
    """``threads`` threads each do ``iterations`` nested-locked, non-atomic increments.

    ``keys``: ``counter`` (the value read-modified-written), ``gauge`` (INCR on entry to the
    critical section, DECR on exit: how many are inside at once), ``peaks`` (list: each
    thread's highest gauge reading), ``errors`` (list: tracebacks). ``start`` is a
    multiprocessing Barrier shared with the test and the other workers, so every process
    contends from the same moment instead of finishing before the next has spawned.
    """
    client = _client(url)
    lock = rlocks.RLock(name, client=client, ttl=10.0, namespace=namespace)
    failures: List[BaseException] = []

    def work() -> None:
        peak = 0
        try:
            for _ in range(iterations):
                assert lock.acquire()
                try:
                    assert lock.acquire()  # re-entry: must not block on our own hold
                    try:
                        assert lock._recursion_count() == 2
                        inside = client.incr(keys["gauge"])
                        peak = max(peak, inside)
                        value = int(client.get(keys["counter"]) or 0)
                        time.sleep(0.001)  # widen the race window of the read-modify-write
                        client.set(keys["counter"], value + 1)
                        client.decr(keys["gauge"])
                    finally:
                        lock.release()
                    assert lock._recursion_count() == 1
                finally:
                    lock.release()
                assert not lock._is_owned()
        except BaseException as exc:  # noqa: BLE001 - reported to the test, then exit code
            failures.append(exc)
            _report_error(client, keys["errors"])
        finally:
            client.rpush(keys["peaks"], peak)

    try:
        start.wait(60)
        workers = [
            threading.Thread(target=work, name=f"counter-{i}") for i in range(threads)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    except BaseException:  # noqa: BLE001
        _report_error(client, keys["errors"])
        os._exit(EXIT_FAILED)
    os._exit(EXIT_FAILED if failures else EXIT_OK)


def holder_worker(
    url: str,
    name: str,
    namespace: str,
    ttl: float,
    errors_key: str,
    held: Any,
    release: Any,
) -> None:
    """Acquire ``name`` (auto-renewed lease of ``ttl`` s), set ``held``, hold it until
    ``release`` is set (or the process is killed), then release it.

    Exits 0 only if the release succeeded, i.e. the hold was never lost while held.
    """
    client = _client(url)
    try:
        lock = rlocks.RLock(name, client=client, ttl=ttl, auto_renew=True, namespace=namespace)
        assert lock.acquire(timeout=10), "holder could not acquire"
        held.set()
        assert release.wait(60), "the test never asked the holder to release"
        lock.release()  # raises LockLostError if the lease ever ran out under us
    except BaseException:  # noqa: BLE001
        _report_error(client, errors_key)
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)
