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
    if command == "SPUBLISH" and int(client.info("server")["redis_version"].split(".")[0]) < 7:
        pytest.skip("sharded pub/sub needs redis-server >= 7 (this one is older)")
    channel = key + ":wake"
    pubsub = _collect(client, channel, command == "SPUBLISH")
    run(client, ACQUIRE, [key], ["a", 5000, 2, 0])
    assert run(client, RELEASE, [key, channel], ["a", 1, 0, command]) == Reply(GRANTED, 1)
    assert pubsub.get_message(timeout=0.2) is None  # still held: no wake-up
    assert run(client, RELEASE, [key, channel], ["a", 1, 0, command]) == Reply(GRANTED, 0)
    message = pubsub.get_message(timeout=2)
    assert message["data"] == b"1"
    assert pubsub.get_message(timeout=0.2) is None
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
    winners: List[str] = []
    barrier = threading.Barrier(8)

    def contender(owner: str) -> None:
        barrier.wait()
        if run(client, ACQUIRE, [key], [owner, 5000, 1]).granted:
            winners.append(owner)

    threads = [threading.Thread(target=contender, args=(f"o{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    client.delete(key)
