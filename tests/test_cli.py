"""The ``rlocks`` command line and the inspection helpers under it (rlocks._engine.state).

Commands run through click's CliRunner against the session's test server (RLOCKS_URL,
set by conftest), each test in a namespace of its own so listings are exact. A few run
``python -m rlocks`` in a subprocess, where a traceback would really reach the user.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Iterator, List

import pytest
import redis
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

import rlocks
from rlocks import cli
from rlocks._engine import identity
from rlocks._engine import state as ins
from rlocks._engine.keys import escape, keys_for
from rlocks._engine.scripts import WAIT
from rlocks.server import free_port

TRICKY_NAMES = ["a:b:c", "{tag}", "x}{y", "with space", "100%7B", "%", "ünï {:}"]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def ns() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def run(ns: str) -> Callable[..., Result]:
    runner = CliRunner()

    def invoke(*args: str, input: str = None) -> Result:  # type: ignore[assignment]
        return runner.invoke(cli.cli, ["--namespace", ns, *args], input=input,
                             catch_exceptions=False)

    return invoke


@pytest.fixture
def held(client: "redis.Redis[bytes]", ns: str) -> Iterator[List[Any]]:
    """Primitives a test acquires; released (or abandoned, if lost) at teardown."""
    taken: List[Any] = []
    yield taken
    for lock in reversed(taken):
        try:
            lock.release()
        except RuntimeError:
            pass


def one_line_error(result: Result) -> str:
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


# -- keys: names round-trip ---------------------------------------------------------------


@given(namespace=st.text(min_size=1), name=st.text(min_size=1),
       kind=st.sampled_from(sorted(ins.KINDS)))
@settings(max_examples=300, deadline=None)
def test_every_key_parses_back_to_its_kind_and_name(namespace: str, name: str,
                                                    kind: str) -> None:
    key = keys_for(namespace, kind, name).hash
    assert ins.parse_key(key, namespace) == (kind, name)


@given(part=st.text())
def test_unescape_inverts_escape(part: str) -> None:
    assert ins.unescape(escape(part)) == part


@pytest.mark.parametrize("key", [
    "rlocks:rlock:{a}:q",         # a primitive's queue of waiters
    "rlocks:rw:{a}:l",            # its holders' lease ends
    "rlocks:rlock:{a}:c:cond",    # a Condition's waiters
    "rlocks:fence:{`abc}",        # a fencing token counter
    "rlocks:wait:{h:1:n:1}",      # a deadlock detector's wait-for edge
    "rlocks:wake:h:1:n",          # a wake-up channel's name
    "rlocks:rlock:{a{b}",         # a raw brace: never written by keys.escape
    "rlocks:rlock:{%41}",         # a stray % escape
    "rlocks:latch:{a}",           # unknown kind
    "rlocks:rlock:a",             # no hash tag
    "rlocks:rlock:{}",            # empty name
    "other:rlock:{a}",            # another namespace
    "rlocks:x:rlock:{a}",         # a namespace below this one
])
def test_keys_other_than_a_primitive_hash_are_not_primitives(key: str) -> None:
    assert ins.parse_key(key, "rlocks") is None


@pytest.mark.parametrize("kind", sorted(set(ins.KINDS) - {"event", "barrier"}))  # (no holds)
def test_a_release_hints_only_the_head_waiter_on_its_process_channel(
    client: "redis.Redis[bytes]", ns: str, name: str, kind: str
) -> None:
    """A release that frees the primitive for a queued waiter publishes one hint,
    ``<hash key>\\n<waiter>``, on the channel of the waiter's process (keys.wake plus its
    process token), and nothing on any other wake-up channel of the namespace."""
    primitive: Any = {"rlock": lambda: rlocks.RLock(name, namespace=ns),
                      "lock": lambda: rlocks.Lock(name, namespace=ns),
                      "rw": lambda: rlocks.RWLock(name, namespace=ns).write_lock,
                      "sem": lambda: rlocks.Semaphore(name, 1, namespace=ns)}[kind]()
    keys = keys_for(ns, kind, name)
    assert primitive._keys == keys
    pubsub = client.pubsub()
    # Every wake-up channel of the namespace (a glob, its own glob characters escaped).
    pubsub.psubscribe(re.sub(r"([\\*?\[\]])", r"\\\1", keys.wake) + "*")
    wait_for(lambda: pubsub.get_message(timeout=0.1), "psubscribe")
    assert primitive.acquire()
    waiting: List[str] = []
    handed = threading.Event()

    def waiter() -> None:
        waiting.append(identity.thread_owner())
        if primitive.acquire(timeout=20):
            handed.set()
            primitive.release()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    wait_for(lambda: client.zcard(keys.queue), "the queued waiter")
    primitive.release()
    got = wait_for(lambda: pubsub.get_message(timeout=0.1), "the wake-up hint")
    assert got["channel"].decode() == keys.wake + identity.process_token()
    assert got["data"].decode() == f"{keys.hash}\n{waiting[0]}"
    thread.join(20)
    assert handed.is_set()
    # The waiter's own release found nobody queued: it published nothing.
    assert pubsub.get_message(timeout=0.2) is None
    pubsub.close()


# -- list -----------------------------------------------------------------------------------


def test_list_shows_every_kind_with_holders_counts_and_leases(
    run: Callable[..., Result], ns: str, held: List[Any]
) -> None:
    lock = rlocks.RLock("orders:42", namespace=ns, ttl=20)
    for _ in range(2):
        assert lock.acquire()
        held.append(lock)
    rw = rlocks.RWLock("config", namespace=ns)
    assert rw.read_lock.acquire()
    held.append(rw.read_lock)
    sem = rlocks.BoundedSemaphore("pool", 3, namespace=ns)
    assert sem.acquire()
    held.append(sem)

    result = run("list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TYPE", "NAME", "HOLDERS", "HOLDS", "FREE", "LEASE", "WAITING"]
    rows = {line.split()[1]: line.split() for line in lines[1:]}
    assert rows["orders:42"][:5] == ["RLock", "orders:42", "1", "2", "-"]
    assert rows["config"][:5] == ["RWLock", "config", "1r", "1", "-"]
    assert rows["pool"][:5] == ["BoundedSemaphore", "pool", "1", "1", "2/3"]
    lease = float(rows["orders:42"][5].rstrip("s"))
    assert 0 < lease <= 20

    data = json.loads(run("list", "--json").stdout)
    assert [(d["type"], d["name"], d["holds"]) for d in data] == [
        ("RWLock", "config", 1), ("RLock", "orders:42", 2), ("BoundedSemaphore", "pool", 1)]


def test_list_and_inspect_show_a_lock_and_an_event(
    run: Callable[..., Result], ns: str, held: List[Any]
) -> None:
    door = rlocks.Lock("door", namespace=ns)
    assert door.acquire()
    held.append(door)
    go = rlocks.Event("go", namespace=ns)
    go.set()
    try:
        lines = run("list").stdout.splitlines()
        assert lines[0].split()[-1] == "STATE"  # (only with a kind that has no holders)
        rows = {line.split()[1]: line.split() for line in lines[1:]}
        assert rows["door"][:5] == ["Lock", "door", "1", "1", "-"] and rows["door"][-1] == "-"
        assert rows["go"][:4] == ["Event", "go", "0", "0"] and rows["go"][-1] == "set"
        assert "  state      set" in run("inspect", "go").stdout.splitlines()
        assert run("inspect", "door").stdout.startswith("Lock door")
        data = {d["name"]: d for d in json.loads(run("list", "--json").stdout)}
        assert data["go"]["detail"] == "set" and data["door"]["type"] == "Lock"
        forced = run("release", "--force", "go", "--yes")
        assert forced.exit_code != 0 and "no holds to release: its own clear()" in forced.stderr
        assert go.is_set()
        go.clear()
        assert "go" not in run("list").stdout  # a cleared Event leaves no key
    finally:
        go.clear()


def test_list_and_inspect_show_a_barrier(run: Callable[..., Result], ns: str) -> None:
    gate = rlocks.Barrier("gate", 2, namespace=ns, timeout=30)
    broke: List[BaseException] = []

    def wait() -> None:
        try:
            gate.wait()
        except rlocks.BrokenBarrierError as exc:
            broke.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        wait_for(lambda: gate.n_waiting == 1, "one party waiting")
        rows = {line.split()[1]: line.split() for line in run("list").stdout.splitlines()[1:]}
        assert rows["gate"][0] == "Barrier" and rows["gate"][-2:] == ["1/2", "waiting"]
        assert "  state      1/2 waiting" in run("inspect", "gate").stdout.splitlines()
        forced = run("release", "--force", "gate", "--yes")
        assert forced.exit_code != 0 and "its own reset()" in forced.stderr
        gate.abort()
        waiter.join(10)
        assert len(broke) == 1
        assert "broken" in run("inspect", "gate").stdout
    finally:
        gate.abort()
        waiter.join(10)
        gate.reset()


def test_list_filters_by_glob_and_kind(run: Callable[..., Result], ns: str,
                                       held: List[Any]) -> None:
    for name in ("jobs:1", "jobs:2", "other"):
        lock = rlocks.RLock(name, namespace=ns)
        assert lock.acquire()
        held.append(lock)
    sem = rlocks.Semaphore("jobs:pool", 2, namespace=ns)
    assert sem.acquire()
    held.append(sem)

    def names(*args: str) -> List[str]:
        return [d["name"] for d in json.loads(run("list", "--json", *args).stdout)]

    assert names("jobs:*") == ["jobs:1", "jobs:2", "jobs:pool"]
    assert names("jobs:*", "--kind", "rlock") == ["jobs:1", "jobs:2"]
    assert names("--kind", "semaphore") == ["jobs:pool"]
    assert names("nothing*") == []


def test_list_of_an_empty_namespace_prints_nothing_and_succeeds(
    run: Callable[..., Result]
) -> None:
    result = run("list")
    assert result.exit_code == 0 and result.stdout == ""
    assert "no primitives" in result.stderr
    assert json.loads(run("list", "--json").stdout) == []


def test_tricky_names_round_trip_through_list_and_inspect(
    run: Callable[..., Result], ns: str, held: List[Any]
) -> None:
    for name in TRICKY_NAMES:
        lock = rlocks.RLock(name, namespace=ns)
        assert lock.acquire()
        held.append(lock)
    listed = [d["name"] for d in json.loads(run("list", "--json").stdout)]
    assert sorted(listed) == sorted(TRICKY_NAMES)
    for name in listed:
        result = run("inspect", name, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["name"] == name
    # The table quotes names for the shell only when they need it.
    table = run("list").stdout
    assert " a:b:c " in table and "'with space'" in table and "'{tag}'" in table


def test_a_namespace_with_glob_and_brace_characters(held: List[Any]) -> None:
    ns = f"odd*[ns]{{{uuid.uuid4().hex[:6]}}}"
    lock = rlocks.RLock("n", namespace=ns)
    assert lock.acquire()
    held.append(lock)
    result = CliRunner().invoke(cli.cli, ["list", "--json", "--namespace", ns])
    assert [d["name"] for d in json.loads(result.stdout)] == ["n"]


# -- inspect --------------------------------------------------------------------------------


def test_inspect_an_rlock_shows_the_owner_its_count_and_lease(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    lock = rlocks.RLock(name, namespace=ns, ttl=15)
    assert lock.acquire() and lock.acquire()
    held += [lock, lock]
    data = json.loads(run("inspect", name, "--json").stdout)
    assert data["type"] == "RLock" and data["holds"] == 2
    [holder] = data["holders"]
    assert holder["owner"] == identity.thread_owner() and holder["count"] == 2
    assert 0 < holder["lease_ms"] <= 15000
    assert data["waiting"] == {"wake": 0}
    text = run("inspect", name).stdout
    assert f"RLock {name}" in text and identity.thread_owner() in text


def test_inspect_an_rwlock_shows_both_sides_and_waiting_writers(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    rw = rlocks.RWLock(name, namespace=ns)
    assert rw.read_lock.acquire()
    held.append(rw.read_lock)
    got = threading.Event()

    def writer() -> None:
        other = rlocks.RWLock(name, namespace=ns)
        if other.write_lock.acquire(timeout=20):
            got.set()
            other.write_lock.release()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    # The waiting writer is the queue's entry, shown with its side, what it wants and
    # its entry lease (2 s by default).
    data = wait_for(lambda: (lambda d: d if d["queue"] else None)(
        json.loads(run("inspect", name, "--json").stdout)), "a waiting writer's queue entry")
    assert [h["side"] for h in data["holders"]] == ["read"]
    assert data["holders"][0]["owner"] == identity.thread_owner()
    assert data["waiting"] == {"wake": 1}
    [entry] = data["queue"]
    assert entry["side"] == "write" and entry["wanted"] == 1
    assert 0 < entry["lease_left_ms"] <= 2000 and entry["age_ms"] >= 0
    text = run("inspect", name).stdout
    assert "queue      1 entry waiting" in text and entry["waiter"] in text
    rw.read_lock.release()
    held.clear()
    thread.join(20)
    assert got.is_set()


def test_inspect_shows_the_queue_in_order_with_each_entry_s_lease(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    """``inspect`` lists the queue head first, each entry with its waiter and lease."""
    sem = rlocks.Semaphore(name, 1, namespace=ns, entry_lease=5.0)
    assert sem.acquire()
    held.append(sem)
    # Three waiters of other (pretend) processes, queued by the engine's own acquire call.
    ghosts = [f"ghost{k}:{1000 + k}:{uuid.uuid4().hex[:16]}:1" for k in range(3)]
    for ghost in ghosts:
        reply = sem._spec.acquire(sem, ghost, 0, sem._entry_ms)(sem.client)
        assert reply.status == WAIT, reply
    data = json.loads(run("inspect", name, "--json").stdout)
    assert [entry["waiter"] for entry in data["queue"]] == ghosts
    assert data["waiting"] == {"wake": 3}
    for entry in data["queue"]:
        assert 0 < entry["lease_left_ms"] <= 5000 and entry["wanted"] == 1
        assert entry["entry"].endswith(f":p:{entry['waiter']}")
    text = run("inspect", name).stdout
    assert "queue      3 entries waiting" in text
    positions = [text.index(ghost) for ghost in ghosts]
    assert positions == sorted(positions), text
    sem.client.delete(sem._keys.queue)


def test_inspect_a_semaphore_shows_value_free_and_holders(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    sem = rlocks.BoundedSemaphore(name, 4, namespace=ns)
    assert sem.acquire() and sem.acquire()
    held += [sem, sem]
    data = json.loads(run("inspect", name, "--json").stdout)
    assert (data["type"], data["value"], data["free"], data["holds"]) == (
        "BoundedSemaphore", 4, 2, 2)
    assert data["holders"][0]["owner"] == identity.thread_owner()
    assert "2 free of 4 (2 held by 1 owner)" in run("inspect", name).stdout


def test_each_blocked_thread_is_a_waiter_of_its_own(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    """Two threads of one process waiting for an RLock are two queue entries, each named
    by its thread's owner id; ``list`` counts them in WAITING."""
    lock = rlocks.RLock(name, namespace=ns)
    assert lock.acquire()
    held.append(lock)
    owners: List[str] = []
    done = threading.Event()

    def wait() -> None:
        owners.append(identity.thread_owner())
        other = rlocks.RLock(name, namespace=ns)
        if other.acquire(timeout=20):
            other.release()
            done.set()

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    data = wait_for(lambda: (lambda d: d if d["waiting"]["wake"] == 2 else None)(
        json.loads(run("inspect", name, "--json").stdout)), "both waiting threads")
    assert sorted(entry["waiter"] for entry in data["queue"]) == sorted(owners)
    row = run("list").stdout.splitlines()[1].split()
    assert row[-1] == "2"
    lock.release()
    held.clear()
    for thread in threads:
        thread.join(20)
    assert done.is_set()


