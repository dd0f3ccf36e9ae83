"""Fencing tokens: a store that refuses writes from a holder whose lease ended.

A lock alone cannot protect a resource from a holder that stalls (a GC pause, a stopped
VM, a slow network) past its lease: by the time it writes, another process may hold the
lock and have written. Fencing closes that gap. Every write carries ``lock.token``, and
the resource remembers the largest token it has accepted and refuses any smaller one.

Run it against a Redis server (``RLOCKS_URL``, default ``redis://localhost:6379/0``):

    python examples/fencing.py
"""

from __future__ import annotations

import threading
from typing import Dict, Tuple

import rlocks


class StaleTokenError(Exception):
    """A write carried an older fencing token than one the store has seen."""


class FencedStore:
    """A key-value store that accepts a write only with the largest token seen so far.

    In a real system the check and the write are one atomic step in the store itself:
    ``UPDATE ... SET value = :v, token = :t WHERE key = :k AND token <= :t`` in SQL, a
    compare-and-set on a document version, a Lua script in Redis.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._highest = 0
        self._data: Dict[str, Tuple[str, int]] = {}

    def write(self, key: str, value: str, token: int) -> None:
        with self._mutex:
            if token < self._highest:
                raise StaleTokenError(f"token {token} < {self._highest}: refused")
            self._highest = token
            self._data[key] = (value, token)

    def read(self, key: str) -> str:
        with self._mutex:
            return self._data[key][0]


def main() -> None:
    store = FencedStore()
    # auto_renew=False and a short lease stand in for a holder that stalls: nothing
    # renews its lease while it is "paused".
    slow = rlocks.RLock("fencing-example", ttl=0.5, auto_renew=False)
    slow.acquire()
    stale = slow.token
    assert stale is not None
    store.write("report", "draft by the slow holder", stale)

    # ... the slow holder stalls; its lease ends and another worker takes the lock ...
    def other_worker() -> None:
        lock = rlocks.RLock("fencing-example")
        with lock:  # blocks until the slow holder's lease has ended
            assert lock.token is not None
            store.write("report", "final version", lock.token)
            print(f"the other worker wrote with token {lock.token}")

    worker = threading.Thread(target=other_worker)
    worker.start()
    worker.join()

    # The slow holder wakes up and, not knowing, writes: the store refuses it.
    try:
        store.write("report", "late overwrite by the slow holder", stale)
    except StaleTokenError as exc:
        print(f"the store refused the stale write ({exc})")
    else:
        raise SystemExit("the stale write was accepted")
    try:
        slow.release()
    except rlocks.LockLostError:
        print("and the slow holder learns its hold was lost when it releases")
    assert store.read("report") == "final version"


if __name__ == "__main__":
    main()
