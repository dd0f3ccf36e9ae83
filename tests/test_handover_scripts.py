"""The queue-and-hand-over scripts (rlocks/_engine/lua): FIFO queue and hand-over.

Each script is called directly (EVALSHA of its EVAL form with queue_lib.lua in front, as the
loader builds it, without op_lib.lua: these tests send no op ids).
Most tests pass an explicit "now" (ARGV[1]) so lease expiry is driven without sleeping; a
few use server TIME ('') with tiny leases and wait for state. The model-based tests run
random interleavings of acquire / release / leave / renew / time passing against a plain
Python model of the queue semantics (docs/design/handover.md) and compare every reply
and the stored state after every step.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlocks
from rlocks._engine import scripts
from rlocks._engine.keys import fence_key

from .conftest import NAMESPACE, snapshot

LUA = Path(rlocks.__file__).parent / "_engine" / "lua"
PUB = "PUBLISH"
ELEASE = 2000
T0 = 1_800_000_000_000  # a fixed "now" (server ms) far from real time is fine: see _Prim


def _source(name: str) -> str:
    return scripts.eval_form(name, ("queue_lib",))


_scripts: Dict[str, Any] = {}


def _run(client: "redis.Redis[bytes]", name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    script = _scripts.get(name)
    if script is None:
        script = _scripts[name] = client.register_script(_source(name))
    return script(keys=list(keys), args=list(args), client=client)


def _norm(raw: Any) -> List[Any]:
    """A queue script's text reply, read by the engine's own decoder, as the list these
    tests compare whole: ``[status, value, aux, wakes]``, then ``items`` when there are
    any or a token, then the token when there is one."""
    reply = scripts.decode(raw)
    out: List[Any] = [reply.status, reply.value, reply.aux, list(reply.wakes)]
    if reply.items or reply.token:
        out.append(list(reply.items))
    if reply.token:
        out.append(reply.token)
    return out


def _plain(reply: Any) -> Any:
    """``reply`` without its fencing tokens (the sixth element, the third field of a
    ``g`` line): the tests here check the queue; tests/test_fencing.py checks tokens."""
    if not isinstance(reply, list) or len(reply) < 4 or not isinstance(reply[3], list):
        return reply
    wakes = [" ".join(w.split(" ")[:2]) if w.startswith("g ") else w for w in reply[3]]
    out = [*reply[:3], wakes, *reply[4:6]]
    if len(out) == 6:
        out = out[:4] if out[4] == [] else out[:5]
    return out


class _Prim:
    """One primitive's six keys and script calls. ``now`` None = server TIME."""

    def __init__(
        self,
        client: "redis.Redis[bytes]",
        kind: str,
        name: str,
        fair: int = 1,
        elease: int = ELEASE,
        value: int = 3,
        bounded: int = 1,
        command: str = PUB,
        namespace: str = NAMESPACE,
    ) -> None:
        self.client, self.kind, self.fair, self.elease = client, kind, fair, elease
        self.value, self.bounded, self.command = value, bounded, command
        tag = f"{namespace}:{{{name}}}"
        self.keys = [f"{tag}:{part}" for part in ("holds", "leases", "queue", "entries",
                                                   "times", "wake")]
        self.keys.append(fence_key(self.keys[0]))

    def ctx(self, now: Optional[int]) -> List[Any]:
        head: List[Any] = ["" if now is None else now, self.command, self.fair, self.elease]
        if self.kind == "sem":
            head += [self.value, self.bounded]
        return head

    def call(self, op: str, now: Optional[int], *args: Any) -> Any:
        return _plain(self.raw(op, now, *args))

    def raw(self, op: str, now: Optional[int], *args: Any) -> Any:
        """The script's reply, fencing tokens included."""
        return _norm(_run(self.client, f"{self.kind}_{op}", self.keys, self.ctx(now) + list(args)))

    def holds(self) -> Dict[str, int]:
        raw = self.client.hgetall(self.keys[0])
        return {k.decode(): int(v) for k, v in raw.items() if not k.startswith(b"#")}

    def meta(self, field: str) -> Optional[str]:
        v = self.client.hget(self.keys[0], field)
        return None if v is None else v.decode()

    def queue(self) -> List[str]:
        return [m.decode() for m in self.client.zrange(self.keys[2], 0, -1)]

    def markers(self) -> List[str]:
        return sorted(k.decode()[2:] for k in self.client.hkeys(self.keys[3]) if k.startswith(b"g:"))

    def lease_end(self, field: str) -> Optional[float]:
        return self.client.zscore(self.keys[1], field)


@pytest.fixture
def rl(client: "redis.Redis[bytes]", name: str) -> _Prim:
    return _Prim(client, "rlock", name)


@pytest.fixture
def rw(client: "redis.Redis[bytes]", name: str) -> _Prim:
    return _Prim(client, "rw", name)


@pytest.fixture
def sem(client: "redis.Redis[bytes]", name: str) -> _Prim:
    return _Prim(client, "sem", name)


# rlock acquire: owner, entry, ttl, add, reentry, queue
def _racq(p: _Prim, now: Optional[int], owner: str, add: int = 1, reentry: int = 0,
          queue: int = 1, ttl: int = 30000) -> Any:
    return p.call("acquire", now, owner, owner.split(".")[0], ttl, add, reentry, queue)


# --- RLock ---------------------------------------------------------------------------


def test_rlock_fifo_handover_names_the_granted_waiter(
    client: "redis.Redis[bytes]", rl: _Prim
) -> None:
    sub = client.pubsub()
    sub.psubscribe(rl.keys[5] + ":*")  # every process's channel
    assert sub.get_message(timeout=5)["type"] == "psubscribe"  # type: ignore[index]
    assert _racq(rl, T0, "p1.a") == [1, 1, 30000, []]
    assert _racq(rl, T0, "p2.a") == [3, 1, 30000, []]
    assert _racq(rl, T0 + 1, "p3.a") == [3, 2, 29999, []]
    # p1 releases: the lock goes to p2 in the same script, with the short entry lease.
    assert rl.call("release", T0 + 2, "p1.a", 1) == [1, 0, 0, ["g p2.a"]]
    assert rl.holds() == {"p2.a": 1}
    # (its short lease ends with its entry, queued at T0: never later than that)
    assert rl.lease_end("p2.a") == T0 + ELEASE
    assert rl.queue() == ["p3"]
    assert rl.markers() == ["p2.a"]
    message = sub.get_message(timeout=5)
    assert message is not None and _plain([0, 0, 0, [message["data"].decode()]])[3] == [
        "g p2.a"]
    assert message["channel"].decode() == rl.keys[5] + ":p2"  # on p2's own channel
    # Only the granted process wakes: nothing else was published.
    assert sub.get_message(timeout=0.2) is None
    sub.close()
    # p2's renewer adopts the grant and extends it to the full ttl.
    assert rl.call("renew", T0 + 3, 30000, "h", "p2.a", "a", "p2.a", "e", "p3") == [
        1, 3, 0, [], [1, 1, 1]]
    assert rl.lease_end("p2.a") == T0 + 3 + 30000
    assert rl.markers() == []


def test_rlock_reentry_is_granted_at_once_and_refused_when_the_hold_is_gone(
    client: "redis.Redis[bytes]", name: str
) -> None:
    rl = _Prim(client, "rlock", name, elease=60000)  # p2's entry outlives p1's hold
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[0] == 3
    # re-entry while another process waits: granted, never queued
    assert _racq(rl, T0, "p1.a", add=2, reentry=1) == [1, 3, 30000, []]
    # exact-count release keeps the lock
    assert rl.call("release", T0, "p1.a", 2) == [1, 1, 0, []]
    assert rl.holds() == {"p1.a": 1}
    # re-entry by an owner that does not hold: refused, nothing changed
    before = snapshot(rl.client)
    assert _racq(rl, T0, "p3.a", reentry=1) == [-1, 0, 0, []]
    assert snapshot(rl.client) == before
    # the hold ends unnoticed (lease over): its owner's re-entry is refused and the
    # waiter is handed the lock on the way
    assert _racq(rl, T0 + 30000, "p1.a", reentry=1) == [-1, 0, 0, ["g p2.a"]]
    assert rl.holds() == {"p2.a": 1}