def server_ms(client: "redis.Redis[bytes]") -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_expired_holds_are_counted_stale_not_listed(
    client: "redis.Redis[bytes]", run: Callable[..., Result], ns: str, name: str,
    held: List[Any]
) -> None:
    # A semaphore in the layout of sem_lib.lua: one live and one dead holder (the hash
    # holds the counts, the lease set their lease ends).
    keys = keys_for(ns, "sem", name)
    live, dead = "live:1:aaaaaaaaaaaaaaaa:1", "dead:2:bbbbbbbbbbbbbbbb:1"
    now_ms = server_ms(client)
    client.hset(keys.hash, mapping={"#i": 3, "#b": 1, "#v": 3, "#h": 3, live: 1, dead: 2})
    client.zadd(keys.leases, {live: now_ms + 60_000, dead: now_ms - 1_000})
    client.pexpire(keys.hash, 60_000)
    client.pexpire(keys.leases, 60_000)
    data = json.loads(run("inspect", name, "--json").stdout)
    assert [h["owner"] for h in data["holders"]] == [live]
    # The dead holder's permits count as free, as the next script will make them.
    assert (data["stale"], data["free"], data["value"]) == (1, 2, 3)
    assert "stale entries  1" in run("inspect", name).stdout


def test_a_waiter_whose_entry_lease_ended_is_counted_stale_not_queued(
    client: "redis.Redis[bytes]", run: Callable[..., Result], ns: str, name: str
) -> None:
    """A queue entry past its lease (its waiter stopped asking) is left out of the queue
    and of WAITING and counted stale; a fair=False patience mark is no waiter at all."""
    keys = keys_for(ns, "rlock", name)
    holder = "host:1:aaaaaaaaaaaaaaaa:1"
    live, dead = "host:2:bbbbbbbbbbbbbbbb:1", "host:3:cccccccccccccccc:1"
    now_ms = server_ms(client)
    client.hset(keys.hash, holder, 1)
    client.pexpire(keys.hash, 60_000)
    live_entry = f"{(now_ms - 1_000) * 1000:016d}:x:{live}"
    dead_entry = f"{(now_ms - 9_000) * 1000:016d}:x:{dead}"
    client.zadd(keys.queue, {dead_entry: now_ms - 1_000, live_entry: now_ms + 60_000,
                             f"~w:{live_entry}": now_ms + 60_000})
    client.pexpire(keys.queue, 60_000)
    data = json.loads(run("inspect", name, "--json").stdout)
    [entry] = data["queue"]
    assert (entry["waiter"], entry["side"], entry["entry"]) == (live, "", live_entry)
    assert 1_000 <= entry["age_ms"] < 30_000 and 0 < entry["lease_left_ms"] <= 60_000
    assert (data["waiting"], data["stale"]) == ({"wake": 1}, 1)
    assert [h["owner"] for h in data["holders"]] == [holder]
    assert run("list").stdout.splitlines()[1].split()[-1] == "1"
    assert "stale entries  1" in run("inspect", name).stdout
    client.delete(keys.hash, keys.queue)


