"""Each Lua script called directly, with edge-case arguments, against a real Redis."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest
import redis

from rlocks._engine.scripts import BUSY, GRANTED, NOT_OWNER, Reply, load, run

from .conftest import NAMESPACE

ACQUIRE, RELEASE, RENEW = load("rlock_acquire"), load("rlock_release"), load("rlock_renew")


@pytest.fixture
def key(name: str) -> str:
    return f"{NAMESPACE}:rlock:{{{name}}}"


def test_every_script_has_a_header_contract() -> None:
    for script in (ACQUIRE, RELEASE, RENEW):
        header = script.source.split("\n\n")[0]
        assert "KEYS[1]" in header and "ARGV[1]" in header and "Returns" in script.source
        assert "tonumber" in script.source or script is RELEASE


def test_acquire_grants_adds_and_sets_lease(client: Any, key: str) -> None:
    assert run(client, ACQUIRE, [key], ["a", 5000, 1, 0]) == Reply(GRANTED, 1)
    assert run(client, ACQUIRE, [key], ["a", 5000, 3, 0]) == Reply(GRANTED, 4)
    assert 4000 < client.pttl(key) <= 5000
    busy = run(client, ACQUIRE, [key], ["b", 5000, 1, 0])
    assert busy.status == BUSY and 4000 < busy.value <= 5000
    assert client.hgetall(key) == {b"a": b"4"}


def test_reentry_whose_hold_is_gone_is_refused(client: Any, key: str) -> None:
    assert run(client, ACQUIRE, [key], ["a", 5000, 1, 1]) == Reply(NOT_OWNER, 0)
    assert not client.exists(key)  # nothing created
    run(client, ACQUIRE, [key], ["b", 5000, 1, 0])
    assert run(client, ACQUIRE, [key], ["a", 5000, 1, 1]) == Reply(NOT_OWNER, 0)
    assert client.hgetall(key) == {b"b": b"1"}
    assert run(client, ACQUIRE, [key], ["b", 5000, 1, 1]) == Reply(GRANTED, 2)
    client.delete(key)


def test_acquire_reports_no_expiry_as_minus_one(client: Any, key: str) -> None:
    client.hset(key, "stranger", 1)
    assert run(client, ACQUIRE, [key], ["a", 1000, 1, 0]) == Reply(BUSY, -1)
    assert client.hgetall(key) == {b"stranger": b"1"}
    client.delete(key)


def test_acquire_on_a_key_of_another_type_fails_and_changes_nothing(
    client: Any, key: str
) -> None:
    client.set(key, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        run(client, ACQUIRE, [key], ["a", 1000, 1, 0])
    assert client.get(key) == b"not a hash"
    client.delete(key)


def test_release_by_non_owner_changes_nothing(client: Any, key: str) -> None:
    run(client, ACQUIRE, [key], ["a", 5000, 2, 0])
    assert run(client, RELEASE, [key, key + ":wake"], ["b", 1, 0, "PUBLISH"]) == Reply(NOT_OWNER, 0)
    assert run(client, RELEASE, [key + "-none", key + ":wake"], ["a", 1, 0, "PUBLISH"]) == Reply(
        NOT_OWNER, 0
    )
    assert client.hgetall(key) == {b"a": b"2"}
    client.delete(key)


def _collect(client: Any, channel: str, sharded: bool) -> Any:
    pubsub = client.pubsub()
    (pubsub.ssubscribe if sharded else pubsub.subscribe)(channel)
    assert pubsub.get_message(timeout=2)["type"] in ("subscribe", "ssubscribe")
    return pubsub


@pytest.mark.parametrize("command", ["PUBLISH", "SPUBLISH"])
def test_release_publishes_exactly_once_when_freed(client: Any, key: str, command: str) -> None:
    version = client.info("server")["redis_version"]
    if command == "SPUBLISH" and int(version.split(".")[0]) < 7:
        pytest.skip(f"sharded pub/sub needs redis-server >= 7.0; this one is {version}")
    channel = key + ":wake"
    pubsub = _collect(client, channel, command == "SPUBLISH")
    run(client, ACQUIRE, [key], ["a", 5000, 2, 0])

    def next_is_marker() -> bool:
        # Messages reach a subscriber in the order the server handled them: if the next
        # one is the marker published now, the script published nothing before it.
        client.execute_command(command, channel, b"marker")
        return bool(pubsub.get_message(timeout=5)["data"] == b"marker")

    assert run(client, RELEASE, [key, channel], ["a", 1, 0, command]) == Reply(GRANTED, 1)
    assert next_is_marker()  # still held: no wake-up
    assert run(client, RELEASE, [key, channel], ["a", 1, 0, command]) == Reply(GRANTED, 0)
    message = pubsub.get_message(timeout=5)
    assert message["data"] == b"1"
    assert next_is_marker()  # exactly once
    assert not client.exists(key)
    pubsub.close()


def test_release_everything_drops_all_levels(client: Any, key: str) -> None:
    run(client, ACQUIRE, [key], ["a", 5000, 5, 0])
    assert run(client, RELEASE, [key, key + ":wake"], ["a", 1, 1, "PUBLISH"]) == Reply(GRANTED, 0)
    assert not client.exists(key)


def test_renew_extends_only_the_owners_lease(client: Any, key: str) -> None:
    run(client, ACQUIRE, [key], ["a", 200, 1, 0])
    assert run(client, RENEW, [key], ["a", 9000]) == Reply(GRANTED, 1)
    assert client.pttl(key) > 8000
    assert run(client, RENEW, [key], ["b", 100]) == Reply(NOT_OWNER, 0)
    assert client.pttl(key) > 8000
    client.delete(key)
    assert run(client, RENEW, [key], ["a", 9000]) == Reply(NOT_OWNER, 0)
    assert not client.exists(key)


def test_noscript_is_recovered(client: Any, key: str) -> None:
    client.script_flush()
    assert run(client, ACQUIRE, [key], ["a", 1000, 1, 0]) == Reply(GRANTED, 1)
    client.delete(key)


def test_concurrent_acquires_grant_exactly_one(client: Any, key: str) -> None:
    replies: List[Any] = []  # each contender's Reply, or the exception it raised
    barrier = threading.Barrier(8)

    def contender(owner: str) -> None:
        try:
            barrier.wait(10)
            replies.append((owner, run(client, ACQUIRE, [key], [owner, 5000, 1, 0])))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            replies.append((owner, exc))

    threads = [threading.Thread(target=contender, args=(f"o{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Every contender answered (a crashed one would not be a loser), exactly one granted.
    assert len(replies) == 8 and all(isinstance(r, Reply) for _, r in replies), replies
    winners = [owner for owner, r in replies if r.granted]
    assert len(winners) == 1
    assert all(r.status == BUSY for owner, r in replies if owner not in winners)
    assert client.hgetall(key) == {winners[0].encode(): b"1"}
    client.delete(key)


# -- a grant or renewal never shortens a live hold's lease (issue 10 A) ---------------------
# Two objects of one name with different ttl share one hold: the shorter one's re-entry or
# renewal must not cut the longer one's lease (Redis 6.2 has no PEXPIRE ... GT: the scripts
# compare in Lua).

RW_READ = load("rw_acquire_read", prelude="rw_lib")
RW_WRITE = load("rw_acquire_write", prelude="rw_lib")
RW_RENEW = load("rw_renew", prelude="rw_lib")
SEM_ACQUIRE = load("sem_acquire", prelude="sem_lib")
SEM_RELEASE = load("sem_release", prelude="sem_lib")
SEM_RENEW = load("sem_renew", prelude="sem_lib")


def _left_ms(client: Any, key: str, field: str) -> int:
    now_s, now_us = client.time()
    return int(client.hget(key, field)) - (now_s * 1000 + now_us // 1000)


def test_rlock_reentry_and_renewal_never_shorten_the_lease(client: Any, key: str) -> None:
    assert run(client, ACQUIRE, [key], ["a", 30000, 1, 0]) == Reply(GRANTED, 1)
    assert run(client, ACQUIRE, [key], ["a", 2000, 1, 1]) == Reply(GRANTED, 2)
    assert client.pttl(key) > 20000
    assert run(client, RENEW, [key], ["a", 2000]) == Reply(GRANTED, 2)
    assert client.pttl(key) > 20000
    # A longer lease still extends it.
    assert run(client, RENEW, [key], ["a", 60000]) == Reply(GRANTED, 2)
    assert client.pttl(key) > 50000
    client.delete(key)


@pytest.mark.parametrize("side", ["r", "w"])
def test_rw_reentry_and_renewal_never_shorten_the_lease(client: Any, name: str, side: str) -> None:
    key = f"{NAMESPACE}:rw:{{{name}}}"

    def grant(lease: int, reentry: int) -> Reply:
        if side == "r":
            return run(client, RW_READ, [key], ["a", lease, 1, reentry])
        return run(client, RW_WRITE, [key], ["a", lease, 1, 0, reentry])

    assert grant(30000, 0) == Reply(GRANTED, 1)
    assert grant(2000, 1) == Reply(GRANTED, 2)
    assert _left_ms(client, key, f"#{side}:a") > 20000
    assert client.pttl(key) > 20000
    assert run(client, RW_RENEW, [key], ["a", side, 2000]) == Reply(GRANTED, 2)
    assert _left_ms(client, key, f"#{side}:a") > 20000
    assert client.pttl(key) > 20000
    assert run(client, RW_RENEW, [key], ["a", side, 60000]) == Reply(GRANTED, 2)
    assert _left_ms(client, key, f"#{side}:a") > 50000
    client.delete(key)


def _sem_key(name: str) -> str:
    return f"{NAMESPACE}:sem:{{{name}}}"


def test_sem_grant_and_renewal_never_shorten_the_lease(client: Any, name: str) -> None:
    key = _sem_key(name)
    assert run(client, SEM_ACQUIRE, [key], ["a", 30000, 1, 3, 1]) == Reply(GRANTED, 1)
    assert run(client, SEM_ACQUIRE, [key], ["a", 2000, 1, 3, 1]) == Reply(GRANTED, 2)
    assert _left_ms(client, key, "#lease:a") > 20000
    assert run(client, SEM_RENEW, [key], ["a", 2000, 3, 1]) == Reply(GRANTED, 2)
    assert _left_ms(client, key, "#lease:a") > 20000
    assert run(client, SEM_RENEW, [key], ["a", 60000, 3, 1]) == Reply(GRANTED, 2)
    assert _left_ms(client, key, "#lease:a") > 50000
    client.delete(key)


# -- sem_release: whose permits, and the bounded circulation rule (issue 10 B, 1) -----------


def test_sem_release_takes_permits_off_each_listed_owner(client: Any, name: str) -> None:
    key, wake = _sem_key(name), _sem_key(name) + ":wake"
    run(client, SEM_ACQUIRE, [key], ["a", 30000, 2, 3, 1])
    run(client, SEM_ACQUIRE, [key], ["b", 30000, 1, 3, 1])
    assert run(client, SEM_RELEASE, [key, wake], [2, 3, 1, "PUBLISH", "a", 1, "b", 1]) == Reply(
        GRANTED, 2
    )
    state = client.hgetall(key)
    assert state[b"a"] == b"1" and b"b" not in state and b"#lease:b" not in state
    assert state[b"#free"] == b"2"
    client.delete(key)


def test_sem_release_names_the_owner_whose_permits_are_gone(client: Any, name: str) -> None:
    key, wake = _sem_key(name), _sem_key(name) + ":wake"
    run(client, SEM_ACQUIRE, [key], ["a", 30000, 1, 3, 1])
    before = client.hgetall(key)
    # "b" holds nothing, "a" holds 1 not 2: the first short owner is named; nothing changes.
    reply = run(client, SEM_RELEASE, [key, wake], [2, 3, 1, "PUBLISH", "a", 1, "b", 1])
    assert reply == Reply(NOT_OWNER, 2)
    assert run(client, SEM_RELEASE, [key, wake], [2, 3, 1, "PUBLISH", "a", 2]) == Reply(
        NOT_OWNER, 1
    )
    assert client.hgetall(key) == before
    client.delete(key)


def test_bounded_sem_release_never_puts_more_than_value_in_circulation(
    client: Any, name: str
) -> None:
    key, wake = _sem_key(name), _sem_key(name) + ":wake"
    assert run(client, SEM_ACQUIRE, [key], ["a", 30000, 1, 1, 1]) == Reply(GRANTED, 1)
    before = client.hgetall(key)
    # A release of nobody's permit while "a" holds the only one: refused, nothing changed.
    assert run(client, SEM_RELEASE, [key, wake], [1, 1, 1, "PUBLISH"]) == Reply(BUSY, -1)
    assert client.hgetall(key) == before
    # Unbounded: the same release of nobody's permit is threading's counter model.
    plain = _sem_key(name + "-plain")
    run(client, SEM_ACQUIRE, [plain], ["a", 30000, 1, 1, 0])
    assert run(client, SEM_RELEASE, [plain, wake], [1, 1, 0, "PUBLISH"]) == Reply(GRANTED, 1)
    assert run(client, SEM_RELEASE, [key, wake], [1, 1, 1, "PUBLISH", "a", 1]) == Reply(
        GRANTED, 1
    )
    assert not client.exists(key)
    client.delete(plain)
