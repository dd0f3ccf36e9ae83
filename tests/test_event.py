"""rlocks.Event and rlocks.asyncio.Event: one flag across threads, tasks and processes.

CPython's own ``EventTests`` run on rlocks.Event here (with ``threading.Event`` as the
control row); then what only a distributed Event has to get right: waiters in other
processes, a set racing a wait, a set followed by a clear, dead waiters, keys left
behind, cancellation, bad input. Waits are for states (a waiter's entry in Redis, a
thread's end), each bounded.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import uuid
from typing import Any, Dict, List, Tuple

import pytest
import redis
import redis.asyncio

import rlocks
from rlocks._engine import event as engine
from rlocks._engine.identity import thread_owner
from rlocks._engine.scripts import Call
from rlocks._engine.steps import drive
from rlocks.asyncio.event import Event as AsyncEvent
from rlocks.event import Event

from ._proxy import FaultyLink
from ._servers import wait_until
from ._threads import joined, started
from .conftest import NAMESPACE, snapshot

try:
    from . import test_lock_tests as contract
except pytest.skip.Exception:  # no stdlib test package: the rest of this file still runs
    contract = None  # type: ignore[assignment]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- CPython's contract ---------------------------------------------------------------------

if contract is not None:
    # Imported, it is this module's autouse fixture too: the engine's threads start before
    # each test, so CPython's harness does not count them as a test's leaked threads.
    _shared_client_and_warm_engine = contract._shared_client_and_warm_engine


def _event_tests() -> Any:
    # (not a module global: pytest would collect a unittest class bound here by itself)
    return object if contract is None else contract.lock_tests.EventTests


def make_event() -> Event:
    return Event(f"event-tests-{uuid.uuid4().hex}", client=contract._client, namespace=NAMESPACE)


@pytest.mark.skipif(contract is None, reason="this Python has no stdlib test package")
class TestEvent(_event_tests()):  # type: ignore[misc]
    eventtype = staticmethod(make_event)

    @pytest.mark.skip(reason="it takes threading.Event's private _cond (a threading.Condition) "
                      "and _at_fork_reinit: rlocks.Event keeps no local lock or flag to "
                      "reinitialise (the state is in Redis; see test_fork_child_waits)")
    def test_at_fork_reinit(self) -> None:  # pragma: no cover
        pass

    @pytest.mark.skip(reason="repr does no I/O, so it cannot say set/unset as threading's "
                      "'<threading.Event at ...: set>' does; it shows the name (see "
                      "test_repr_is_local_and_pickling_is_refused)")
    def test_repr(self) -> None:  # pragma: no cover
        pass


@pytest.mark.skipif(contract is None, reason="this Python has no stdlib test package")
class TestThreadingEventControl(_event_tests()):  # type: ignore[misc]
    """The control row: the same contract on ``threading.Event``."""

    eventtype = staticmethod(threading.Event)


# -- helpers --------------------------------------------------------------------------------


def entries(client: Any, ev: Any) -> List[bytes]:
    """The members of ``ev``'s waiters set (``!`` in front: told by a set())."""
    return list(client.zrange(ev._keys.queue, 0, -1))


def own_keys(client: Any, ev: Any) -> List[bytes]:
    """Which of ``ev``'s two keys exist."""
    return [k.encode() for k in (ev._keys.hash, ev._keys.queue) if client.exists(k)]


def waiting(client: Any, ev: Any, n: int) -> None:
    wait_until(lambda: len(entries(client, ev)) >= n, 30, f"{n} waiter entries")


_WORKER = """
import json, os, sys
sys.path.insert(0, {root!r})
from rlocks.event import Event
from tests._procs import make_client
spec, name, namespace, data, mode, lease = json.loads(sys.argv[1])
client = make_client(spec)
ev = Event(name, client=client, namespace=namespace, entry_lease=lease)
if mode == "wait":
    client.rpush(data, "%d %s" % (os.getpid(), ev.wait(None)))
elif mode == "set":
    ev.set()
elif mode == "is_set":
    client.rpush(data, str(ev.is_set()))
"""


def process(spec: Dict[str, Any], name: str, data: str, mode: str,
            lease: float = 2.0) -> "subprocess.Popen[bytes]":
    """A Python process that makes ``Event(name)`` and does ``mode`` (``wait``: a wait
    without time-out, its result pushed to the list ``data``; ``set``; ``is_set``: pushed
    to ``data``). Its own interpreter: nothing shared with this one but Redis."""
    code = _WORKER.format(root=ROOT)
    args = json.dumps([spec, name, NAMESPACE, data, mode, lease])
    return subprocess.Popen([sys.executable, "-c", code, args], cwd=ROOT)