def test_inspect_shows_every_kind_that_uses_a_name_and_kind_picks_one(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    lock, sem = rlocks.RLock(name, namespace=ns), rlocks.Semaphore(name, 2, namespace=ns)
    assert lock.acquire() and sem.acquire()
    held += [lock, sem]
    both = json.loads(run("inspect", name, "--json").stdout)
    assert sorted(d["type"] for d in both) == ["RLock", "Semaphore"]
    assert json.loads(run("inspect", name, "--kind", "sem", "--json").stdout)["type"] == \
        "Semaphore"
    result = run("release", "--force", "--yes", name)
    assert result.exit_code == 2 and "--kind" in one_line_error(result)


# -- release --force ------------------------------------------------------------------------


def test_force_release_ends_the_hold_and_wakes_the_waiter_at_once(
    client: "redis.Redis[bytes]", run: Callable[..., Result], ns: str, name: str
) -> None:
    holder = rlocks.RLock(name, namespace=ns, ttl=60)
    assert holder.acquire()
    woke = threading.Event()

    def waiter() -> None:
        if rlocks.RLock(name, namespace=ns).acquire(timeout=30):
            woke.set()  # leaves it held; its lease ends with the test's namespace

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    wait_for(lambda: ins.find(client, ns, name)[0].waiting == (("wake", 1),), "the waiter")
    started = time.monotonic()
    result = run("release", "--force", "--yes", name)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(": 1 hold of 1 owner; woke 1 waiter")
    # Woken by the forced release, not by the holder's 60 s lease running out.
    assert woke.wait(10) and time.monotonic() - started < 10
    with pytest.raises(rlocks.LockLostError):
        holder.release()
    thread.join(5)


def test_force_release_wakes_every_waiter_and_the_head_takes_it(
    client: "redis.Redis[bytes]", run: Callable[..., Result], ns: str, name: str
) -> None:
    """With two threads queued for an RLock, a forced release wakes both (it says so);
    the head takes the lock at once and the other keeps its place in the queue."""
    holder = rlocks.RLock(name, namespace=ns, ttl=60)
    assert holder.acquire()
    keys = keys_for(ns, "rlock", name)
    owners: List[str] = []
    granted: List[str] = []
    go = threading.Event()

    def wait() -> None:
        owners.append(identity.thread_owner())
        lock = rlocks.RLock(name, namespace=ns)
        if lock.acquire(timeout=30):
            granted.append(identity.thread_owner())
            go.wait(30)
            lock.release()

    threads = [threading.Thread(target=wait, daemon=True) for _ in range(2)]
    for count, thread in enumerate(threads, 1):  # one after the other: a known order
        thread.start()
        wait_for(lambda: client.zcard(keys.queue) == count, f"waiter {count} queued")
    result = run("release", "--force", "--yes", name)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(": 1 hold of 1 owner; woke 2 waiters")
    assert wait_for(lambda: granted, "the head's grant") == owners[:1]
    [entry] = ins.find(client, ns, name)[0].queue or ()
    assert entry.waiter == owners[1]
    go.set()
    for thread in threads:
        thread.join(30)
    assert granted == owners
    with pytest.raises(rlocks.LockLostError):
        holder.release()


def test_force_release_of_an_rwlock_wakes_the_queued_reader(
    client: "redis.Redis[bytes]", ns: str, name: str
) -> None:
    """A forced release ends every hold and, in the same script, hints the queued waiter
    (one message, ``<hash key>\\n<waiter>``, on its process's channel); the reader then
    takes the read side with its own acquire, and the writer finds its hold lost."""
    rw = rlocks.RWLock(name, namespace=ns)
    assert rw.write_lock.acquire()
    keys = keys_for(ns, "rw", name)
    pubsub = client.pubsub()
    pubsub.subscribe(keys.wake + identity.process_token())
    assert wait_for(lambda: pubsub.get_message(timeout=0.1), "subscribe")["type"] == "subscribe"
    reader: List[str] = []
    got = threading.Event()

    def read() -> None:
        reader.append(identity.thread_owner())
        other = rlocks.RWLock(name, namespace=ns)
        if other.read_lock.acquire(timeout=20):
            got.set()
            other.read_lock.release()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    wait_for(lambda: client.zcard(keys.queue), "the queued reader")
    assert ins.force_release(client, ns, "rw", name) == (True, 1)
    message = wait_for(lambda: pubsub.get_message(timeout=0.1), "the wake-up hint")
    assert message["data"].decode() == f"{keys.hash}\n{reader[0]}"
    thread.join(20)
    assert got.is_set()
    pubsub.close()
    with pytest.raises(rlocks.LockLostError):
        rw.write_lock.release()


def test_force_release_says_when_nobody_was_waiting(
    run: Callable[..., Result], ns: str, name: str
) -> None:
    first, second = (rlocks.Semaphore(f"{name}-{i}", 2, namespace=ns) for i in (1, 2))
    assert first.acquire() and second.acquire()
    result = run("--json", "release", "--force", "--yes", f"{name}-1")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert (shown["released"], shown["woken"], shown["handed_to"]) == (True, 0, 0)
    assert shown["primitive"]["holds"] == 1
    assert run("release", "--force", "--yes", f"{name}-2").stdout.strip().endswith(
        ": 1 hold of 1 owner; nobody was waiting"
    )
    for sem in (first, second):
        with pytest.raises(rlocks.LockLostError):
            sem.release()


def test_force_release_leaves_a_key_that_is_not_a_hash_alone(
    client: "redis.Redis[bytes]", ns: str, name: str
) -> None:
    key = keys_for(ns, "rlock", name).hash
    client.set(key, "not a lock", ex=60)
    assert ins.force_release(client, ns, "rlock", name) == (False, 0)
    assert client.get(key) == b"not a lock"
    assert ins.find(client, ns, name) == []  # and it is not listed as a primitive


def test_release_without_force_is_a_usage_error(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    lock = rlocks.RLock(name, namespace=ns)
    assert lock.acquire()
    held.append(lock)
    result = run("release", name)
    assert result.exit_code == 2 and "--force" in one_line_error(result)
    assert lock.locked()


def test_release_refuses_without_yes_when_stdin_is_not_a_terminal(
    run: Callable[..., Result], ns: str, name: str, held: List[Any]
) -> None:
    lock = rlocks.RLock(name, namespace=ns)
    assert lock.acquire()
    held.append(lock)
    result = run("release", "--force", name)
    assert result.exit_code == 1
    assert "without --yes" in one_line_error(result)
    assert lock.locked()


def test_release_asks_on_a_terminal(
    run: Callable[..., Result], ns: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "_stdin_is_tty", lambda: True)
    lock = rlocks.RLock(name, namespace=ns)
    assert lock.acquire()
    refused = run("release", "--force", name, input="n\n")
    assert refused.exit_code == 1 and "not released" in refused.stderr
    assert lock.locked()
    accepted = run("release", "--force", name, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "Force-release RLock" in accepted.stderr and not lock.locked()
    with pytest.raises(rlocks.LockLostError):
        lock.release()


# -- watch ----------------------------------------------------------------------------------


def test_watch_refreshes_count_times(run: Callable[..., Result], ns: str, name: str,
                                     held: List[Any]) -> None:
    sem = rlocks.Semaphore(name, 2, namespace=ns)
    assert sem.acquire()
    held.append(sem)
    result = run("watch", name, "--count", "3", "--interval", "0.05")
    assert result.exit_code == 0
    assert result.stdout.count(f"Semaphore {name}") == 3
    frames = run("watch", name, "--count", "2", "-n", "0.05", "--json").stdout.splitlines()
    assert [json.loads(f)["primitives"][0]["free"] for f in frames] == [1, 1]


def test_watch_shows_a_missing_key_as_free(run: Callable[..., Result], name: str) -> None:
    result = run("watch", name, "--count", "1")
    assert result.exit_code == 0 and "no key" in result.stdout


# -- errors: one line, right exit status -----------------------------------------------------


def test_unknown_name(run: Callable[..., Result], name: str) -> None:
    for args in (("inspect", name), ("release", "--force", "--yes", name)):
        result = run(*args)
        assert result.exit_code == 1
        assert f"no primitive named {name!r}" in one_line_error(result)


@pytest.mark.parametrize("url", ["foo://localhost", "redis://localhost:notaport/0"])
def test_bad_url(url: str) -> None:
    result = CliRunner().invoke(cli.cli, ["--url", url, "list"])
    assert result.exit_code == 2
    assert one_line_error(result).startswith("Error: invalid Redis URL")


def test_unreachable_server_and_the_password_is_not_printed() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    for args in (["list"], ["inspect", "x"], ["watch", "x", "--count", "1"],
                 ["release", "--force", "--yes", "x"]):
        result = CliRunner().invoke(cli.cli, ["--url", url, *args])
        assert result.exit_code == 1, (args, result.output)
        line = one_line_error(result)
        assert line.startswith("Error: cannot reach Redis at redis://:***@127.0.0.1:")
        assert "hunter2" not in result.output


def test_options_after_the_command_win(run: Callable[..., Result], ns: str, held: List[Any]
                                       ) -> None:
    lock = rlocks.RLock("here", namespace=ns)
    assert lock.acquire()
    held.append(lock)
    result = CliRunner().invoke(
        cli.cli, ["--namespace", "elsewhere", "--url", "foo://bad", "list",
                  "--namespace", ns, "--url", os.environ["RLOCKS_URL"], "--json"])
    assert result.exit_code == 0, result.output
    assert [d["name"] for d in json.loads(result.stdout)] == ["here"]


def test_python_dash_m_prints_one_line_and_no_traceback() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = subprocess.run([sys.executable, "-m", "rlocks", "--url", url, "list"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "cannot reach Redis" in proc.stderr


def test_main_returns_the_exit_status(name: str) -> None:
    assert cli.main(["--namespace", f"cli-{uuid.uuid4().hex}", "inspect", name]) == 1
    assert cli.main(["--version"]) == 0


def test_on_a_cluster_list_inspect_and_release_reach_every_master(
    cluster: Any, ns: str
) -> None:
    """Given one node's URL of a Redis Cluster, the CLI scans every master and reads each
    primitive on the node of its slot (a pipeline of TIME and reads could not span nodes).
    """
    from redis.cluster import ClusterNode, RedisCluster

    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
    names = [f"spread-{i}" for i in range(12)]  # 12 hash tags: every master gets some
    assert len({client.keyslot(keys_for(ns, "rlock", n).hash) // 5462 for n in names}) == 3
    locks = [rlocks.RLock(n, namespace=ns, client=client, ttl=60) for n in names]
    for lock in locks:
        assert lock.acquire()
    sem = rlocks.Semaphore("pool", 3, namespace=ns, client=client)
    assert sem.acquire()
    try:
        runner = CliRunner()

        def invoke(*args: str) -> Result:
            return runner.invoke(cli.cli, ["--url", cluster.url, "--namespace", ns, *args],
                                 catch_exceptions=False)

        listed = invoke("--json", "list")
        assert listed.exit_code == 0, listed.output
        rows = json.loads(listed.stdout)
        assert sorted(r["name"] for r in rows) == sorted(names + ["pool"])
        assert all(r["holds"] == 1 for r in rows)
        shown = invoke("inspect", "pool")
        assert shown.exit_code == 0, shown.output
        assert "permits    2 free of 3 (1 held by 1 owner)" in shown.stdout, shown.stdout
        gone = invoke("release", "--force", "--yes", "--kind", "rlock", names[0])
        assert gone.exit_code == 0, gone.output
        assert ins.find(client, ns, names[0]) == []
        with pytest.raises(rlocks.LockLostError):
            locks[0].release()
    finally:
        for lock in locks[1:]:
            lock.release()
        sem.release()
        client.close()


def test_inspect_tells_a_holder_that_stopped_renewing(
    client: "redis.Redis[bytes]", run: Callable[..., Result], ns: str, name: str
) -> None:
    """``inspect`` shows how long ago each holder's lease was set; one whose process no
    longer renews (stopped, here: a hold whose renewal is off, 4 s into a 6 s lease) is
    flagged, a renewed one is not."""
    live = rlocks.RLock(name, namespace=ns, ttl=6)
    frozen = rlocks.Semaphore(name + "-s", 2, namespace=ns, ttl=6, auto_renew=False)
    assert live.acquire() and frozen.acquire()
    try:
        time.sleep(4.0)  # the live one was renewed (every 2 s), the frozen one not
        data = json.loads(run("inspect", name, "--json").stdout)
        assert data["holders"][0]["renewed_ms"] < 2500, data
        text = run("inspect", name).stdout
        assert "ago" in text and "late" not in text, text
        data = json.loads(run("inspect", name + "-s", "--json").stdout)
        assert data["holders"][0]["renewed_ms"] >= 3500, data
        text = run("inspect", name + "-s").stdout
        assert "(late: is its process running?)" in text, text
    finally:
        live.release()
        frozen.release()


def test_the_demo_help_says_it_starts_its_own_server() -> None:
    """Without --url or RLOCKS_URL the demo starts a throwaway server: its help says so
    (it once claimed the CLI's default URL)."""
    text = CliRunner().invoke(cli.cli, ["demo", "--help"], env={"RLOCKS_URL": ""}).output
    assert "a throwaway redis-server it starts" in " ".join(text.split())
    assert "default redis://localhost" not in " ".join(text.split())
