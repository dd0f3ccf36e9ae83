"""The Lua scripts, one call at a time, against a real Redis: every path of each header's
contract (``rlocks/_engine/lua/*.lua``), the replies, the keys left behind, and the
commands an uncontended acquire and release run.

Calls are built by the engine's own specs (``primitive.LockSpec`` / ``PermitSpec``), so
the KEYS and ARGV are those the engine sends; owners are made-up ids of made-up
processes (``host:pid:nonce:serial``) so one test plays several threads.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any, List

import pytest
import redis

import rlocks
from rlocks._engine import scripts
from rlocks._engine.scripts import DONE, GRANTED, LOST, MISMATCH, OVER, UPGRADE, WAIT, Call, load
from rlocks._engine.state import force_release
from rlocks.server import TemporaryRedisServer

from .conftest import NAMESPACE, without_counters

A, B, C = "h:1:aa:1", "h:2:bb:1", "h:3:cc:1"  # three owners of three processes


def _lock(client: Any, name: str, **kw: Any) -> Any:
    return rlocks.RLock(name, client=client, namespace=NAMESPACE, **kw)


def acquire(p: Any, owner: str, expect: int = 0, entry_ms: int = 0) -> Any:
    return p._spec.acquire(p, owner, expect, entry_ms)(p.client)


def release(p: Any, owner: str, expect: int = 1) -> Any:
    return p._spec.release(p, owner, expect)(p.client)


def leave(p: Any, owner: str) -> Any:
    return p._spec.leave(p, owner)(p.client)


def queue(client: Any, p: Any) -> List[str]:
    return [m.decode().split(":", 2)[2] for m in client.zrange(p._keys.queue, 0, -1)
            if not m.startswith(b"~")]


# -- the files ---------------------------------------------------------------------------------


def test_every_script_has_a_header_contract() -> None:
    folder = resources.files("rlocks._engine").joinpath("lua")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".lua"))
    ops = {f"{k}_{op}.lua" for k in ("rlock", "rw", "sem") for op in ("acquire", "release", "renew")}
    assert ops | {"lib.lua", "leave.lua", "force_release.lua"} <= set(names)
    for name in names:
        lines = folder.joinpath(name).read_text("utf-8").splitlines()
        assert lines[0].startswith(f"-- {name[:-4]}:"), name
        if name.endswith("_lib.lua") or name == "lib.lua":
            continue
        header = "\n".join(line for line in lines[:next(
            i for i, line in enumerate(lines) if line and not line.startswith("--"))])
        assert "KEYS[1]" in header and "ARGV[" in header, name
        assert "Repl" in header or "Return" in header, name


def test_noscript_is_recovered(client: Any, name: str) -> None:
    lock = _lock(client, name)
    client.script_flush()
    reply = acquire(lock, A)
    assert reply.status == GRANTED and reply.a == 1 and reply.b > 0
    assert release(lock, A).status == GRANTED
    assert without_counters(client.keys(f"{NAMESPACE}:*{name}*")) == []


def test_decode_accepts_the_contract_and_nothing_else() -> None:
    assert scripts.decode(b"1 1 1764030000123456") == scripts.Reply(1, 1, 1764030000123456)
    assert scripts.decode("0 250") == scripts.Reply(0, 250)
    assert scripts.decode(b"1 0\nh:1:a:1\nh:2:b:3").woken == ("h:1:a:1", "h:2:b:3")
    for bad in (None, b"", b"9 0", b"x 1", b"1 2 3 4", 7, [1, 2]):
        with pytest.raises(rlocks.RLocksError, match="unexpected"):
            scripts.decode(bad, "rlock_acquire")


# -- rlock -------------------------------------------------------------------------------------


def test_rlock_fresh_reentry_and_release(client: Any, name: str) -> None:
    lock = _lock(client, name, ttl=10)
    first = acquire(lock, A)
    assert first.status == GRANTED and first.a == 1 and first.b > 0
    again = acquire(lock, A, expect=1)
    assert (again.status, again.a, again.b) == (GRANTED, 2, 0)  # a re-entry: no new token
    assert client.hgetall(lock._keys.hash) == {A.encode(): b"2", b"#t": b"10000"}  # #t: the ttl
    assert 9000 < client.pttl(lock._keys.hash) <= 10000
    assert release(lock, A, 2) == scripts.Reply(GRANTED, 1)
    assert release(lock, A, 1) == scripts.Reply(GRANTED, 0)
    assert not client.exists(lock._keys.hash)


def test_rlock_resent_calls_are_recognised(client: Any, name: str) -> None:
    lock = _lock(client, name)
    token = acquire(lock, A).b
    resent = acquire(lock, A)  # the same fresh acquire again: applied already
    assert resent.status == DONE and resent.a == 1 and resent.b > token  # a token anew
    assert acquire(lock, A, 1).a == 2
    assert acquire(lock, A, 1) == scripts.Reply(DONE, 2)  # the re-entry again
    assert release(lock, A, 2).a == 1
    assert release(lock, A, 2) == scripts.Reply(DONE, 1)  # the inner release again
    assert release(lock, A, 1).a == 0
    assert release(lock, A, 1).status == LOST  # released, or lost: the caller decides


def test_rlock_reentry_of_a_lost_hold_is_refused(client: Any, name: str) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    client.delete(lock._keys.hash)
    assert acquire(lock, A, 1).status == LOST
    assert not client.exists(lock._keys.hash)


def test_rlock_lease_is_never_shortened(client: Any, name: str) -> None:
    long = _lock(client, name, ttl=60)
    short = _lock(client, name, ttl=1)
    acquire(long, A)
    assert acquire(short, A, 1).status == GRANTED
    assert client.pttl(long._keys.hash) > 50000
    assert short._spec.renew(short, A, 1000)(client).status == GRANTED
    assert client.pttl(long._keys.hash) > 50000


def test_rlock_waiters_queue_in_arrival_order_and_only_the_head_is_granted(
    client: Any, name: str
) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    assert acquire(lock, B, entry_ms=5000).status == WAIT
    assert acquire(lock, C, entry_ms=5000).status == WAIT
    assert queue(client, lock) == [B, C]
    freed = release(lock, A)
    assert freed.woken == (B,)  # a hint to the head only
    assert acquire(lock, C, entry_ms=5000).status == WAIT  # the head is B's
    assert acquire(lock, B, entry_ms=5000).status == GRANTED
    assert queue(client, lock) == [C]
    assert release(lock, B).woken == (C,)
    assert acquire(lock, C, entry_ms=5000).status == GRANTED
    assert not client.exists(lock._keys.queue)  # the last waiter served: no queue key
    release(lock, C)
    assert without_counters(client.keys(f"{NAMESPACE}:*{name}*")) == []


def test_rlock_just_trying_queues_nobody(client: Any, name: str) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    busy = acquire(lock, B)  # entry lease 0: a try
    assert busy.status == WAIT and busy.a > 0 and not client.exists(lock._keys.queue)


def test_rlock_a_dead_head_drops_out_after_its_entry_lease(client: Any, name: str) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    acquire(lock, B, entry_ms=50)  # B dies: it never asks again
    acquire(lock, C, entry_ms=5000)
    release(lock, A)
    assert acquire(lock, C, entry_ms=5000).status == WAIT  # B is the head while it lasts
    threading.Event().wait(0.1)
    assert acquire(lock, C, entry_ms=5000).status == GRANTED


def test_rlock_leave_wakes_the_next_waiter_when_the_lock_is_free(client: Any, name: str) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    acquire(lock, B, entry_ms=5000)
    acquire(lock, C, entry_ms=5000)
    release(lock, A)
    left = leave(lock, B)  # the woken head gives up
    assert left.status == GRANTED and left.woken == (C,)
    assert leave(lock, B).status == WAIT  # not queued any more
    assert acquire(lock, C, entry_ms=5000).status == GRANTED


def test_rlock_unfair_lets_anyone_in_during_the_patience(client: Any, name: str) -> None:
    lock = _lock(client, name, fair=False)
    acquire(lock, A)
    acquire(lock, B, entry_ms=5000)
    assert release(lock, A).woken == (B,)
    assert acquire(lock, C).status == GRANTED  # barging, within B's patience
    release(lock, C)
    threading.Event().wait(0.15)  # B's patience (100 ms) ends
    assert acquire(lock, C).status == WAIT  # now B has it first
    assert acquire(lock, B, entry_ms=5000).status == GRANTED


# -- rw ----------------------------------------------------------------------------------------


def test_rw_readers_share_and_a_writer_waits_for_them(client: Any, name: str) -> None:
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    r, w = rw.read_lock, rw.write_lock
    assert acquire(r, A).status == GRANTED and acquire(r, B).status == GRANTED
    assert acquire(w, C, entry_ms=5000).status == WAIT
    assert acquire(r, "h:4:dd:1", entry_ms=5000).status == WAIT  # behind the writer
    assert release(r, A).woken == ()
    assert release(r, B).woken == (C,)
    assert acquire(w, C, entry_ms=5000).status == GRANTED
    assert release(w, C).woken == ("h:4:dd:1",)


def test_rw_upgrade_refused_and_downgrade_allowed(client: Any, name: str) -> None:
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    r, w = rw.read_lock, rw.write_lock
    acquire(r, A)
    assert acquire(w, A, entry_ms=5000).status == UPGRADE
    release(r, A)
    acquire(w, B)
    acquire(r, C, entry_ms=5000)  # queued behind the writer
    assert acquire(r, B).status == GRANTED  # the writer reads too, whoever waits
    release(w, B)
    assert release(r, B).status == GRANTED


# -- semaphores --------------------------------------------------------------------------------


def test_sem_permits_value_and_rest(client: Any, name: str) -> None:
    sem = rlocks.BoundedSemaphore(name, 2, client=client, namespace=NAMESPACE)
    assert acquire(sem, A).status == GRANTED and acquire(sem, B).status == GRANTED
    assert acquire(sem, C, entry_ms=5000).status == WAIT
    call = sem._spec.release_permits(sem, A, 1, ((A, 1, 1),))
    freed = call(client)
    assert freed.status == GRANTED and freed.a == 1 and freed.woken == (C,)
    over = sem._spec.release_permits(sem, A, 1, ())(client)  # nobody's permit
    assert over.status == OVER
    assert acquire(sem, C, entry_ms=5000).status == GRANTED
    for owner in (B, C):
        sem._spec.release_permits(sem, owner, 1, ((owner, 1, 1),))(client)
    assert without_counters(client.keys(f"{NAMESPACE}:*{name}*")) == []  # at rest: no key


def test_sem_another_value_or_kind_is_a_mismatch(client: Any, name: str) -> None:
    two = rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE)
    three = rlocks.Semaphore(name, 3, client=client, namespace=NAMESPACE)
    bounded = rlocks.BoundedSemaphore(name, 2, client=client, namespace=NAMESPACE)
    acquire(two, A)
    assert acquire(three, B) == scripts.Reply(MISMATCH, 2, 0)
    assert acquire(bounded, B) == scripts.Reply(MISMATCH, 2, 0)
    two._spec.release_permits(two, A, 1, ((A, 1, 1),))(client)


def test_sem_an_unbounded_value_grows_and_persists(client: Any, name: str) -> None:
    sem = rlocks.Semaphore(name, 1, client=client, namespace=NAMESPACE)
    assert sem._spec.release_permits(sem, A, 1, ())(client).a == 2  # nobody's: value 2
    assert client.hget(sem._keys.hash, "#v") == b"2" and client.pttl(sem._keys.hash) == -1
    assert acquire(sem, A).status == GRANTED and acquire(sem, B).status == GRANTED


def test_sem_a_lost_owner_is_refused_its_next_permit(client: Any, name: str) -> None:
    sem = rlocks.Semaphore(name, 3, client=client, namespace=NAMESPACE)
    acquire(sem, A)
    client.delete(sem._keys.hash, sem._keys.leases)
    assert acquire(sem, A, 1).status == LOST
    released = sem._spec.release_permits(sem, A, 1, ((A, 1, 1),))(client)
    assert released.status == LOST and released.a == 1


# -- others ------------------------------------------------------------------------------------


def test_force_release_ends_every_hold_and_wakes_the_waiters(client: Any, name: str) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    acquire(lock, B, entry_ms=5000)
    forced = force_release(client, NAMESPACE, "rlock", name)
    assert forced.released and forced.handed == 1
    assert not client.exists(lock._keys.hash)
    assert not force_release(client, NAMESPACE, "rlock", name + "-none").released


def test_the_uncontended_pair_runs_seven_commands(name: str) -> None:
    """The early exit (docs/design/core.md): EXISTS, INCR, HSET, PEXPIRE for the grant;
    HGET, DEL, EXISTS for the release. Counted with the commandstats of a server of its
    own (the suite's is shared with other tests' renewers)."""
    with TemporaryRedisServer() as server:
        own = redis.Redis(port=server.port)
        lock = _lock(own, name)
        acquire(lock, A)
        release(lock, A)  # the scripts are loaded, the slot's counter exists
        own.config_resetstat()
        acquire(lock, A)
        release(lock, A)
        stats = own.info("commandstats")
        own.close()
    nested = {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items()
              if k != "cmdstat_evalsha" and not k.startswith(("cmdstat_config", "cmdstat_info"))}
    assert nested == {"exists": 2, "incr": 1, "hset": 1, "pexpire": 1, "hget": 1, "del": 1}


def test_deadlock_holders_reads_holds_and_the_place_ahead(client: Any, name: str) -> None:
    lock = _lock(client, name)
    acquire(lock, A)
    acquire(lock, B, entry_ms=5000)
    acquire(lock, C, entry_ms=5000)
    holders = load("deadlock_holders")
    k = lock._keys
    call = Call(holders, (k.hash, k.queue, k.leases), ("rlock", C))
    holds, ahead = client.execute_command(*call.command(sha=False))
    assert [h.decode() for h in holds] == [A]
    assert ahead[0].decode() == B and ahead[1] == b"x"


def test_concurrent_acquires_grant_exactly_one(client: Any, name: str) -> None:
    lock = _lock(client, name)
    replies: List[Any] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        c = redis.Redis(connection_pool=client.connection_pool)
        barrier.wait()
        replies.append(lock._spec.acquire(lock, f"h:{i}:x:1", 0, 0)(c))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status for r in replies) == [WAIT] * 7 + [GRANTED]