def finished(proc: "subprocess.Popen[bytes]", timeout: float = 60) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"process {proc.pid} still running after {timeout} s") from None


# -- across processes -----------------------------------------------------------------------


def test_a_set_wakes_four_waiting_processes(
    target: Tuple[Any, Dict[str, Any]], name: str
) -> None:
    client, spec = target
    ev = Event(name, client=client, namespace=NAMESPACE)
    data = f"{NAMESPACE}-data:{name}"
    # An entry lease of 60 s: a waiter looks again by itself only every 20 s, so the
    # processes can end within the bound below only through the wake-up hints.
    procs = [process(spec, name, data, "wait", lease=60.0) for _ in range(4)]
    try:
        waiting(client, ev, 4)
        assert client.llen(data) == 0  # nobody returned before the set
        ev.set()
        codes = [finished(p, 15) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * 4
    results = sorted(v.decode() for v in client.lrange(data, 0, -1))
    assert results == sorted(f"{p.pid} True" for p in procs)
    assert entries(client, ev) == []  # each left
    ev.clear()
    assert own_keys(client, ev) == []
    client.delete(data)


def test_a_set_in_one_process_is_seen_by_is_set_in_another(
    target: Tuple[Any, Dict[str, Any]], name: str
) -> None:
    client, spec = target
    ev = Event(name, client=client, namespace=NAMESPACE)
    data = f"{NAMESPACE}-data:{name}"
    assert finished(process(spec, name, data, "is_set")) == 0
    assert finished(process(spec, name, data, "set")) == 0
    assert ev.is_set()
    assert finished(process(spec, name, data, "is_set")) == 0
    assert client.lrange(data, 0, -1) == [b"False", b"True"]
    ev.clear()
    assert finished(process(spec, name, data, "is_set")) == 0
    assert client.lrange(data, 0, -1)[-1] == b"False"
    client.delete(data)


def test_a_killed_waiters_entry_ends_with_its_lease(
    client: "redis.Redis[bytes]", redis_url: str, name: str
) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE)
    proc = process({"url": redis_url}, name, f"{NAMESPACE}-data:{name}", "wait", lease=2.0)
    try:
        waiting(client, ev, 1)
        [member] = entries(client, ev)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert entries(client, ev) == [member]  # nobody removed it: the process died
    assert 0 < client.pttl(ev._keys.queue) <= 2000  # ... but it has a lease
    wait_until(lambda: entries(client, ev) == [], 30, "the dead waiter's lease to end")
    ev.set()
    ev.clear()
    assert snapshot(client) == {}


def test_clear_drops_dead_entries_so_no_key_is_left(
    client: "redis.Redis[bytes]", name: str
) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE)
    # An entry whose lease ended long ago, in a set that would not expire by itself.
    client.zadd(ev._keys.queue, {f"{thread_owner()}#0": 1})
    ev.clear()
    assert snapshot(client) == {}


# -- races ----------------------------------------------------------------------------------


def test_a_set_racing_a_wait_never_hangs(client: "redis.Redis[bytes]", name: str) -> None:
    for i in range(40):
        ev = Event(f"{name}-{i}", client=client, namespace=NAMESPACE)
        go = threading.Barrier(2)

        def wait(ev: Event = ev, go: threading.Barrier = go) -> bool:
            go.wait(10)
            return ev.wait(30)

        def set_(ev: Event = ev, go: threading.Barrier = go) -> None:
            go.wait(10)
            if i % 2:
                ev.set()
            else:  # a set and a clear: the waiter must still see the set
                ev.set()
                ev.clear()

        waiter, out = started(wait)
        setter, out2 = started(set_)
        joined(setter, out2)
        if i % 2:
            assert joined(waiter, out, 40) is True, f"round {i}"
        else:
            # Set-then-clear racing the start of a wait: threading's Event returns True
            # if the wait began before the set, and blocks if it began after the clear.
            # Either way it must not hang once set again.
            ev.set()
            assert joined(waiter, out, 40) is True, f"round {i}"
        ev.clear()
        assert own_keys(client, ev) == [], f"round {i}"


def test_set_then_clear_while_waiting_returns_true(
    target: Tuple[Any, Dict[str, Any]], name: str
) -> None:
    client, _spec = target
    ev = Event(name, client=client, namespace=NAMESPACE)
    threads = [started(lambda: ev.wait(60)) for _ in range(3)]
    waiting(client, ev, 3)
    ev.set()
    ev.clear()
    assert [joined(t, out) for t, out in threads] == [True] * 3
    assert not ev.is_set()
    assert own_keys(client, ev) == []