def test_rlock_release_of_more_than_held_and_not_owner(rl: _Prim) -> None:
    assert _racq(rl, T0, "p1.a", add=5)[:2] == [1, 5]
    assert rl.call("release", T0, "p2.a", 1) == [-1, 0, 0, []]
    assert rl.call("release", T0, "p1.a", 9) == [1, 0, 0, []]  # more than held: all
    assert rl.holds() == {}
    assert rl.client.exists(*rl.keys[:5]) == 0


def test_rlock_try_does_not_queue_and_fair_acquirer_does_not_barge(
    client: "redis.Redis[bytes]", name: str
) -> None:
    rl = _Prim(client, "rlock", name, elease=60000)
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a", queue=0) == [0, 30000, 0, []]
    assert rl.queue() == []
    assert _racq(rl, T0, "p2.a")[0] == 3
    # p1's hold expires; nobody released. A fair newcomer still queues behind p2, and
    # its call hands the lock to p2 on the way (whose short lease ends with its entry).
    assert _racq(rl, T0 + 30000, "p3.a") == [3, 1, 30000, ["g p2.a"]]
    assert rl.holds() == {"p2.a": 1}


def test_rlock_expired_entries_are_skipped(rl: _Prim) -> None:
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[0] == 3
    assert _racq(rl, T0 + 1000, "p3.a")[0] == 3
    # p2 dies while queued: its entry is not renewed; p3 renews its own.
    assert rl.call("renew", T0 + 1900, 30000, "e", "p3")[4] == [1]
    assert rl.call("release", T0 + 2500, "p1.a", 1) == [1, 0, 0, ["g p3.a"]]
    assert rl.queue() == []


def test_rlock_grant_to_a_dead_process_is_revoked_after_the_short_lease(rl: _Prim) -> None:
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[0] == 3
    assert _racq(rl, T0, "p3.a")[0] == 3
    assert rl.call("release", T0, "p1.a", 1)[3] == ["g p2.a"]
    # p2 died before it noticed: nothing adopts the grant. Just before the short lease
    # ends p3 still waits; at its end p3 is handed the lock by whatever runs next.
    assert rl.call("renew", T0 + ELEASE - 1, 30000, "e", "p3") == [1, 1, 0, [], [1]]
    assert rl.call("renew", T0 + ELEASE, 30000, "e", "p3") == [1, 1, 0, ["g p3.a"], [1]]
    assert rl.holds() == {"p3.a": 1}


def test_a_grant_to_a_waiter_that_died_while_queued_ends_with_its_entry(rl: _Prim) -> None:
    """A waiter killed while queued delays the next holder one entry lease at most: a
    grant made just before its entry would have ended does not start a fresh lease."""
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[0] == 3
    assert _racq(rl, T0, "p3.a")[0] == 3
    # p2 dies at once (its entry is never renewed); p3 lives and renews its own.
    assert rl.call("renew", T0 + ELEASE - 10, 30000, "e", "p3") == [1, 1, 0, [], [1]]
    assert rl.call("release", T0 + ELEASE - 1, "p1.a", 1)[3] == ["g p2.a"]
    # The grant's end, as its marker has it. (Not the hold's own in the lease set: that
    # key's real expiry is its latest end less this call's "now", 1 ms here, so it may
    # be gone before a read; the marker's key lives until p3's entry ends.)
    assert rl.client.zscore(rl.keys[4], "g:p2.a") == T0 + ELEASE
    # (a fresh short lease would keep p3 waiting until T0 + 2 * ELEASE - 1)
    assert rl.call("renew", T0 + ELEASE, 30000, "e", "p3") == [1, 1, 0, ["g p3.a"], [1]]
    assert rl.holds() == {"p3.a": 1}


def test_rlock_lost_wakeup_recheck_adopts_without_counting_twice(rl: _Prim) -> None:
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[0] == 3
    assert rl.call("release", T0, "p1.a", 1)[3] == ["g p2.a"]
    # p2's waiter missed the wake-up and asks again: it is told it holds the lock.
    assert _racq(rl, T0 + 10, "p2.a") == [2, 1, 30000, []]
    assert rl.holds() == {"p2.a": 1}
    assert rl.markers() == []
    # a second re-check is an ordinary refusal-free re-entry question: nothing handed now
    assert _racq(rl, T0 + 10, "p2.a", reentry=1)[:2] == [1, 2]


def test_rlock_leave(rl: _Prim) -> None:
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[0] == 3
    assert _racq(rl, T0, "p3.a")[0] == 3
    # p3's waiter a times out while its thread b waits too: re-point, keep the place
    assert rl.call("leave", T0, "p3.a", "p3", "p3.b", 1) == [1, 2, 0, []]
    assert rl.call("leave", T0, "p3.a", "p3", "") == [-1, 0, 0, []]
    # p2 times out: leaves in one step
    assert rl.call("leave", T0, "p2.a", "p2", "") == [1, 0, 0, []]
    assert rl.queue() == ["p3"]
    # the hand-over raced p3.b's time-out: its leave passes the lock on (here: freed)
    assert rl.call("release", T0, "p1.a", 1)[3] == ["g p3.b"]
    assert _racq(rl, T0, "p4.a")[0] == 3
    assert rl.call("leave", T0, "p3.b", "p3", "") == [4, 1, 0, ["g p4.a"]]
    assert rl.holds() == {"p4.a": 1}


def test_rlock_unfair_barges_but_wakes_then_hands_over(client: "redis.Redis[bytes]",
                                                       name: str) -> None:
    p = _Prim(client, "rlock", name, fair=0)
    assert _racq(p, T0, "p1.a")[0] == 1
    assert _racq(p, T0, "p2.a")[0] == 3
    # release wakes p2 without granting; a barging p3 takes the free lock
    assert p.call("release", T0, "p1.a", 1) == [1, 0, 0, ["w p2.a"]]
    assert _racq(p, T0, "p3.a") == [1, 1, 30000, []]
    # p2 lost once: it is re-queued in its place and the next release hands over to it
    assert _racq(p, T0, "p2.a") == [3, 1, 30000, []]
    assert p.call("release", T0, "p3.a", 1) == [1, 0, 0, ["g p2.a"]]
    assert p.holds() == {"p2.a": 1}


@pytest.mark.parametrize("kind", ["rlock", "sem"])
def test_unfair_waiter_is_passed_over_within_its_patience_then_handed_over(
    client: "redis.Redis[bytes]", name: str, kind: str
) -> None:
    p = _Prim(client, kind, name, fair=-100, value=1)

    def acq(now: int, who: str) -> Any:
        if kind == "sem":
            return p.call("acquire", now, who, who, who.split(".")[0], 30000, 1, 1)
        return _racq(p, now, who)

    def rel(now: int, who: str) -> Any:
        if kind == "sem":
            return p.call("release", now, 1, who, 1)[3]
        return p.call("release", now, who, 1)[3]

    assert acq(T0, "p1.a")[0] == 1
    assert acq(T0, "p2.a")[0] == 3
    # the release wakes p2 and starts its 100 ms patience; p1 barges back in first
    assert rel(T0, "p1.a") == ["w p2.a"]
    assert acq(T0, "p1.a")[:2] == [1, 1]
    # p2 lost the race: queued in its place, told to ask again when its patience ends
    assert acq(T0 + 10, "p2.a") == [3, 1, 90, []]
    # within the patience a release neither grants p2 nor wakes it again: the barger
    # runs section after section
    for now in (T0 + 20, T0 + 60, T0 + 99):
        assert rel(now, "p1.a") == []
        assert acq(now, "p1.a")[:2] == [1, 1]
    assert p.queue() == ["p2"]
    # the first release after it hands over to p2; p1 now queues behind
    assert rel(T0 + 100, "p1.a") == ["g p2.a"]
    assert p.holds() == {"p2.a": 1}
    assert acq(T0 + 100, "p1.a")[0] == 3


