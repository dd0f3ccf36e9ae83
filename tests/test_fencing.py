"""Fencing tokens (``lock.token``): issue 13, part 2.

Tokens of successive grants of one primitive strictly increase, across processes, lease
expiries, forced releases, waiters woken by a release and a server restart; re-entry
keeps the token; ``None`` when the caller holds nothing. Real servers only: the
session's server, the local cluster, and throwaway servers for the restarts.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import redis
import redis.asyncio
import redis.crc

import rlocks
import rlocks.asyncio
from rlocks._engine.keys import fence_key, keys_for
from rlocks._engine.scripts import DONE, GRANTED, WAIT
from rlocks._engine.state import force_release
from rlocks.server import TemporaryRedisServer

from . import _fence_workers
from ._servers import wait_until
from ._threads import in_thread as _in_thread
from .conftest import NAMESPACE

SPAWN = multiprocessing.get_context("spawn")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fencing.py"


def _fresh(client: Any, kind: str, name: str) -> Any:
    """A primitive (an RLock, or an RWLock) whose fencing counter no other test has
    moved: tokens are asserted exactly here, and the counter is shared by every name of
    a namespace whose keys land in one cluster slot."""
    namespace = f"fence-{name}"
    if kind == "rlock":
        return rlocks.RLock(name, client=client, namespace=namespace)
    return rlocks.RWLock(name, client=client, namespace=namespace)


def _server_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def _errors(client: Any, data: str) -> List[str]:
    return [e.decode() for e in client.lrange(f"{data}:errors", 0, -1)]


def _tokens(client: Any, data: str) -> List[int]:
    return [int(t) for t in client.lrange(f"{data}:tokens", 0, -1)]


def _reap(*procs: Any, errors: Callable[[], Any] = lambda: None) -> None:
    """Join (or kill) each worker; assert it exited 0, showing ``errors()`` if not."""
    for proc in procs:
        proc.join(60)
        if proc.is_alive():  # pragma: no cover - only on a hung worker
            proc.kill()
            proc.join(5)
        assert proc.exitcode == 0, (proc.exitcode, errors())


# -- the scripts' contract -----------------------------------------------------------------


def test_acquire_reply_carries_the_token_and_a_wake_up_hint_none(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """An RLock's acquire reply carries the token of a fresh hold (the counter's first one
    is the server clock in microseconds), a re-entry's none (0: the caller keeps its
    token); a release's wake-up hint names the waiter and grants nothing, and the woken
    waiter's own acquire gets the next token."""
    lock = _fresh(client, "rlock", name)
    k, spec = lock._keys, lock._spec
    p1, p2 = "h:1:a:1", "h:2:b:1"
    before = _server_us(client)
    first = spec.acquire(lock, p1, 0, 0)(client)
    assert (first.status, first.a) == (GRANTED, 1)
    assert before <= first.b <= _server_us(client)
    assert int(client.get(k.fence)) == first.b
    again = spec.acquire(lock, p1, 1, 0)(client)
    assert (again.status, again.a, again.b) == (GRANTED, 2, 0)
    assert spec.acquire(lock, p2, 0, 2000)(client).status == WAIT  # p2 queues
    sub = client.pubsub()
    sub.subscribe(f"{k.wake}h:2:b")  # the channel of p2's process
    try:
        assert sub.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        assert spec.release(lock, p1, 2)(client)[:2] == (GRANTED, 1)
        released = spec.release(lock, p1, 1)(client)
        assert (released.status, released.a, released.woken) == (GRANTED, 0, (p2,))
        message = sub.get_message(timeout=5)
        assert message is not None and message["data"] == f"{k.hash}\n{p2}".encode()
    finally:
        sub.close()
    # The counter, not the clock, makes it larger.
    assert client.get(k.fence) == str(first.b).encode(), "a hint issued a token"
    woken = spec.acquire(lock, p2, 0, 2000)(client)
    assert (woken.status, woken.a, woken.b) == (GRANTED, 1, first.b + 1)
    assert not client.exists(k.queue)
    client.delete(k.hash, k.fence)