def test_a_lost_hint_costs_a_look_not_the_wake_up(
    client: "redis.Redis[bytes]", name: str
) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE, entry_lease=0.3)
    thread, out = started(lambda: ev.wait(60))
    waiting(client, ev, 1)
    client.hset(ev._keys.hash, "set", "1")  # set without a hint or a mark
    assert joined(thread, out) is True
    ev.clear()


def test_a_resent_first_call_finds_its_mark(client: "redis.Redis[bytes]", name: str) -> None:
    # The first event_wait ran, but its reply was lost; set() and clear() came; the
    # call is sent again: it must answer "told", not register anew.
    ev = Event(name, client=client, namespace=NAMESPACE)
    member = f"{thread_owner()}#resent"
    first = Call(engine._WAIT, (ev._keys.hash, ev._keys.queue), (member, 2000))
    assert ev._backend.run(first).status == 0
    ev.set()
    assert entries(client, ev) == [b"!" + member.encode()]
    ev.clear()
    again = ev._backend.run(first)
    assert (again.status, again.a) == (1, 1)
    drive(ev._leave(member))
    assert own_keys(client, ev) == []


def test_a_second_set_changes_nothing(client: "redis.Redis[bytes]", name: str) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE)
    call = ev._call(engine._SET, ev._keys.wake)
    assert ev._backend.run(call).status == 1
    assert ev._backend.run(call).status == 2
    assert client.hgetall(ev._keys.hash) == {b"set": b"1"}
    assert client.pttl(ev._keys.hash) == -1  # a set Event persists
    ev.clear()
    assert own_keys(client, ev) == []


def test_a_wait_rides_out_an_outage(client: "redis.Redis[bytes]", redis_url: str,
                                    name: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultyLink(port) as link:
        via = redis.Redis.from_url(link.url, socket_timeout=2)
        ev = Event(name, client=via, namespace=NAMESPACE)
        direct = Event(name, client=client, namespace=NAMESPACE)
        thread, out = started(lambda: ev.wait(60))
        waiting(client, ev, 1)
        link.cut()  # the waiter (and its process's wake-up subscriber) lose Redis
        direct.set()  # its hint is lost; its mark is not
        direct.clear()
        link.heal()
        assert joined(thread, out) is True
        link.cut()
        # Redis away until the deadline: a time-out, not an error.
        assert ev.wait(0.3) is False
        link.heal()
        wait_until(lambda: entries(client, ev) == [], 30, "the entry of the timed-out wait")
    assert snapshot(client) == {}
    via.close()


class Alarm(Exception):
    """What the test's signal handler raises in the waiting main thread."""


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="a signal handler runs in the main thread only")
def test_an_interrupted_wait_leaves_no_entry(client: "redis.Redis[bytes]", name: str) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE)
    main = threading.get_ident()

    def handler(signum: int, frame: Any) -> None:
        raise Alarm()

    def alarm_once_waiting() -> None:
        waiting(client, ev, 1)
        signal.pthread_kill(main, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        thread, out = started(alarm_once_waiting)
        with pytest.raises(Alarm):
            ev.wait(60)
        joined(thread, out)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert entries(client, ev) == []
    assert snapshot(client) == {}


def test_a_wait_longer_than_its_entry_lease_keeps_its_entry(
    client: "redis.Redis[bytes]", name: str
) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE, entry_lease=0.3)
    thread, out = started(lambda: ev.wait(60))
    waiting(client, ev, 1)
    [member] = entries(client, ev)
    first = client.zscore(ev._keys.queue, member)
    assert first is not None
    # Renewed: its lease end moves on past three leases, and it is the same entry.
    wait_until(lambda: (client.zscore(ev._keys.queue, member) or 0) > first + 900, 30,
               "the entry's lease renewed")
    assert entries(client, ev) == [member]
    ev.set()
    assert joined(thread, out) is True
    ev.clear()
    assert snapshot(client) == {}


# -- key hygiene ----------------------------------------------------------------------------


def test_keys_live_as_long_as_the_state(client: "redis.Redis[bytes]", name: str) -> None:
    ev = Event(name, client=client, namespace=NAMESPACE)
    assert not ev.wait(0.05)  # a timed-out wait leaves its entry
    assert snapshot(client) == {}
    assert not ev.is_set() and not ev.wait(0) and not ev.wait(-1)
    ev.set()
    assert list(snapshot(client)) == [ev._keys.hash.encode()]
    assert ev.wait() and ev.wait(0) and ev.wait(-1)  # (set: no entry is made)
    assert list(snapshot(client)) == [ev._keys.hash.encode()]
    ev.clear()
    ev.clear()
    assert snapshot(client) == {}
    assert not ev.is_set()