def test_real_server_time_and_tiny_leases(client: "redis.Redis[bytes]", name: str) -> None:
    """ARGV[1] = '' reads redis TIME: a dead holder's tiny lease ends on the real clock."""
    p = _Prim(client, "rlock", name, elease=5000)
    assert _racq(p, None, "p1.a", ttl=50)[0] == 1
    assert _racq(p, None, "p2.a")[0] == 3
    deadline = time.monotonic() + 10
    reply = None
    while time.monotonic() < deadline:
        reply = _racq(p, None, "p2.a")  # the waiter's re-check after the hinted ms
        if reply[0] == 1:
            break
        assert reply[0] == 3 and 0 < reply[2] <= 50
        time.sleep(reply[2] / 1000)
    assert reply is not None and reply[:2] == [1, 1]
    assert 0 < client.pttl(p.keys[0]) <= 30000


def test_spublish_is_used_when_asked(client: "redis.Redis[bytes]", name: str) -> None:
    version = client.info("server")["redis_version"]
    if int(version.split(".")[0]) < 7:
        pytest.skip(f"sharded pub/sub needs redis-server >= 7.0; this one is {version}")
    p = _Prim(client, "rlock", name, command="SPUBLISH")
    assert _racq(p, T0, "p1.a")[0] == 1
    assert _racq(p, T0, "p2.a")[0] == 3
    assert p.call("release", T0, "p1.a", 1)[3] == ["g p2.a"]


# --- RWLock --------------------------------------------------------------------------


def _wacq(p: _Prim, now: int, owner: str, side: str, add: int = 1, reentry: int = 0,
          queue: int = 1, ttl: int = 30000) -> Any:
    return p.call("acquire", now, owner, owner.split(".")[0], side, ttl, add, reentry, queue)


def test_rw_fifo_groups_readers_and_never_starves_a_side(rw: _Prim) -> None:
    assert _wacq(rw, T0, "p1.a", "w")[0] == 1
    assert _wacq(rw, T0, "p2.a", "r")[:2] == [3, 1]
    assert _wacq(rw, T0, "p3.a", "r")[:2] == [3, 2]
    assert _wacq(rw, T0, "p4.a", "w")[:2] == [3, 3]
    assert _wacq(rw, T0, "p5.a", "r")[:2] == [3, 4]
    # writer out: both readers queued before the next writer go, together
    assert rw.call("release", T0, "p1.a", "w", 1) == [1, 0, 0, ["g p2.a", "g p3.a"]]
    # a new reader queues behind the waiting writer (no writer starvation)
    assert _wacq(rw, T0, "p6.a", "r")[:2] == [3, 3]
    assert rw.call("release", T0, "p2.a", "r", 1) == [1, 0, 0, []]
    assert rw.call("release", T0, "p3.a", "r", 1) == [1, 0, 0, ["g p4.a"]]
    # writer out: the readers behind it go (no reader starvation)
    assert rw.call("release", T0, "p4.a", "w", 1) == [1, 0, 0, ["g p5.a", "g p6.a"]]
    assert rw.holds() == {"r:p5.a": 1, "r:p6.a": 1}
    assert rw.meta("#nr") == "2" and rw.meta("#w") is None


def test_rw_reentry_downgrade_and_upgrade(rw: _Prim) -> None:
    assert _wacq(rw, T0, "p1.a", "r")[0] == 1
    assert _wacq(rw, T0, "p2.a", "w")[0] == 3
    # re-entering a held read side while a writer waits: at once
    assert _wacq(rw, T0, "p1.a", "r", reentry=1)[:2] == [1, 2]
    # upgrade refused, distinct reply, nothing changed
    before = snapshot(rw.client)
    assert _wacq(rw, T0, "p1.a", "w") == [-2, 0, 0, []]
    assert snapshot(rw.client) == before
    assert _wacq(rw, T0, "p1.a", "w", reentry=1) == [-1, 0, 0, []]
    assert rw.call("release", T0, "p1.a", "r", 2) == [1, 0, 0, ["g p2.a"]]
    # downgrade: the writer takes the read side at once, though a reader is queued
    assert _wacq(rw, T0, "p3.a", "r")[0] == 3
    # p2 recorded its write grant without adopting it: asking for the read side, as the
    # holder of the write side (reentry + 2), adopts it too
    assert rw.markers() == ["p2.a"]
    assert _wacq(rw, T0, "p2.a", "r", reentry=2)[:2] == [1, 1]
    assert rw.markers() == []
    assert rw.call("release", T0, "p2.a", "w", 1) == [1, 0, 0, ["g p3.a"]]
    assert rw.holds() == {"r:p2.a": 1, "r:p3.a": 1}