@pytest.mark.parametrize("kind", ["rlock", "rw"])
def test_a_fresh_acquire_sent_again_gets_a_new_larger_token(
    client: "redis.Redis[bytes]", name: str, kind: str
) -> None:
    """An acquire sent again after a lost reply is recognised (status 2, nothing changed),
    and a fresh hold gets a new token then, above every token issued before (the lost
    reply's token may be anyone's guess); a re-entry sent again issues none."""
    prim = _fresh(client, kind, name)
    lock = prim if kind == "rlock" else prim.write_lock
    k, spec = lock._keys, lock._spec
    first = spec.acquire(lock, "h:1:a:1", 0, 0)(client)
    assert (first.status, first.a) == (GRANTED, 1)
    resent = spec.acquire(lock, "h:1:a:1", 0, 0)(client)
    assert (resent.status, resent.a, resent.b) == (DONE, 1, first.b + 1)
    field = lock._spec.field("h:1:a:1")
    assert client.hget(k.hash, field) == b"1", "the re-send took a second level"
    assert spec.acquire(lock, "h:1:a:1", 1, 0)(client)[:3] == (GRANTED, 2, 0)
    assert spec.acquire(lock, "h:1:a:1", 1, 0)(client)[:3] == (DONE, 2, 0)
    assert client.get(k.fence) == str(first.b + 1).encode()
    client.delete(k.hash, k.leases, k.fence)


def test_rwlock_readers_get_their_own_tokens_and_a_downgrade_a_fresh_one(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """A release of the write side wakes both queued readers (hints); each then gets its
    own token from the counter; a downgrade's read hold is fresh: a token of its own."""
    rw = _fresh(client, "rw", name)
    w, r = rw.write_lock, rw.read_lock
    k = w._keys
    t0 = w._spec.acquire(w, "w:1:a:1", 0, 0)(client).b
    for reader in ("r:1:b:1", "r:2:c:1"):
        assert r._spec.acquire(r, reader, 0, 2000)(client).status == WAIT
    released = w._spec.release(w, "w:1:a:1", 1)(client)
    assert released.woken == ("r:1:b:1", "r:2:c:1")
    assert r._spec.acquire(r, "r:1:b:1", 0, 2000)(client)[:3] == (GRANTED, 1, t0 + 1)
    assert r._spec.acquire(r, "r:2:c:1", 0, 2000)(client)[:3] == (GRANTED, 1, t0 + 2)
    assert r._spec.release(r, "r:1:b:1", 1)(client).status == GRANTED
    assert r._spec.release(r, "r:2:c:1", 1)(client).status == GRANTED
    assert w._spec.acquire(w, "w:1:a:1", 0, 0)(client)[:3] == (GRANTED, 1, t0 + 3)
    assert r._spec.acquire(r, "w:1:a:1", 0, 0)(client)[:3] == (GRANTED, 1, t0 + 4)
    client.delete(k.hash, k.queue, k.leases, k.fence)


def test_a_semaphore_issues_no_tokens(client: "redis.Redis[bytes]", name: str) -> None:
    s = rlocks.Semaphore(name, 1, client=client, namespace=NAMESPACE)
    k = s._keys
    # The counter is shared by every name of the slot (earlier tests may have used one):
    # the semaphore must leave it as it found it.
    before = client.get(k.fence)
    assert s._spec.acquire(s, "p:1:a:1", 0, 0)(client)[:3] == (GRANTED, 1, 0)
    assert s._spec.acquire(s, "p:1:a:1", 0, 0)(client)[:3] == (DONE, 1, 0)  # sent again
    assert s._spec.acquire(s, "p:2:b:1", 0, 2000)(client).status == WAIT
    released = s._spec.release_permits(s, "p:1:a:1", 1, (("p:1:a:1", 1, 1),))(client)
    assert (released.status, released.woken) == (GRANTED, ("p:2:b:1",))
    assert s._spec.acquire(s, "p:2:b:1", 0, 2000)(client)[:3] == (GRANTED, 1, 0)
    assert client.get(k.fence) == before
    assert not hasattr(s, "token")
    client.delete(k.hash, k.queue, k.leases)


def test_the_counter_is_one_key_per_slot_in_the_primitive_slot() -> None:
    names = [f"n{i}" for i in range(3000)]
    counters = set()
    for n in names:
        k = keys_for("ns", "rlock", n)
        keys = [k.hash, k.queue, k.leases, k.fence, k.condition("")]
        assert len({redis.crc.key_slot(key.encode()) for key in keys}) == 1, keys
        counters.add(k.fence)
    # shared by the names of a slot: bounded by the slots, not by the names
    slots = {redis.crc.key_slot(keys_for("ns", "rlock", n).hash.encode()) for n in names}
    assert len(counters) == len(slots) < len(names)
    assert fence_key(keys_for("ns", "rw", "n1").hash) == fence_key(keys_for("ns", "rlock", "n1").hash)
    assert fence_key(keys_for("a:b", "rlock", "x").hash).startswith("a:b:fence:{")


def test_every_slot_keeps_the_counter_tag_of_earlier_versions() -> None:
    # Earlier versions tried the tags '````', '```a', ... in order and kept the first per
    # slot; the counter key of a slot must stay that tag, or processes of two versions
    # would count tokens on two keys and hand out the same token twice.
    first: Dict[int, str] = {}
    for i in range(1 << 16):
        tag = bytes((0x60 | i >> 12, 0x60 | (i >> 8) & 15, 0x60 | (i >> 4) & 15, 0x60 | i & 15))
        first.setdefault(redis.crc.key_slot(tag), tag.decode("ascii"))
    assert len(first) == 16384
    names: Dict[int, str] = {}
    for n in range(200_000):
        slot = redis.crc.key_slot(f"n{n}".encode())
        names.setdefault(slot, f"n{n}")
        if len(names) == 16384:
            break
    assert len(names) == 16384
    for slot, name in names.items():
        assert fence_key(keys_for("ns", "rlock", name).hash) == f"ns:fence:{{{first[slot]}}}"


# -- lock.token ----------------------------------------------------------------------------


def test_rlock_token_none_int_kept_on_reentry(client: "redis.Redis[bytes]", name: str) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    assert lock.token is None
    with lock:
        token = lock.token
        assert isinstance(token, int) and token > 0
        assert _in_thread(lambda: lock.token) is None  # another thread holds nothing
        with lock:
            assert lock.token == token
        assert lock.token == token
    assert lock.token is None
    assert lock.acquire()
    try:
        assert lock.token is not None and lock.token > token
    finally:
        lock.release()


def test_two_objects_of_one_name_share_the_hold_and_its_token(
    client: "redis.Redis[bytes]", name: str
) -> None:
    a = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    b = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    with a:
        token = a.token
        with b:  # re-entry of the same hold: the same token
            assert b.token == token and a.token == token
        # b took no level now, but the thread still holds the lock (through a), and two
        # objects of one name are one lock: b's view is that hold's token.
        assert b.token == token and a.token == token
    assert a.token is None and b.token is None
    rw1 = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    rw2 = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    with rw1.write_lock, rw1.read_lock:
        assert rw1.read_lock.token != rw1.write_lock.token
        with rw2.write_lock, rw2.read_lock:
            assert rw2.write_lock.token == rw1.write_lock.token
            assert rw2.read_lock.token == rw1.read_lock.token
    with a:
        assert token is not None and a.token is not None and a.token > token


def test_rwlock_sides_have_tokens(client: "redis.Redis[bytes]", name: str) -> None:
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    assert rw.read_lock.token is None and rw.write_lock.token is None
    with rw.write_lock:
        wt = rw.write_lock.token
        assert isinstance(wt, int)
        with rw.read_lock:  # downgrade
            rt = rw.read_lock.token
            assert rt is not None and rt > wt
            assert rw.write_lock.token == wt
        assert rw.read_lock.token is None
    with rw.read_lock:
        mine = rw.read_lock.token
        assert mine is not None and mine > wt
        other = _in_thread(lambda: _read_token(rw))
        assert other > mine  # readers at once: each its own, later is larger


def _read_token(rw: Any) -> Optional[int]:
    with rw.read_lock:
        return rw.read_lock.token  # type: ignore[no-any-return]


def test_tokens_increase_across_a_lease_expiry(client: "redis.Redis[bytes]", name: str) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE, ttl=0.3, auto_renew=False)
    assert lock.acquire()
    first = lock.token
    assert first is not None
    wait_until(lambda: not client.exists(lock._keys.hash), 10, "the lease to end")
    other = rlocks.RLock(name, client=client, namespace=NAMESPACE)

    def take() -> Optional[int]:
        with other:
            return other.token

    second = _in_thread(take)
    assert second is not None and second > first
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    assert lock.token is None