def test_two_objects_of_one_name_are_one_event(client: "redis.Redis[bytes]", name: str) -> None:
    a = Event(name, client=client, namespace=NAMESPACE)
    b = Event(name, client=client, namespace=NAMESPACE)
    other = Event(name, client=client, namespace=NAMESPACE + "-other")
    a.set()
    assert b.is_set() and not other.is_set()
    b.clear()
    assert not a.is_set()


def test_fork_child_waits(client: "redis.Redis[bytes]", name: str) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    ev = Event(name, client=client, namespace=NAMESPACE)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            code = 0 if ev.wait(30) else 1
        except BaseException:  # noqa: BLE001
            code = 2
        os._exit(code)
    waiting(client, ev, 1)
    ev.set()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    ev.clear()


# -- asyncio --------------------------------------------------------------------------------


def test_asyncio_event(redis_url: str, client: "redis.Redis[bytes]", name: str) -> None:
    threaded = Event(name, client=client, namespace=NAMESPACE)

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        ev = AsyncEvent(name, client=aclient, namespace=NAMESPACE)
        try:
            assert not await ev.is_set()
            assert not await ev.wait(0.05) and not await ev.wait(0)
            assert snapshot(client) == {}
            # Set then clear while tasks wait: every one returns True.
            tasks = [asyncio.ensure_future(ev.wait()) for _ in range(3)]
            while len(await aclient.zrange(ev._keys.queue, 0, -1)) < 3:
                await asyncio.sleep(0.01)
            await ev.set()
            await ev.clear()
            assert await asyncio.gather(*tasks) == [True] * 3
            # A thread of this process sets; a task wakes.
            task = asyncio.ensure_future(ev.wait(60))
            while not await aclient.zrange(ev._keys.queue, 0, -1):
                await asyncio.sleep(0.01)
            await asyncio.to_thread(threaded.set)
            assert await task is True
            assert await ev.is_set() and await ev.wait()
            await ev.clear()
            assert snapshot(client) == {}
        finally:
            await aclient.aclose()

    asyncio.run(main())


def test_asyncio_task_wakes_a_thread(redis_url: str, client: "redis.Redis[bytes]",
                                     name: str) -> None:
    threaded = Event(name, client=client, namespace=NAMESPACE)
    thread, out = started(lambda: threaded.wait(60))
    waiting(client, threaded, 1)

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        try:
            await AsyncEvent(name, client=aclient, namespace=NAMESPACE).set()
        finally:
            await aclient.aclose()

    asyncio.run(main())
    assert joined(thread, out) is True
    threaded.clear()


def test_a_cancelled_asyncio_wait_leaves_no_entry(
    redis_url: str, client: "redis.Redis[bytes]", name: str
) -> None:
    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(redis_url)
        ev = AsyncEvent(name, client=aclient, namespace=NAMESPACE)
        try:
            task = asyncio.ensure_future(ev.wait())
            while not await aclient.zrange(ev._keys.queue, 0, -1):
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await aclient.zrange(ev._keys.queue, 0, -1) == []
            # asyncio.timeout cancels the wait the same way.
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await ev.wait()
            assert await aclient.zrange(ev._keys.queue, 0, -1) == []
        finally:
            await aclient.aclose()

    asyncio.run(main())
    assert snapshot(client) == {}


def test_asyncio_event_with_the_default_client(client: "redis.Redis[bytes]", name: str) -> None:
    async def main() -> None:
        ev = AsyncEvent(name, namespace=NAMESPACE)  # RLOCKS_URL: the test server
        try:
            await ev.set()
            assert await ev.wait(1)
            await ev.clear()
            assert not await ev.is_set()
        finally:
            await rlocks.asyncio.aclose()

    asyncio.run(main())
    assert snapshot(client) == {}


def test_asyncio_event_on_the_cluster(cluster: Any, name: str) -> None:
    sync = cluster.client()

    async def main() -> None:
        aclient = redis.asyncio.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p)
                           for h, p in cluster.startup_nodes])
        ev = AsyncEvent(name, client=aclient, namespace=NAMESPACE)
        try:
            task = asyncio.ensure_future(ev.wait(60))
            while not sync.zrange(ev._keys.queue, 0, -1):
                await asyncio.sleep(0.01)
            await ev.set()
            await ev.clear()
            assert await task is True
            assert not sync.exists(ev._keys.hash, ev._keys.queue)
        finally:
            await aclient.aclose()

    try:
        asyncio.run(main())
    finally:
        sync.close()