def test_a_caller_whose_entry_the_walk_for_those_ahead_grants_adopts_that_grant(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """A queued reader behind another asks again as the writer's lease has ended: the walk
    for those ahead grants both readers, the caller's own entry included. The caller
    adopts that grant (ADOPTED, one hold), never granted a second time (it counted two
    holds, its books one: its release left a hold behind, on a full ttl)."""
    rw = _Prim(client, "rw", name)
    assert _wacq(rw, T0, "p1.a", "w", ttl=1000)[0] == 1
    assert _wacq(rw, T0, "p2.a", "r")[:2] == [3, 1]
    assert _wacq(rw, T0, "p3.a", "r")[:2] == [3, 2]
    assert _wacq(rw, T0 + 1000, "p3.a", "r") == [2, 1, 30000, ["g p2.a", "g p3.a"]]
    assert rw.holds() == {"r:p2.a": 1, "r:p3.a": 1}
    assert rw.markers() == ["p2.a"]
    sem = _Prim(client, "sem", name + "-sem", value=3)
    assert _sacq(sem, T0, "p1.a", 3, ttl=1000)[:2] == [1, 3]
    assert _sacq(sem, T0, "p2.a", 1)[:2] == [3, 1]
    assert _sacq(sem, T0, "p3.a", 1)[:2] == [3, 2]
    assert _sacq(sem, T0 + 1000, "p3.a", 1) == [2, 1, 30000, ["g p2.a", "g p3.a"]]
    assert sem.holds() == {"p2.a": 1, "p3.a": 1}
    assert sem.meta("#free") == "1"


@pytest.mark.parametrize("granted, asks", [("r", "w"), ("w", "r")])
def test_rw_a_grant_of_the_other_side_its_owner_never_recorded_is_given_back(
    rw: _Prim, granted: str, asks: str
) -> None:
    """A thread's wait for one side ended just as the hand-over granted it (its leave
    still on its way); its next call, for the other side and holding nothing, finds that
    grant: it is given back and handed on, and the call goes on as if it had not been
    there (no upgrade refusal for a read grant, no write hold kept under a read)."""
    assert _wacq(rw, T0, "p1.a", "w")[0] == 1
    assert _wacq(rw, T0, "p2.a", granted)[0] == 3
    assert _wacq(rw, T0, "p3.a", "w")[0] == 3
    assert rw.call("release", T0, "p1.a", "w", 1)[3] == ["g p2.a"]
    # the side's own adoption item, for the other side, leaves the grant alone
    assert rw.call("renew", T0, 30000, "a" + asks, "p2.a")[4] == [-1]
    assert rw.markers() == ["p2.a"]
    # p2's next call, for the other side: the grant goes to p3, p2 queues behind it
    assert _wacq(rw, T0, "p2.a", asks) == [3, 1, ELEASE, ["g p3.a"]]
    assert rw.holds() == {"w:p3.a": 1}
    assert rw.markers() == ["p3.a"]


def test_rw_leaving_writer_lets_readers_behind_it_in(rw: _Prim) -> None:
    assert _wacq(rw, T0, "p1.a", "r")[0] == 1
    assert _wacq(rw, T0, "p2.a", "w")[0] == 3
    assert _wacq(rw, T0, "p3.a", "r")[0] == 3
    assert rw.call("leave", T0, "p2.a", "p2", "") == [1, 0, 0, ["g p3.a"]]
    # re-pointing a writer entry to a reader of the same process: granted at once
    assert _wacq(rw, T0, "p4.a", "w")[0] == 3
    assert rw.call("leave", T0, "p4.a", "p4", "p4.b", "r", 1) == [1, 0, 0, ["g p4.b"]]


# --- Semaphore -----------------------------------------------------------------------


def _sacq(p: _Prim, now: int, waiter: str, take: int = 1, queue: int = 1,
          ttl: int = 30000) -> Any:
    """Permits are the taking thread's: owner = waiter."""
    return p.call("acquire", now, waiter, waiter, waiter.split(".")[0], ttl, take, queue)


def test_sem_strict_fifo_and_batch_handover(sem: _Prim) -> None:
    assert _sacq(sem, T0, "p1.a", 3)[:2] == [1, 3]
    assert _sacq(sem, T0, "p2.a", 2)[:2] == [3, 1]
    assert _sacq(sem, T0, "p3.a", 1)[:2] == [3, 2]
    assert _sacq(sem, T0, "p4.a", 1)[:2] == [3, 3]
    # 1 back: the head wants 2, so it blocks those behind it (large requests never starve)
    assert sem.call("release", T0, 1, "p1.a", 1) == [1, 1, 0, []]
    # 2 more back: p2 (2 permits) and p3 (1) are granted in order, in this script
    assert sem.call("release", T0, 2, "p1.a", 2) == [1, 0, 0, ["g p2.a", "g p3.a"]]
    assert sem.holds() == {"p2.a": 2, "p3.a": 1}
    assert sem.meta("#free") == "0" and sem.meta("#held") == "3"


def test_sem_bounded_mismatch_and_not_held(client: "redis.Redis[bytes]", sem: _Prim) -> None:
    assert _sacq(sem, T0, "p1.a", 1)[:2] == [1, 1]
    before = snapshot(client)
    # 2 released by nobody's permit: 2 free + 1 held + 2 > 3 in circulation
    assert sem.call("release", T0, 2) == [-3, 0, 0, []]
    assert sem.call("release", T0, 2, "p1.a", 1, "p2.a", 1) == [-1, 2, 0, []]
    other = _Prim(client, "sem", sem.keys[0].split("{")[1].split("}")[0], value=4)
    with pytest.raises(redis.ResponseError, match="RLOCKS_SEM_MISMATCH 3 1"):
        other.call("acquire", T0, "p9", "p9.a", "p9", 30000, 1, 1)
    assert snapshot(client) == before


def test_sem_dead_holder_recovered_by_range_and_handed_over(
    client: "redis.Redis[bytes]", name: str
) -> None:
    sem = _Prim(client, "sem", name, elease=60000)
    assert _sacq(sem, T0, "p1.a", 2, ttl=10000)[:2] == [1, 2]
    assert _sacq(sem, T0, "p2.a", 1, ttl=30000)[:2] == [1, 1]
    assert _sacq(sem, T0, "p3.a", 2)[:2] == [3, 1]
    assert sem.call("renew", T0 + 9000, 30000, "h", "p2.a", "e", "p3")[4] == [1, 1]
    # p1 died: at its lease end the next script recovers its permits and hands over
    assert sem.call("renew", T0 + 10000, 30000, "h", "p2.a", "e", "p3") == [
        1, 2, 0, ["g p3.a"], [1, 1]]
    assert sem.holds() == {"p2.a": 1, "p3.a": 2}


def test_sem_unadopted_grant_to_a_live_holder_is_revoked(sem: _Prim) -> None:
    """An owner that already holds permits (long lease) and was handed more, but whose
    waiter never adopted them, gives the handed permits back at the short lease's end
    (owner and waiter differ here: the scripts allow permits recorded per process)."""
    assert _sacq(sem, T0, "p1.a", 2)[:2] == [1, 2]
    assert sem.call("acquire", T0, "p2", "p2.a", "p2", 30000, 1, 1)[:2] == [1, 1]
    assert sem.call("acquire", T0, "p2", "p2.b", "p2", 30000, 1, 1)[:2] == [3, 1]
    assert _sacq(sem, T0, "p3.a", 1)[:2] == [3, 2]
    assert sem.call("release", T0, 1, "p1.a", 1)[3] == ["g p2.b"]
    assert sem.holds() == {"p1.a": 1, "p2": 2}
    assert sem.call("renew", T0 + ELEASE - 1, 30000, "e", "p3")[:4] == [1, 1, 0, []]
    assert sem.call("renew", T0 + ELEASE, 30000, "h", "p2", "e", "p3")[3] == ["g p3.a"]
    assert sem.holds() == {"p1.a": 1, "p2": 1, "p3.a": 1}


def test_sem_grant_marker_outlives_the_queue_keys_expiry_while_holds_live(sem: _Prim) -> None:
    """The revocation above needs the grant's marker: the queue keys (entries, times)
    must not expire with it at its short lease's end while the owner's permits, which
    the grant joined, live on (real server time: key expiries are real). Before, they
    expired together and the handed permit stayed with an owner that never adopted it."""
    assert _sacq(sem, None, "p1.a", 2)[:2] == [1, 2]
    assert _sacq(sem, None, "p2.a", 1)[:2] == [1, 1]
    assert _sacq(sem, None, "p1.a", 1)[:2] == [3, 1]  # p1 holds 2 and waits for one more
    assert sem.call("release", None, 1, "p2.a", 1)[3] == ["g p1.a"]
    assert sem.markers() == ["p1.a"]
    for key in (sem.keys[3], sem.keys[4]):  # entries (the marker), times (its lease)
        assert sem.client.pttl(key) > 10 * ELEASE, key  # p1's permits: about 30 s


def test_sem_lease_ends_expire_with_the_holds_after_the_longest_hold_is_released(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """The lease ends (L) expire when the holds hash (H) does: after the hold with the
    latest end is released, H's expiry follows the remaining hold's end, and so must L's.
    (Before, L kept the released hold's end: once H expired with a dead holder's lease,
    the counters said "nothing held", nothing read L again, and its dead member made every
    refusal say "a hold ends in 1 ms" until L's own, longer end. Real server time.)"""
    sem = _Prim(client, "sem", name, value=2)
    assert _sacq(sem, None, "p1.a", 1, ttl=3000)[:2] == [1, 1]
    assert _sacq(sem, None, "p2.a", 1, ttl=60000)[:2] == [1, 1]
    assert sem.call("release", None, 1, "p2.a", 1)[:3] == [1, 1, 0]
    h, leases = client.pttl(sem.keys[0]), client.pttl(sem.keys[1])
    assert 0 < h <= 3000 and 0 < leases <= 3000, (h, leases)


def test_sem_lease_ends_persist_while_the_holds_do(
    client: "redis.Redis[bytes]", name: str
) -> None:
    """An unbounded Semaphore whose value grew keeps its holds hash (H) without expiry,
    since the state left once every lease ends is not the initial one; its lease ends (L)
    must live as long, or a holder that dies keeps its permit for ever: only a read of L
    finds its lease over. (Before, L expired with the last lease and H kept the dead
    holder's permit.)"""
    sem = _Prim(client, "sem", name, value=1, bounded=0)
    assert sem.call("release", None, 1)[:2] == [1, 2]  # nobody's permit: the value grows
    assert _sacq(sem, None, "p1.a", 1, ttl=200)[:2] == [1, 1]
    assert client.pttl(sem.keys[0]) == -1
    assert client.pttl(sem.keys[1]) == -1
    # The holder dies: its lease ends (on the server's clock, which only moves on), and
    # the next call gives its permit back.
    time.sleep(0.4)
    assert _sacq(sem, None, "p2.a", 2, queue=0)[:2] == [1, 2]
    assert sem.holds() == {"p2.a": 2}


def test_sem_release_of_an_owners_permits_leaves_its_grant_for_it_to_adopt(
    sem: _Prim,
) -> None:
    """Another thread may release an owner's permits before the owner recorded a grant it
    was just handed (threading lets any thread release). The release must not adopt that
    grant for it: the owner's renewal adopts it and keeps its permit (CI once saw the
    renewal find the grant gone, report the permit lost, and the pool leak it)."""
    assert _sacq(sem, T0, "p1.a", 2)[:2] == [1, 2]
    assert _sacq(sem, T0, "p2.a", 1)[:2] == [1, 1]
    assert _sacq(sem, T0, "p2.a", 1)[:2] == [3, 1]
    assert sem.call("release", T0, 1, "p1.a", 1)[3] == ["g p2.a"]
    assert sem.holds() == {"p1.a": 1, "p2.a": 2} and sem.markers() == ["p2.a"]
    # p1's thread releases one of p2's permits (the one p2 recorded): p2's grant stays
    assert sem.call("release", T0, 1, "p2.a", 1)[:2] == [1, 1]
    assert sem.holds() == {"p1.a": 1, "p2.a": 1} and sem.markers() == ["p2.a"]
    # p2 records its grant: its renewal adopts it and the permit stays p2's
    assert sem.call("renew", T0, 30000, "h", "p2.a", "a", "p2.a")[4] == [1, 1]
    assert sem.markers() == []
    assert sem.call("renew", T0 + ELEASE, 30000, "h", "p2.a")[4] == [1]
    assert sem.holds() == {"p1.a": 1, "p2.a": 1} and sem.meta("#free") == "1"


def test_sem_unadopted_grant_shrinks_with_the_owners_releases(sem: _Prim) -> None:
    """A grant never adopted is revoked at its short lease's end, but only for the
    permits its owner still has: those released meanwhile are not taken back twice."""
    assert _sacq(sem, T0, "p1.a", 2)[:2] == [1, 2]
    assert _sacq(sem, T0, "p2.a", 1)[:2] == [1, 1]
    assert _sacq(sem, T0, "p2.a", 2)[:2] == [3, 1]
    assert sem.call("release", T0, 2, "p1.a", 2)[3] == ["g p2.a"]
    assert sem.holds() == {"p2.a": 3}
    assert sem.call("release", T0, 2, "p2.a", 2)[:2] == [1, 2]
    assert sem.markers() == ["p2.a"]  # now for 1 permit, all p2 has left
    assert sem.call("renew", T0 + ELEASE, 30000, "h", "p2.a")[4] == [-1]
    assert sem.holds() == {} and sem.markers() == []  # all 3 free: p3 takes them below
    # a release of all an owner has left takes its grant with it
    assert _sacq(sem, T0 + ELEASE, "p3.a", 3)[:2] == [1, 3]
    assert _sacq(sem, T0 + ELEASE, "p4.a", 1)[:2] == [3, 1]
    assert sem.call("release", T0 + ELEASE, 1, "p3.a", 1)[3] == ["g p4.a"]
    assert sem.call("release", T0 + ELEASE, 1, "p4.a", 1)[:2] == [1, 1]
    assert sem.markers() == []


# --- a release that carries its process's next waiter's queueing ----------------------


def test_a_release_queues_its_process_s_next_waiter_behind_those_waiting(rl: _Prim) -> None:
    """Behind another process's entry: the lock goes to that entry, and the carried
    waiter is queued after it, with its lines on its list (b = 1), as its own acquire
    with queue = 2 would have; the items say so (3, position, hint, last token)."""
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[:2] == [3, 1]
    raw = rl.raw("release", T0 + 5, "p1.a", 1, "p1", "p1.b", 1)
    assert _plain(raw)[:4] == [1, 0, 0, ["g p2.a"]]
    status, position, hint, token = raw[4]
    # (the hint: to the end of p2's short lease, its entry's end)
    assert (status, position, hint) == (3, 1, ELEASE - 5)
    assert token == int(rl.client.hget(rl.keys[6], "last"))
    assert rl.queue() == ["p1"] and rl.holds() == {"p2.a": 1}
    entry = json.loads(rl.client.hget(rl.keys[3], "e:p1"))
    assert (entry["w"], entry["o"], entry["n"], entry["b"]) == ("p1.b", "p1.b", 1, 1)
    # p2's release hands it on to the carried waiter, through its list
    assert rl.call("release", T0 + 6, "p2.a", 1)[3] == ["g p1.b"]
    assert rl.client.lrange(f"{rl.keys[5]}:p1", 0, -1) != []


def test_a_release_with_nobody_else_waiting_hands_the_lock_to_the_carried_waiter(
    rl: _Prim,
) -> None:
    """Nobody queued: the carried waiter is granted at once, as its own acquire would be,
    with no entry written and taken out again (the queue's sequence never moves), and its
    list holds that grant's line alone (a line of an earlier place is gone)."""
    assert _racq(rl, T0, "p1.a")[0] == 1
    listed = f"{rl.keys[5]}:p1"
    rl.client.rpush(listed, "g p1.b 1")  # left from an earlier place
    raw = rl.raw("release", T0 + 5, "p1.a", 1, "p1", "p1.b", 2)
    assert _plain(raw)[:4] == [1, 0, 0, ["g p1.b"]]
    assert raw[4][:2] == [3, 0]  # queued, and granted at once (in wakes)
    # the queueing's token is below its grant's: the waiter can tell the grant is its own
    assert raw[4][3] < int(raw[3][0].split(" ")[2])
    assert rl.queue() == [] and rl.holds() == {"p1.b": 2} and rl.markers() == ["p1.b"]
    assert rl.client.hget(rl.keys[3], "#seq") is None
    assert rl.client.lrange(listed, 0, -1) == [raw[3][0].encode()]


def test_a_release_does_not_carry_a_waiter_whose_entry_or_grant_exists(rl: _Prim) -> None:
    """Its entry already queued (or a grant to it unadopted): nothing is queued, the
    items say 0, and the waiter asks itself."""
    assert _racq(rl, T0, "p1.a")[0] == 1
    assert _racq(rl, T0, "p2.a")[:2] == [3, 1]
    assert _racq(rl, T0, "p3.a")[:2] == [3, 2]
    raw = rl.raw("release", T0 + 5, "p1.a", 1, "p3", "p3.b", 1)
    assert raw[4] == [0, 0, 0, 0]
    assert rl.queue() == ["p3"]
    assert json.loads(rl.client.hget(rl.keys[3], "e:p3"))["w"] == "p3.a"
    # a release that holds nothing carries nothing either
    assert rl.call("release", T0 + 6, "p9.a", 1, "p9", "p9.b", 1) == [-1, 0, 0, []]
    assert rl.queue() == ["p3"]


def test_a_write_release_carries_a_reader_of_its_process(rw: _Prim) -> None:
    assert _wacq(rw, T0, "p1.a", "w")[0] == 1
    assert _wacq(rw, T0, "p2.a", "r")[:2] == [3, 1]
    raw = rw.raw("release", T0 + 5, "p1.a", "w", 1, "p1", "p1.b", "r", 1)
    # readers queued together are granted together: the carried one joins p2 at once
    assert _plain(raw)[:4] == [1, 0, 0, ["g p2.a", "g p1.b"]]
    assert raw[4][:2] == [3, 0]
    assert rw.holds() == {"r:p2.a": 1, "r:p1.b": 1}


def test_a_write_release_queues_a_reader_it_carries_behind_a_queued_writer(rw: _Prim) -> None:
    """Only readers hold after the release (the writer had taken the read side too), so
    the carried reader would fit, but a writer waits at the head: the reader is queued
    behind it, never granted past it (a stream of readers must not starve a writer)."""
    assert _wacq(rw, T0, "p1.a", "w")[0] == 1
    assert _wacq(rw, T0, "p1.a", "r")[0] == 1  # the writer takes the read side too
    assert _wacq(rw, T0, "p2.a", "w")[:2] == [3, 1]
    raw = rw.raw("release", T0 + 5, "p1.a", "w", 1, "p1", "p1.b", "r", 1)
    assert _plain(raw)[:4] == [1, 0, 0, []]
    assert raw[4][:2] == [3, 2]  # queued, second
    assert rw.queue() == ["p2", "p1"] and rw.holds() == {"r:p1.a": 1}


# --- edge-case ARGV ------------------------------------------------------------------

_BAD = [
    ("rlock", "acquire", ["x", PUB, 1, ELEASE, "o", "p", 1, 1, 0, 1], "now"),
    ("rlock", "acquire", ["", "PUB", 1, ELEASE, "o", "p", 1, 1, 0, 1], "publish"),
    ("rlock", "acquire", ["", PUB, 2, ELEASE, "o", "p", 1, 1, 0, 1], "fair"),
    ("rlock", "acquire", ["", PUB, 1, 0, "o", "p", 1, 1, 0, 1], "entry_lease"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "", "p", 1, 1, 0, 1], "owner"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "#o", "p", 1, 1, 0, 1], "owner"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "o", "p q", 1, 1, 0, 1], "entry"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "o", "p", 0, 1, 0, 1], "ttl"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "o", "p", 1.5, 1, 0, 1], "ttl"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "o", "p", 1, 0, 0, 1], "add"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "o", "p", 1, 1, 2, 1], "reentry"),
    ("rlock", "acquire", ["", PUB, 1, ELEASE, "o", "p", 1, 1, 0], "queue"),
    ("rlock", "release", ["", PUB, 1, ELEASE, "o", -1], "holds"),
    ("rlock", "release", ["", PUB, 1, ELEASE, "p0.a", 1, "p q", "p0.b", 1], "carry entry"),
    ("rlock", "release", ["", PUB, 1, ELEASE, "p0.a", 1, "p0", "#b", 1], "carry waiter"),
    ("rlock", "release", ["", PUB, 1, ELEASE, "p0.a", 1, "p0", "p0.b", 0], "carry count"),
    ("rlock", "release", ["", PUB, 1, ELEASE, "p0.a", 1, "p0", "p0.b"], "carry count"),
    ("rlock", "release", ["", PUB, 1, ELEASE, "p0.a", 1, "p0", "p0.b", 1, 1], "carry"),
    ("rlock", "renew", ["", PUB, 1, ELEASE, 1000, "h"], "items"),
    ("rlock", "renew", ["", PUB, 1, ELEASE, 1000, "r", "o"], "item kind"),
    ("rlock", "leave", ["", PUB, 1, ELEASE, "o", "p", "n", 0], "next want"),
    ("rw", "acquire", ["", PUB, 1, ELEASE, "o", "p", "x", 1, 1, 0, 1], "side"),
    ("rw", "acquire", ["", PUB, 1, ELEASE, "o", "p", "w", 1, 1, 4, 1], "reentry"),
    ("rw", "release", ["", PUB, 1, ELEASE, "o", "rw", 1], "side"),
    ("rw", "release", ["", PUB, 1, ELEASE, "p0.a", "r", 1, "p0", "p0.b", "x", 1],
     "carry side"),
    ("rw", "release", ["", PUB, 1, ELEASE, "p0.a", "r", 1, "p0", "p0.b", "w", 0],
     "carry count"),
    ("rw", "renew", ["", PUB, 1, ELEASE, 1000, "h", "o"], "item kind"),
    ("rw", "renew", ["", PUB, 1, ELEASE, 1000, "ax", "o"], "item kind"),
    ("rlock", "renew", ["", PUB, 1, ELEASE, 1000, "aw", "o"], "item kind"),
    ("rw", "leave", ["", PUB, 1, ELEASE, "o", "p", "n", "q", 1], "next side"),
    ("sem", "acquire", ["", PUB, 1, ELEASE, -1, 1, "p", "p.a", "p", 1, 1, 1], "value"),
    ("sem", "acquire", ["", PUB, 1, ELEASE, 3, 5, "p", "p.a", "p", 1, 1, 1], "bounded"),
    ("sem", "acquire", ["", PUB, 1, ELEASE, 3, 1, "p", "p.a", "p", 1, 0, 1], "permits"),
    ("sem", "release", ["", PUB, 1, ELEASE, 3, 1, 1, "p", 2], "pairs"),
    # a repeated owner (p0.a holds one permit: each pair alone would pass)
    ("sem", "release", ["", PUB, 1, ELEASE, 3, 1, 2, "p0.a", 1, "p0.a", 1], "pairs"),
    ("sem", "release", ["", PUB, 1, ELEASE, 3, 1, 1, "p"], "pairs"),
    ("sem", "release", ["", PUB, 1, ELEASE, 3, 1, 0], "permits"),
    ("sem", "leave", ["", PUB, 1, ELEASE, 3, 1, "p", "p.a", "p", "p.b", "z"], "next want"),
]