def test_tokens_increase_across_force_release_and_the_waiter_it_wakes(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    assert lock.acquire()
    first = lock.token
    assert first is not None
    got: List[Optional[int]] = []

    def wait_for_it() -> None:
        waiter = rlocks.RLock(name, client=client, namespace=NAMESPACE)
        assert waiter.acquire(timeout=30)
        got.append(waiter.token)
        waiter.release()

    t = threading.Thread(target=wait_for_it)
    t.start()
    queue = keys_for(NAMESPACE, "rlock", name).queue
    wait_until(lambda: client.zcard(queue) == 1, 10, "the waiter to queue")
    assert force_release(client, NAMESPACE, "rlock", name)  # wakes the waiter
    t.join(30)
    assert not t.is_alive() and len(got) == 1
    assert got[0] is not None and got[0] > first
    with pytest.raises(rlocks.LockLostError):
        lock.release()


@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_waiter_of_another_process_served_after_a_release_gets_a_larger_token(
    target: Tuple[Any, Dict[str, Any]], name: str, kind: str
) -> None:
    client, spec = target
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    lock: Any = rlocks.RLock(name, client=client, namespace=NAMESPACE) if kind == "rlock" \
        else rw.write_lock
    data = f"{NAMESPACE}:data:{{{name}}}"
    assert lock.acquire()
    first = lock.token
    proc = SPAWN.Process(
        target=_fence_workers.token_worker, args=(spec, kind, name, NAMESPACE, data, 1, 60.0)
    )
    proc.start()
    try:
        queue = keys_for(NAMESPACE, "rlock" if kind == "rlock" else "rw", name).queue
        wait_until(lambda: client.zcard(queue) == 1, 30, "the other process to queue")
        lock.release()
    finally:
        _reap(proc, errors=lambda: _errors(client, data))
    assert _errors(client, data) == []
    [served] = _tokens(client, data)
    assert first is not None and served > first
    client.delete(f"{data}:tokens")


@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_tokens_strictly_increase_across_processes(
    target: Tuple[Any, Dict[str, Any]], name: str, kind: str
) -> None:
    client, spec = target
    data = f"{NAMESPACE}:data:{{{name}}}"
    procs = [
        SPAWN.Process(
            target=_fence_workers.token_worker,
            args=(spec, kind, name, NAMESPACE, data, 15, 60.0),
        )
        for _ in range(3)
    ]
    for proc in procs:
        proc.start()
    _reap(*procs, errors=lambda: _errors(client, data))
    assert _errors(client, data) == []
    tokens = _tokens(client, data)
    assert len(tokens) == 45
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens
    client.delete(f"{data}:tokens")


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_tokens_increase_across_a_server_restart(persistent: bool) -> None:
    folder = tempfile.mkdtemp(prefix="rlocks-fence-")
    # later arguments win: the data folder outlives the server object, for the restart
    extra = ["--dir", folder, "--appendonly", "yes", "--appendfsync", "always"] \
        if persistent else []
    server = TemporaryRedisServer(extra_args=extra).start()
    port = server.port
    try:
        c = redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=2)
        lock = rlocks.RLock("restart", client=c, namespace=NAMESPACE)
        with lock:
            first = lock.token
        counter = fence_key(lock._keys.hash)
        assert c.get(counter) == str(first).encode()
        server.stop()
        server = TemporaryRedisServer(port=port, extra_args=extra).start()
        wait_until(lambda: _answers(c), 10, "the restarted server")
        # without persistence the counter is gone: the server clock keeps tokens growing
        assert (c.get(counter) is not None) == persistent
        with lock:
            second = lock.token
        assert first is not None and second is not None and second > first
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _answers(c: "redis.Redis[bytes]") -> bool:
    try:
        return bool(c.ping())
    except redis.ConnectionError:
        return False