# -- bad input ------------------------------------------------------------------------------


def test_bad_constructor_arguments(client: "redis.Redis[bytes]") -> None:
    for cls, label in ((Event, r"rlocks\.Event"), (AsyncEvent, r"rlocks\.asyncio\.Event")):
        with pytest.raises(TypeError, match=label + r" name must be a str, not bytes"):
            cls(b"x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=label + " name must not be empty"):
            cls("")
        with pytest.raises(TypeError, match=label + r"\('x'\): namespace must be a str"):
            cls("x", namespace=1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=label + r"\('x'\): namespace must not be empty"):
            cls("x", namespace="")
        with pytest.raises(TypeError, match=label + r"\('x'\): entry_lease .* not bool"):
            cls("x", entry_lease=True)
        with pytest.raises(TypeError, match=label + r"\('x'\): entry_lease must be a number"):
            cls("x", entry_lease="2")  # type: ignore[arg-type]
        for bad in (0, -1, 0.001, math.nan, math.inf):
            with pytest.raises(ValueError, match=label + r"\('x'\): entry_lease"):
                cls("x", entry_lease=bad)
        with pytest.raises(TypeError, match=label + r"\('x'\): .*unexpected keyword.*'ttl'"):
            cls("x", ttl=3)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=label + r"\('x'\): client must be"):
            cls("x", client="redis://localhost")
        quorum = rlocks.Quorum([redis.Redis(port=p) for p in (1, 2, 3)])
        with pytest.raises(ValueError, match=label + r"\('x'\): client is a Quorum"):
            cls("x", client=quorum)
    with pytest.raises(TypeError, match=r"rlocks\.Event\('x'\): client is a redis\.asyncio"):
        Event("x", client=redis.asyncio.Redis())
    with pytest.raises(TypeError, match=r"rlocks\.asyncio\.Event\('x'\): client must be a "
                       r"redis\.asyncio client"):
        AsyncEvent("x", client=client)
    with pytest.raises(ValueError, match=r"rlocks\.Event\('café'\): the name 'café' is not ASCII"):
        Event("caf\xe9", client=redis.Redis(encoding="latin-1"))


def test_bad_timeouts_raise_before_any_redis_call(name: str) -> None:
    # A client of a port nobody listens on: any I/O would be a ConnectionError.
    nowhere = redis.Redis(port=1, socket_connect_timeout=0.5)
    ev = Event(name, client=nowhere, namespace=NAMESPACE)
    with pytest.raises(TypeError, match=r"rlocks\.Event\('.*'\): timeout must be a number"):
        ev.wait("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rlocks\.Event\('.*'\): timeout must be a number, "
                       "not NaN"):
        ev.wait(math.nan)
    with pytest.raises(OverflowError, match=r"rlocks\.Event\('.*'\): timeout"):
        ev.wait(math.inf)
    with pytest.raises(TypeError, match=r"rlocks\.Event\('.*'\)\.wait\(\)|unexpected keyword"):
        ev.wait(blocking=False)  # type: ignore[call-arg]

    async def main() -> None:
        aev = AsyncEvent(name, client=redis.asyncio.Redis(port=1), namespace=NAMESPACE)
        with pytest.raises(TypeError, match=r"rlocks\.asyncio\.Event\('.*'\): timeout"):
            await aev.wait("1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="NaN"):
            await aev.wait(math.nan)

    asyncio.run(main())


def test_a_negative_timeout_is_a_look_as_in_threading(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # threading.Event().wait(-1) returns the flag at once; so does rlocks.Event.
    assert threading.Event().wait(-1) is False
    ev = Event(name, client=client, namespace=NAMESPACE)
    assert ev.wait(-1) is False
    ev.set()
    assert ev.wait(-5) is True
    ev.clear()
    assert snapshot(client) == {}


def test_repr_is_local_and_pickling_is_refused(name: str) -> None:
    ev = Event(name, client=redis.Redis(port=1), namespace=NAMESPACE)
    assert repr(ev) == f"<rlocks.Event {name!r} at {id(ev):#x}>"  # no I/O: port 1
    for attempt in (pickle.dumps, copy.copy):
        with pytest.raises(TypeError, match=r"cannot pickle or copy rlocks\.Event"):
            attempt(ev)
    assert ev.name == name and ev.namespace == NAMESPACE and ev.entry_lease == 2.0