@pytest.mark.parametrize(("kind", "op", "args", "what"), _BAD)
def test_bad_argv_is_refused_before_any_change(
    client: "redis.Redis[bytes]", name: str, kind: str, op: str, args: List[Any], what: str
) -> None:
    p = _Prim(client, kind, name)
    # some state to leave untouched
    if kind == "rw":
        _wacq(p, T0, "p0.a", "r")
    elif kind == "sem":
        _sacq(p, T0, "p0.a", 1)
    else:
        _racq(p, T0, "p0.a")
    before = snapshot(client)
    with pytest.raises(redis.ResponseError, match=f"RLOCKS_BAD_ARG {re.escape(what)}"):
        _run(client, f"{kind}_{op}", p.keys, args)
    assert snapshot(client) == before


def test_renew_never_shortens_a_lease(rl: _Prim) -> None:
    assert _racq(rl, T0, "p1.a", ttl=30000)[0] == 1
    assert rl.call("renew", T0 + 10, 1000, "h", "p1.a")[4] == [1]
    assert rl.lease_end("p1.a") == T0 + 30000
    assert _racq(rl, T0 + 10, "p1.a", reentry=1, ttl=1000)[2] == 29990


def test_no_script_scans_a_whole_hash_or_set() -> None:
    """The cost target: nothing in lua/ reads a whole hash or queue on a hot path."""
    for path in LUA.glob("*.lua"):
        code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
        for command in ("HGETALL", "HKEYS", "HVALS", "SMEMBERS", "KEYS", "SCAN"):
            assert f"'{command}'" not in code, (path.name, command)
        # ZRANGE only by a fixed index (head, one entry, last) or by score up to now
        for match in re.finditer(r"'ZRANGE', \w+, ([^,)]+), ([^,)]+)", code):
            assert match.group(1) in ("0", "i", "-1"), (path.name, match.group(0))