def test_a_condition_wait_takes_the_lock_back_with_a_new_token(
    client: "redis.Redis[bytes]", name: str
) -> None:
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    cond = threading.Condition(lock)  # type: ignore[arg-type]
    with cond:
        before = lock.token
        assert not cond.wait(0.05)
        after = lock.token
    assert before is not None and after is not None and after > before


# -- asyncio twins -------------------------------------------------------------------------


def test_asyncio_tokens(redis_url: str, name: str) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        try:
            lock = rlocks.asyncio.RLock(name, client=c, namespace=NAMESPACE)
            rw = rlocks.asyncio.RWLock(name, client=c, namespace=NAMESPACE)
            assert lock.token is None
            await lock.acquire()
            first = lock.token
            assert isinstance(first, int)
            await lock.acquire()
            assert lock.token == first
            await lock.release()
            got: List[Optional[int]] = []

            async def waiter() -> None:
                async with lock:
                    got.append(lock.token)
                assert lock.token is None

            task = asyncio.ensure_future(waiter())
            queue = keys_for(NAMESPACE, "rlock", name).queue
            for _ in range(1000):  # the other task queues on the server
                if await c.zcard(queue) == 1:
                    break
                await asyncio.sleep(0.01)
            assert lock.token == first  # another task's wait changes nothing here
            await lock.release()  # wakes the waiting task
            await asyncio.wait_for(task, 30)
            assert lock.token is None
            assert got[0] is not None and got[0] > first
            async with rw.write_lock:
                wt = rw.write_lock.token
                async with rw.read_lock:
                    rt = rw.read_lock.token
                    assert wt is not None and rt is not None and rt > wt > got[0]
            assert rw.write_lock.token is None and rw.read_lock.token is None
        finally:
            await c.aclose()

    asyncio.run(main())


# -- the README's example ------------------------------------------------------------------


def test_the_fencing_example_runs(redis_url: str) -> None:
    env = dict(os.environ, RLOCKS_URL=redis_url)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "refused the stale write" in done.stdout, done.stdout