# --- model-based ---------------------------------------------------------------------


class Model:
    """The queue semantics in plain Python (docs/design/handover.md), no Redis."""

    def __init__(self, kind: str, fair: int, elease: int, value: int = 0,
                 bounded: int = 0) -> None:
        # fair: 1, or 0 / -patience (ms) for not fair (the script's ARGV[3])
        self.kind, self.fair, self.elease = kind, int(fair == 1), elease
        self.patience = max(0, -fair)
        self.value, self.bounded = value, bounded
        self.holds: Dict[str, List[int]] = {}  # field -> [count, end]
        self.queue: List[str] = []  # entry ids, oldest first
        self.entries: Dict[str, Dict[str, Any]] = {}
        self.markers: Dict[str, Dict[str, Any]] = {}  # waiter -> unadopted grant
        self.free, self.held = value, 0
        self.now = 0
        self.wakes: List[str] = []

    def field(self, side: str, owner: str) -> str:
        return f"{side}:{owner}" if self.kind == "rw" else owner

    def cap(self) -> Dict[str, Any]:
        writer = [f[2:] for f in self.holds if f.startswith("w:")]
        return {"busy": bool(self.holds), "free": self.free,
                "writer": writer[0] if writer else None,
                "nr": sum(f.startswith("r:") for f in self.holds)}

    def fits(self, cap: Dict[str, Any], side: str, owner: str, want: int) -> bool:
        if self.kind == "rlock":
            return not cap["busy"]
        if self.kind == "sem":
            return bool(cap["free"] >= want)
        if side == "w":
            return cap["writer"] is None and cap["nr"] == 0
        return cap["writer"] in (None, owner)

    def take(self, cap: Dict[str, Any], side: str, owner: str, want: int) -> None:
        cap["busy"] = True
        cap["free"] -= want
        if side == "w":
            cap["writer"] = owner
        elif self.field(side, owner) not in self.holds:
            cap["nr"] += 1

    def grant(self, side: str, owner: str, add: int, end: int) -> Tuple[int, int]:
        hold = self.holds.setdefault(self.field(side, owner), [0, end])
        hold[0] += add
        hold[1] = max(hold[1], end)
        if self.kind == "sem":
            self.free -= add
            self.held += add
        return hold[0], hold[1]

    def drop(self, side: str, owner: str, n: Optional[int], refund: bool) -> int:
        f = self.field(side, owner)
        if f not in self.holds:
            return 0
        count = self.holds[f][0]
        n = count if n is None else min(n, count)
        if count > n:
            self.holds[f][0] = count - n
        else:
            del self.holds[f]
        if self.kind == "sem":
            self.held -= n
            if refund:
                self.free += n
        return n

    def remove_entry(self, entry: str) -> None:
        self.queue.remove(entry)
        del self.entries[entry]

    def purge(self) -> None:
        for f, (count, end) in sorted(self.holds.items(), key=lambda kv: (kv[1][1], kv[0])):
            if end > self.now:
                continue
            del self.holds[f]
            if self.kind == "sem":
                self.held -= count
                free = self.free + count
                if self.bounded:
                    free = min(free, max(self.free, self.value - self.held))
                self.free = free
        timed = [(e["end"], "e:" + k) for k, e in self.entries.items()]
        timed += [(m["end"], "g:" + w) for w, m in self.markers.items()]
        for end, member in sorted(timed):
            if end > self.now:
                continue
            if member.startswith("e:"):
                self.remove_entry(member[2:])
            else:
                m = self.markers.pop(member[2:])
                self.drop(m["s"], m["o"], m["n"], True)

    def handover(self) -> None:
        cap, i = self.cap(), 0
        while i < len(self.queue):
            entry = self.queue[i]
            e = self.entries[entry]
            if not self.fits(cap, e["s"], e["o"], e["n"]):
                return
            self.take(cap, e["s"], e["o"], e["n"])
            if self.fair or (e["k"] and self.now >= e["p"]):
                self.remove_entry(entry)
                # (never past the entry's own end: a dead waiter delays one lease at most)
                end = min(self.now + self.elease, e["end"])
                self.grant(e["s"], e["o"], e["n"], end)
                assert e["w"] not in self.markers
                self.markers[e["w"]] = {"o": e["o"], "s": e["s"], "n": e["n"], "end": end}
                self.wakes.append("g " + e["w"])
            elif e["k"]:
                i += 1  # passed over within its patience: no new wake-up
            else:
                e["k"], e["p"] = 1, self.now + self.patience
                self.wakes.append("w " + e["w"])
                i += 1

    def earliest(self) -> int:
        if not self.holds:
            return -1
        return max(1, min(end for _, end in self.holds.values()) - self.now)

    def done(self, status: int, value: int, aux: int) -> List[Any]:
        self.handover()
        return [status, value, aux, self.wakes]

    def acquire(self, owner: str, waiter: str, entry: str, side: str, ttl: int, add: int,
                reentry: int, queue: int) -> List[Any]:
        self.wakes = []
        self.purge()
        other = 0
        if self.kind == "rw":  # reentry + 2: the owner holds the other side
            other, reentry = reentry // 2, reentry % 2
        m = self.markers.pop(waiter, None)
        if m is not None and self.kind == "rw" and m["s"] != side and not other:
            # a grant of the other side its owner never recorded: given back first
            self.drop(m["s"], m["o"], m["n"], True)
            m = None
        if m is not None:
            f = self.field(m["s"], m["o"])
            if not reentry and f in self.holds and m["s"] == side:
                self.holds[f][1] = max(self.holds[f][1], self.now + ttl)
                return self.done(2, self.holds[f][0], self.holds[f][1] - self.now)
        mine = self.holds.get(self.field(side, owner), [None])[0]
        if reentry and mine is None:
            return self.done(-1, 0, 0)
        if self.kind == "rw":
            if side == "w" and mine is None and self.field("r", owner) in self.holds:
                return self.done(-2, 0, 0)
            if side == "r" and mine is None and self.cap()["writer"] == owner:
                mine = 0
        if self.kind != "sem" and mine is not None:
            count, end = self.grant(side, owner, add, self.now + ttl)
            return self.done(1, count, end - self.now)
        if self.fair:
            if not (self.queue and self.queue[0] == entry):
                self.handover()
                m = self.markers.pop(waiter, None)
                if m is not None:  # that walk granted the caller's own entry: adopted
                    f = self.field(m["s"], m["o"])
                    self.holds[f][1] = max(self.holds[f][1], self.now + ttl)
                    return self.done(2, self.holds[f][0], self.holds[f][1] - self.now)
            first = (self.queue[:1] == [entry]) or (not self.queue)
        else:
            first = True
        if first and self.fits(self.cap(), side, owner, add):
            if entry in self.entries:
                self.remove_entry(entry)
            count, end = self.grant(side, owner, add, self.now + ttl)
            return self.done(1, count, end - self.now)
        if not queue:
            self.handover()
            return [0, self.earliest(), len(self.queue), self.wakes]
        old = self.entries.get(entry, {"k": 0, "p": 0})
        if entry not in self.entries:
            self.queue.append(entry)
        self.entries[entry] = {"w": waiter, "o": owner, "s": side, "n": add, "k": old["k"],
                               "p": old["p"], "end": self.now + self.elease}
        self.handover()
        hint = self.earliest()
        e = self.entries.get(entry)
        if e and e["k"] and e["p"] > self.now and (hint < 0 or e["p"] - self.now < hint):
            hint = e["p"] - self.now  # ask again when the patience ends
        return [3, self.queue.index(entry) + 1, hint, self.wakes]

    def release(self, owner: str, side: str, n: int) -> List[Any]:
        self.wakes = []
        self.purge()
        mine = self.holds.get(self.field(side, owner), [None])[0]
        if mine is None:
            return self.done(-1, 0, 0)
        self.adopted(owner, side)
        left = mine - self.drop(side, owner, n, False)
        return self.done(1, left, 0)

    def adopted(self, owner: str, side: str) -> None:
        """A call of ``owner`` on ``side`` adopts its grant (rw: a grant of that side)."""
        m = self.markers.get(owner)
        if m is not None and (self.kind != "rw" or m["s"] == side):
            del self.markers[owner]

    def sem_release(self, give: int, pairs: List[Tuple[str, int]]) -> List[Any]:
        self.wakes = []
        self.purge()
        for k, (owner, n) in enumerate(pairs, 1):
            if self.holds.get(owner, [0])[0] < n:
                return self.done(-1, k, 0)
        owned = sum(n for _, n in pairs)
        if self.bounded and self.free + self.held + give - owned > self.value:
            return self.done(-3, 0, 0)
        self.free += give
        for owner, n in pairs:
            self.drop("s", owner, n, False)
            # the owner's unadopted grant stays for it to adopt, shrunk to what it has left
            m = self.markers.get(owner)
            if m is not None:
                left = self.holds.get(owner, [0])[0]
                if left <= 0:
                    del self.markers[owner]
                else:
                    m["n"] = min(m["n"], left)
        self.handover()
        return [1, self.free, 0, self.wakes]

    def leave(self, waiter: str, entry: str) -> List[Any]:
        self.wakes = []
        self.purge()
        m = self.markers.pop(waiter, None)
        if m is not None:
            return self.done(4, self.drop(m["s"], m["o"], m["n"], True), 0)
        e = self.entries.get(entry)
        if e is None or e["w"] != waiter:
            return self.done(-1, 0, 0)
        self.remove_entry(entry)
        return self.done(1, 0, 0)

    def renew(self, ttl: int, items: List[Tuple[str, str]]) -> List[Any]:
        self.wakes = []
        self.purge()
        # 'a' items first: whether the grant was unadopted when the call began
        results = [0] * len(items)
        for n, (kind, ident) in enumerate(items):
            if kind.startswith("a"):
                mk = self.markers.get(ident)
                found = mk is not None and (kind == "a" or mk["s"] == kind[1:])
                if found:
                    del self.markers[ident]
                results[n] = 1 if found else -1
        for n, (kind, ident) in enumerate(items):
            if kind.startswith("a"):
                continue
            if kind == "e":
                ok = ident in self.entries
                if ok:
                    e = self.entries[ident]
                    e["end"] = max(e["end"], self.now + self.elease)
            else:
                f = self.field("x" if kind == "h" else kind, ident)
                ok = f in self.holds
                if ok:
                    self.holds[f][1] = max(self.holds[f][1], self.now + ttl)
                    if self.kind != "sem":  # a lock's renewal adopts its owner's grant
                        self.adopted(ident, kind)
            results[n] = 1 if ok else -1
        self.handover()
        return [1, results.count(1), 0, self.wakes, results]


# Times are multiples of 5 s (virtual), so a live lease always has >= 5 s left and the
# keys' real PEXPIRE (end - now) never fires while an example runs.
UNIT = 5000
PROCS = ["p0", "p1", "p2"]
THREADS = ["a", "b"]

_op = st.one_of(
    st.tuples(st.just("acq"), st.sampled_from(PROCS), st.sampled_from(THREADS),
              st.sampled_from(["r", "w"]), st.integers(1, 2), st.sampled_from([1, 1, 0]),
              st.sampled_from([0, 0, 0, 1, 2, 3]), st.sampled_from([2, 6])),
    st.tuples(st.just("rel"), st.sampled_from(PROCS), st.sampled_from(THREADS),
              st.sampled_from(["r", "w"]), st.integers(1, 2), st.sampled_from([0, 1])),
    st.tuples(st.just("leave"), st.sampled_from(PROCS), st.sampled_from(THREADS)),
    st.tuples(st.just("renew"), st.sampled_from(PROCS),
              st.lists(st.sampled_from(["h", "h2", "e", "a", "a2"]), min_size=1, max_size=3)),
    st.tuples(st.just("adv"), st.sampled_from([1, 1, 1, 2, 4])),
)

_names = itertools.count()


def _aimed(data: st.DataObject, m: Model, kind: str) -> Tuple[Any, ...]:
    """The next op; a release or leave mostly aims at a current holder or waiter, so
    interleavings reach hand-overs instead of refusals."""
    op: Tuple[Any, ...] = data.draw(_op)
    if op[0] == "rel" and m.holds and data.draw(st.booleans()):
        field = data.draw(st.sampled_from(sorted(m.holds)))
        side = field[0] if kind == "rw" else op[3]
        owner = field[2:] if kind == "rw" else field
        proc, _, thread = owner.partition(".")
        op = ("rel", proc, thread or "a", side, op[4], op[5])
    if op[0] == "leave" and (m.entries or m.markers) and data.draw(st.booleans()):
        waiters = sorted([e["w"] for e in m.entries.values()] + list(m.markers))
        proc, _, thread = data.draw(st.sampled_from(waiters)).partition(".")
        op = ("leave", proc, thread)
    return op


def _check_model(client: "redis.Redis[bytes]", name: str, kind: str, fair: int,
                 data: st.DataObject) -> None:
    elease = 2 * UNIT
    p = _Prim(client, kind, f"{name}-{next(_names)}", fair=fair, elease=elease,
              value=3, bounded=1)
    m = Model(kind, fair, elease, value=3, bounded=1)
    now = T0
    for step in range(data.draw(st.integers(0, 60))):
        op = _aimed(data, m, kind)
        m.now = now
        if op[0] == "adv":
            now += op[1] * UNIT
            continue
        proc, thread = op[1], op[2] if len(op) > 2 and op[0] != "renew" else "a"
        waiter = f"{proc}.{thread}"
        owner = waiter
        if op[0] == "acq":
            side = op[3] if kind == "rw" else ("s" if kind == "sem" else "x")
            add, queue, reentry, ttl = op[4], op[5], op[6], op[7] * UNIT
            if kind == "sem":
                got = p.call("acquire", now, owner, waiter, proc, ttl, add, queue)
                reentry = 0
            elif kind == "rw":  # (reentry + 2: the owner holds the other side)
                got = p.call("acquire", now, owner, proc, side, ttl, add, reentry, queue)
            else:
                reentry %= 2
                got = p.call("acquire", now, owner, proc, ttl, add, reentry, queue)
            want = m.acquire(owner, waiter, proc, side, ttl, add, reentry, queue)
        elif op[0] == "rel":
            if kind == "sem":
                pairs = [(owner, op[4])] if op[5] else []  # none: by nobody's permit
                got = p.call("release", now, op[4], *[x for pair in pairs for x in pair])
                want = m.sem_release(op[4], pairs)
            else:
                side = op[3] if kind == "rw" else "x"
                args: List[Any] = [owner] + ([side] if kind == "rw" else []) + [op[4]]
                got = p.call("release", now, *args)
                want = m.release(owner, side, op[4])
        elif op[0] == "leave":
            if kind == "sem":
                got = p.call("leave", now, owner, waiter, proc, "")
            else:
                got = p.call("leave", now, owner, proc, "")
            want = m.leave(waiter, proc)
        else:
            items: List[Tuple[str, str]] = []
            for k in op[2]:
                if k == "e":
                    items.append(("e", proc))
                elif k == "a" or (k == "a2" and kind != "rw"):
                    items.append(("a", f"{proc}.a"))
                elif k == "a2":  # rw: adopt only a grant of one side
                    items.append((data.draw(st.sampled_from(["ar", "aw"])), f"{proc}.a"))
                elif kind == "rw":
                    items.append(("r" if k == "h" else "w", f"{proc}.a"))
                else:
                    items.append(("h", f"{proc}.a"))
            got = p.call("renew", now, 6 * UNIT, *[x for item in items for x in item])
            want = m.renew(6 * UNIT, items)
        assert got == want, (step, op)
        stored = {f: c for f, c in p.holds().items()}
        assert stored == {f: h[0] for f, h in m.holds.items()}, (step, op)
        assert p.queue() == m.queue, (step, op)
        assert p.markers() == sorted(m.markers), (step, op)
        if kind == "sem" and p.meta("#free") is not None:
            assert int(p.meta("#free") or 0) == m.free, (step, op)


_model_settings = settings(max_examples=100, deadline=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("fair", [1, 0, -UNIT])
@pytest.mark.parametrize("kind", ["rlock", "rw", "sem"])
@_model_settings
@given(data=st.data())
def test_scripts_match_the_model(client: "redis.Redis[bytes]", name: str, kind: str,
                                 fair: int, data: st.DataObject) -> None:
    _check_model(client, name, kind, fair, data)


def test_force_release_ends_every_hold_and_hands_over(client: "redis.Redis[bytes]",
                                                       name: str) -> None:
    p = _Prim(client, "sem", name, value=2)
    assert _sacq(p, T0, "p1.a", 2)[:2] == [1, 2]
    assert _sacq(p, T0, "p2.a", 1)[0] == 3
    assert _sacq(p, T0, "p3.a", 1)[0] == 3
    reply = _norm(_run(client, "force_release", p.keys, [T0, PUB, 1, ELEASE, "sem"]))
    assert reply == [1, 0, 0, ["g p2.a", "g p3.a"]]
    assert p.holds() == {"p2.a": 1, "p3.a": 1}
    assert p.meta("#free") == "0" and p.meta("#value") == "2"
    assert p.call("release", T0, 1, "p1.a", 1)[:2] == [-1, 1]  # p1 finds its hold gone
    r = _Prim(client, "rlock", name + "-r")
    assert _racq(r, T0, "p1.a")[0] == 1
    assert _racq(r, T0, "p2.a")[0] == 3
    assert _plain(_norm(_run(client, "force_release", r.keys, [T0, PUB, 1, ELEASE, "rlock"]))) == [
        1, 0, 0, ["g p2.a"]]
    empty = _Prim(client, "rw", name + "-w")
    assert _norm(_run(client, "force_release", empty.keys, [T0, PUB, 1, ELEASE, "rw"])) == [
        -1, 0, 0, []]
    with pytest.raises(redis.ResponseError, match="RLOCKS_BAD_ARG kind"):
        _run(client, "force_release", empty.keys, [T0, PUB, 1, ELEASE, "lock"])
