"""Deadlock detection (issue 14, item 3): a cycle of waits raises DeadlockError in exactly
one of its waiters, within ``deadlock_timeout`` plus the check, on a single server and on
Redis Cluster; threads, processes and asyncio tasks; RLock and both RWLock sides. Without
a cycle, or with ``deadlock_timeout=None``, nothing is raised.

A cycle member holds its first primitive, waits until every member holds its own (a
count in Redis: state, not time), then asks for the next member's. Whoever is not the
victim acquires once the victim's handler released what it held.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Tuple

import pytest
import redis

import rlocks
import rlocks.asyncio
from rlocks._engine import deadlock, identity, scripts
from rlocks._engine import state as ins
from rlocks._engine.keys import accuse_key, keys_for, wait_key, wait_seq_key

from . import _procs
from ._servers import LocalCluster, wait_until
from .conftest import load_scripts

SPAWN = multiprocessing.get_context("spawn")
DEADLOCK_TIMEOUT = 0.5
WAIT = 30.0  # the acquire's own timeout: a detection must come long before it


def _mutex(kind: str, name: str, client: Any, namespace: str, **options: Any) -> Any:
    """The threading primitive a cycle member takes: ``rlock``, ``read`` or ``write``."""
    if kind == "rlock":
        return rlocks.RLock(name, client=client, namespace=namespace, **options)
    rw = rlocks.RWLock(name, client=client, namespace=namespace, **options)
    return rw.read_lock if kind == "read" else rw.write_lock


def cycle_member(
    client: Any,
    namespace: str,
    first: Tuple[str, str],
    second: Tuple[str, str],
    members: int,
    data: str,
    deadlock_timeout: Any = DEADLOCK_TIMEOUT,
    wait: float = WAIT,
    book: Any = None,
) -> None:
    """Hold ``first``, wait until ``members`` hold theirs, acquire ``second``; report to
    ``{data}:out`` ``dead <s waited> <owners in the cycle>`` or ``acquired`` or ``timeout``
    (through ``book``, default ``client``: the test's bookkeeping)."""
    held = _mutex(*first, client, namespace, deadlock_timeout=deadlock_timeout)
    wanted = _mutex(*second, client, namespace, deadlock_timeout=deadlock_timeout)
    client = client if book is None else book
    with held:
        client.incr(f"{data}:holding")
        deadline = time.monotonic() + 60
        while int(client.get(f"{data}:holding") or 0) < members:
            assert time.monotonic() < deadline, "the other members never held"
            time.sleep(0.01)
        began = time.monotonic()
        try:
            got = wanted.acquire(timeout=wait)
        except rlocks.DeadlockError as exc:
            assert exc.name == second[1] and isinstance(exc, RuntimeError)
            assert exc.cycle[0][0] == identity.thread_owner(), exc.cycle
            client.rpush(f"{data}:out", f"dead {time.monotonic() - began:.3f} {len(exc.cycle)}")
            client.rpush(f"{data}:messages", str(exc))
            return
        if got:
            wanted.release()
        client.rpush(f"{data}:out", "acquired" if got else "timeout")


def process_member(spec: Dict[str, Any], *args: Any) -> None:
    """:func:`cycle_member` in a process of its own (errors go to ``{data}:errors``)."""
    client = _procs.make_client(spec)
    data = args[4]
    try:
        cycle_member(client, *args)
    except BaseException:  # noqa: BLE001 - reported to the test
        _procs.report_error(client, f"{data}:errors")
        raise


def _outcomes(client: Any, data: str, members: int) -> List[str]:
    wait_until(lambda: client.llen(f"{data}:out") >= members, 90, "every member's outcome")
    errors = [e.decode() for e in client.lrange(f"{data}:errors", 0, -1)]
    assert errors == []
    return sorted(o.decode() for o in client.lrange(f"{data}:out", 0, -1))


def _check_one_victim(outcomes: List[str], members: int) -> None:
    dead = [o for o in outcomes if o.startswith("dead")]
    assert len(dead) == 1, outcomes
    assert outcomes.count("acquired") == members - 1, outcomes
    _word, waited, size = dead[0].split()
    assert int(size) == members
    # Far below the acquire's own timeout: found by the check, not by giving up.
    assert float(waited) < WAIT / 3, outcomes


_AGAINST = {"rlock": "rlock", "read": "write", "write": "read"}


def _ring(kinds: List[str], names: List[str]) -> List[Tuple[Tuple[str, str], Tuple[str, str]]]:
    """Member i holds (kinds[i], names[i]) and wants member i+1's primitive on the side
    that conflicts with how it is held (a read hold blocks a writer, a write hold a reader)."""
    n = len(names)
    return [
        ((kinds[i], names[i]), (_AGAINST[kinds[(i + 1) % n]], names[(i + 1) % n]))
        for i in range(n)
    ]


def _edges(client: Any, namespace: str) -> List[Any]:
    """The wait-for edges (``<namespace>:wait:<owner>``) of ``namespace``."""
    return list(client.scan_iter(match=f"{namespace}:wait:*"))


def _no_edges(client: Any, namespace: str) -> bool:
    return not _edges(client, namespace)


@pytest.fixture
def ns() -> str:
    return f"rlocks-deadlock-{uuid.uuid4().hex[:8]}"


# -- threads of one process ------------------------------------------------------------


@pytest.mark.parametrize(
    "kinds",
    [["rlock", "rlock"], ["rlock", "write"], ["read", "rlock"], ["write", "write", "rlock"]],
    ids=["rlock-rlock", "rlock-write", "read-rlock", "write-write-rlock"],
)
def test_threads_in_a_cycle_one_raises_the_others_proceed(
    client: Any, ns: str, name: str, kinds: List[str]
) -> None:
    names = [f"{name}-{i}" for i in range(len(kinds))]
    data = f"{ns}:data"
    errors: List[BaseException] = []

    def run(first: Tuple[str, str], second: Tuple[str, str]) -> None:
        try:
            cycle_member(client, ns, first, second, len(kinds), data)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in _ring(kinds, names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    if errors:
        raise errors[0]
    _check_one_victim(_outcomes(client, data, len(kinds)), len(kinds))
    message = client.lindex(f"{data}:messages", 0).decode()
    for n in names:
        assert repr(n) in message  # the cycle is named: every primitive of it
    assert _no_edges(client, ns)  # every wait deleted its edge


def test_a_cycle_is_found_under_the_documented_acl_user(
    client: Any, redis_url: str, name: str
) -> None:
    """The least-privilege ACL line (docs/operations.md) covers the detector's commands;
    the script is not loaded yet (SCRIPT FLUSH), so its NOSCRIPT recovery runs too."""
    from .test_security import ACL_NAMESPACE, ACL_RULES

    user, password = f"rlocks-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    client.acl_setuser(user, reset=True)
    client.execute_command("ACL", "SETUSER", user, f">{password}", *ACL_RULES)
    limited = redis.Redis.from_url(redis_url, username=user, password=password)
    client.script_flush()
    names = [f"{name}-a", f"{name}-b"]
    data = f"{ACL_NAMESPACE}:data:{name}"
    errors: List[BaseException] = []

    def run(first: Tuple[str, str], second: Tuple[str, str]) -> None:
        try:
            cycle_member(limited, ACL_NAMESPACE, first, second, 2, data, book=client)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run, args=p) for p in _ring(["rlock", "write"], names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        if errors:
            raise errors[0]
        _check_one_victim(_outcomes(client, data, 2), 2)
    finally:
        client.delete(f"{data}:out", f"{data}:holding", f"{data}:messages",
                      wait_seq_key(ACL_NAMESPACE))
        client.acl_deluser(user)
        limited.close()


def test_deadlock_timeout_none_turns_detection_off(client: Any, ns: str, name: str) -> None:
    """The cycle lasts until the first acquire's own timeout; no edge, no counter is
    written."""
    names = [f"{name}-a", f"{name}-b"]
    data = f"{ns}:data"
    errors: List[BaseException] = []

    def run(first: Tuple[str, str], second: Tuple[str, str]) -> None:
        try:
            cycle_member(client, ns, first, second, 2, data, None, 3 * DEADLOCK_TIMEOUT)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=p) for p in _ring(["rlock"] * 2, names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    outcomes = _outcomes(client, data, 2)
    # The first to time out releases, so the other may still get in before its own end.
    assert not [o for o in outcomes if o.startswith("dead")], outcomes
    assert "timeout" in outcomes, outcomes
    assert client.exists(wait_seq_key(ns)) == 0


def test_a_wait_shorter_than_deadlock_timeout_writes_nothing(
    client: Any, ns: str, name: str
) -> None:
    """No extra round trip for a short wait: no wait number drawn, no edge written."""
    lock = rlocks.RLock(name, client=client, namespace=ns, deadlock_timeout=5.0)
    holding, got = threading.Event(), []

    def holder() -> None:
        with lock:
            holding.set()
            wait_until(lambda: bool(lock.statistics().waiting_total), 10, "a waiter")

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(10)
    got.append(lock.acquire(timeout=10))  # granted at the holder's release, well before 5 s
    lock.release()
    t.join(10)
    assert got == [True]
    assert client.exists(wait_seq_key(ns)) == 0


@pytest.mark.parametrize("value", ["1", [1], object()])
def test_deadlock_timeout_of_a_wrong_type_is_a_type_error(value: Any, client: Any, ns: str) -> None:
    with pytest.raises(TypeError, match="deadlock_timeout"):
        rlocks.RLock("x", client=client, namespace=ns, deadlock_timeout=value)
    with pytest.raises(TypeError, match="deadlock_timeout"):
        rlocks.RWLock("x", client=client, namespace=ns, deadlock_timeout=value)
    with pytest.raises(TypeError, match="deadlock_timeout"):
        rlocks.RLock("x", client=client, namespace=ns, deadlock_timeout=True)


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 1e10])
def test_deadlock_timeout_out_of_range_is_a_value_error(value: Any, client: Any, ns: str) -> None:
    with pytest.raises(ValueError, match="deadlock_timeout"):
        rlocks.RLock("x", client=client, namespace=ns, deadlock_timeout=value)
    with pytest.raises(ValueError, match="deadlock_timeout"):
        rlocks.asyncio.RWLock("x", namespace=ns, deadlock_timeout=value)
    assert _no_edges(client, ns) and client.exists(wait_seq_key(ns)) == 0


def _wait(ns: str, owner: str, side: str, key: str, name: str, entry: str = "-") -> Any:
    """The detector's state of one wait of ``owner`` for ``key`` (``side``), its first
    check due at once (as ``Detector`` builds it for a blocking acquire)."""
    return deadlock._Wait(ns, owner, side, key, 1.0, -1.0, name, name, entry)


def _checked(
    client: Any, det: Any, before: Callable[[Tuple[Any, ...]], None] = lambda c: None
) -> Any:
    """Run one deadlock check of ``det`` (a ``deadlock._Wait``) against ``client``: the
    error or ``None``. ``before`` sees each command just before it is sent (a test's hook
    to change state). Redis errors are thrown into the check, as the engine's driver does."""
    reads = deadlock.check(det)
    value: Any = None
    error: Any = None
    while True:
        try:
            command = reads.throw(error) if error is not None else reads.send(value)
        except StopIteration as done:
            return done.value
        value, error = None, None
        before(command)
        try:
            value = client.execute_command(*command)
        except redis.RedisError as exc:
            error = exc


def test_a_cycle_that_changed_before_the_confirmation_accuses_nobody(
    client: Any, ns: str, name: str
) -> None:
    """The walk is not atomic: a wait that ended (its edge renumbered) between the walk
    and the confirmation must not be taken for part of a cycle; unchanged, it is, and
    only the cycle's youngest wait (highest number) is the victim."""
    mine = rlocks.RLock(f"{name}-mine", client=client, namespace=ns)
    theirs = rlocks.RLock(f"{name}-theirs", client=client, namespace=ns)
    other: List[str] = []
    holding, done = threading.Event(), threading.Event()

    def hold_theirs() -> None:
        with theirs:
            other.append(identity.thread_owner())
            holding.set()
            done.wait(30)

    t = threading.Thread(target=hold_theirs)
    t.start()
    try:
        assert holding.wait(10)
        me = identity.thread_owner()
        with mine:
            # The other owner "waits" for mine, in wait number 0 (older than any drawn).
            edge = deadlock.Edge(other[0], 0, "x", mine._keys.hash)
            client.set(wait_key(ns, other[0]), edge.value(), px=30000)

            # (loaded: no NOSCRIPT answer, whose re-send would count as a second read)
            load_scripts(client, deadlock._HOLDERS)

            def run(renumber: bool) -> Any:
                det = _wait(ns, me, "x", theirs._keys.hash, "me")
                evals = [0]

                def before(command: Tuple[Any, ...]) -> None:
                    # (deadlock_holders.lua on theirs: the walk's read, then the confirmation's)
                    if command[0] == "EVALSHA" and command[3] == theirs._keys.hash:
                        evals[0] += 1
                        if evals[0] == 2 and renumber:  # the confirmation begins
                            client.set(wait_key(ns, other[0]), edge._replace(seq=7).value())

                return _checked(client, det, before)

            found = run(renumber=False)
            assert isinstance(found, rlocks.DeadlockError), found
            assert [owner for owner, _h, _w in found.cycle] == [me, other[0]]
            client.set(wait_key(ns, other[0]), edge.value(), px=30000)
            assert run(renumber=True) is None
            # A younger wait than the checker's is the victim: the checker accuses nobody.
            client.set(wait_key(ns, other[0]), edge._replace(seq=10**12).value(), px=30000)
            assert run(renumber=False) is None
    finally:
        done.set()
        t.join(10)
        client.delete(wait_key(ns, other[0]) if other else "none", wait_key(ns, identity.thread_owner()))


# -- asyncio ---------------------------------------------------------------------------


def test_asyncio_tasks_in_a_cycle_one_raises(redis_url: str, ns: str, name: str) -> None:
    async def main() -> List[str]:
        import redis.asyncio as aredis

        aclient = aredis.Redis.from_url(redis_url)
        rw = rlocks.asyncio.RWLock(f"{name}-b", client=aclient, namespace=ns,
                                   deadlock_timeout=DEADLOCK_TIMEOUT)
        lock = rlocks.asyncio.RLock(f"{name}-a", client=aclient, namespace=ns,
                                    deadlock_timeout=DEADLOCK_TIMEOUT)
        ready = [0]
        out: List[str] = []

        async def member(first: Any, second: Any) -> None:
            async with first:
                ready[0] += 1
                while ready[0] < 2:
                    await asyncio.sleep(0.01)
                try:
                    got = await second.acquire(timeout=WAIT)
                except rlocks.DeadlockError as exc:
                    out.append(f"dead {len(exc.cycle)}")
                    return
                if got:
                    await second.release()
                out.append("acquired" if got else "timeout")

        try:
            await asyncio.wait_for(
                asyncio.gather(member(lock, rw.write_lock), member(rw.read_lock, lock)), 60
            )
        finally:
            await aclient.aclose() if hasattr(aclient, "aclose") else await aclient.close()
        return sorted(out)

    assert asyncio.run(main()) == ["acquired", "dead 2"]
    assert _no_edges(redis.Redis.from_url(redis_url), ns)


# -- a Condition wait taking its lock back ------------------------------------------------
#
# Condition.wait gives its lock up and must return holding it again (threading's does, and
# the caller's `with` releases it). Its re-acquire waits like any acquire, so it can be part
# of a cycle: the waiter holds Y while it takes X back, and the notifier holds X while it
# asks for Y. The re-acquire checks later (X's deadlock_timeout is the longer), so by wait
# number it would be the victim; it may not give up, so the notifier must be accused.

RESTORE_TIMEOUT = 0.6  # X's: the restoring wait draws its number after the notifier's
ASK_TIMEOUT = 0.1  # Y's


@pytest.mark.parametrize("kind", ["rlock", "write"])
def test_a_condition_wait_taking_its_lock_back_is_never_the_victim(
    client: Any, ns: str, name: str, kind: str
) -> None:
    lock = _mutex(kind, f"{name}-x", client, ns, deadlock_timeout=RESTORE_TIMEOUT)
    other = rlocks.RLock(f"{name}-y", client=client, namespace=ns, deadlock_timeout=ASK_TIMEOUT)
    cond = rlocks.Condition(lock)
    waiting = threading.Event()
    out: Dict[str, Any] = {}

    def waiter() -> None:
        try:
            with other:
                with cond:
                    waiting.set()
                    out["notified"] = cond.wait(WAIT)
                    out["held after wait"] = lock._levels(lock._owner())  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - checked below
            out["waiter"] = exc

    def notifier() -> None:
        try:
            waiting.wait(WAIT)
            with cond:  # free while the other thread waits
                cond.notify()
                try:
                    out["asked"] = other.acquire(timeout=WAIT)
                except rlocks.DeadlockError as exc:
                    out["asked"] = exc
        except BaseException as exc:  # noqa: BLE001 - checked below
            out["notifier"] = exc

    threads = [threading.Thread(target=waiter), threading.Thread(target=notifier)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert "waiter" not in out and "notifier" not in out, out
    assert isinstance(out["asked"], rlocks.DeadlockError), out  # the notifier was accused
    assert out["notified"] is True and out["held after wait"] == 1, out
    assert not lock.locked() and not other.locked()
    assert _no_edges(client, ns)


def test_an_asyncio_condition_wait_taking_its_lock_back_is_never_the_victim(
    redis_url: str, ns: str, name: str
) -> None:
    async def main() -> Dict[str, Any]:
        import redis.asyncio as aredis

        aclient = aredis.Redis.from_url(redis_url)
        lock = rlocks.asyncio.RLock(f"{name}-x", client=aclient, namespace=ns,
                                    deadlock_timeout=RESTORE_TIMEOUT)
        other = rlocks.asyncio.RLock(f"{name}-y", client=aclient, namespace=ns,
                                     deadlock_timeout=ASK_TIMEOUT)
        cond = rlocks.asyncio.Condition(lock)
        waiting = asyncio.Event()
        out: Dict[str, Any] = {}

        async def waiter() -> None:
            async with other:
                async with cond:
                    waiting.set()
                    out["notified"] = await cond.wait(WAIT)
                    out["locked after wait"] = await lock.locked()  # by this task: nobody else can

        async def notifier() -> None:
            await waiting.wait()
            async with cond:
                await cond.notify()
                try:
                    out["asked"] = await other.acquire(timeout=WAIT)
                except rlocks.DeadlockError as exc:
                    out["asked"] = exc

        try:
            await asyncio.wait_for(asyncio.gather(waiter(), notifier()), 60)
        finally:
            await aclient.aclose() if hasattr(aclient, "aclose") else await aclient.close()
        return out

    out = asyncio.run(main())
    assert isinstance(out["asked"], rlocks.DeadlockError), out
    assert out["notified"] is True and out["locked after wait"] is True, out
    assert _no_edges(redis.Redis.from_url(redis_url), ns)


def test_a_cycle_of_restoring_waits_only_accuses_nobody_and_warns_once_per_wait(
    client: Any, ns: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cycle of Condition waits taking their locks back only: nobody may give up, so
    nobody is accused; each wait warns of it once, then logs it at debug level at every
    later check (it warned at every check).

    The cycle lasts until the test has seen four reports of it (the two waits may warn
    twice at most, so two or more are repeats); then the test breaks it by force-releasing
    ``a``. No time-out decides how many checks ran (it was a 4 s one, and a loaded run
    once saw no check finish in 1.5 s)."""
    # Built with the restore's mark around plain acquires (with exclusive holds a real one
    # hardly arises: each restore's blocker was held from before its own wait).
    a = rlocks.RLock(f"{name}-a", client=client, namespace=ns, deadlock_timeout=0.1)
    b = rlocks.RLock(f"{name}-b", client=client, namespace=ns, deadlock_timeout=0.1)
    both = threading.Barrier(2)
    out: Dict[str, Any] = {}
    seen = 4  # reports of the cycle before the test breaks it

    def member(first: Any, second: Any, key: str) -> None:
        try:
            with first:
                both.wait(WAIT)
                # (the mark a Condition's acquire_restore puts around its acquires)
                second._restoring.add(second._owner())
                try:
                    out[key] = second.acquire(timeout=WAIT)
                except BaseException as exc:  # noqa: BLE001 - checked below
                    out[key] = exc
                finally:
                    second._restoring.discard(second._owner())
                if out[key] is True:
                    second.release()
        except rlocks.LockLostError:
            out[f"{key} lost"] = True  # its first lock was force-released meanwhile

    def said() -> List[logging.LogRecord]:
        # (records of the members' threads; a copy, they may still be adding)
        return [r for r in list(caplog.records) if "taking their locks back" in r.getMessage()]

    caplog.set_level(logging.DEBUG, logger="rlocks._engine.deadlock")
    threads = [threading.Thread(target=member, args=(a, b, "a")),
               threading.Thread(target=member, args=(b, a, "b"))]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(said()) >= seen, 30, f"{seen} reports of the cycle")
    finally:
        # Breaks the cycle: a goes to b's thread, which then gives b up to a's thread,
        # whose release of a, no longer its, finds the hold lost.
        ins.force_release(client, ns, "rlock", f"{name}-a")
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    # Nobody accused: both waits ended holding what they asked for.
    assert out == {"a": True, "b": True, "a lost": True}, out
    reports = said()
    warned = [r for r in reports if r.levelno == logging.WARNING]
    assert len(reports) > len(warned) >= 1  # checked again and again, warned once per wait
    assert len(warned) <= 2
    assert _no_edges(client, ns)


def test_a_restoring_wait_is_stored_so_older_readers_see_no_edge() -> None:
    edge = deadlock.Edge("o", 7, "w", "ns:rw:{n}", "-", True)
    assert edge.value() == "7 W - ns:rw:{n}"  # an older rlocks reads no edge from this
    assert deadlock.Edge.parse("o", edge.value().encode()) == edge
    assert deadlock.Edge.parse("o", b"7 w - ns:rw:{n}") == edge._replace(restoring=False)


# -- processes, single server and cluster -----------------------------------------------


def _run_processes(spec: Dict[str, Any], client: Any, ns: str, kinds: List[str],
                   names: List[str]) -> None:
    data = f"{ns}:data"
    children = [
        SPAWN.Process(target=process_member, args=(spec, ns, first, second, len(kinds), data))
        for first, second in _ring(kinds, names)
    ]
    try:
        for p in children:
            p.start()
        outcomes = _outcomes(client, data, len(kinds))
        for p in children:
            p.join(30)
        assert [p.exitcode for p in children] == [0] * len(children)
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(10)
    _check_one_victim(outcomes, len(kinds))
    assert _no_edges(client, ns)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kinds", [["rlock", "rlock"], ["write", "rlock", "read"]], ids=["2-rlock", "3-mixed"]
)
def test_processes_in_a_cycle_one_raises(
    client: Any, redis_url: str, ns: str, name: str, kinds: List[str]
) -> None:
    names = [f"{name}-{i}" for i in range(len(kinds))]
    _run_processes({"url": redis_url}, client, ns, kinds, names)


def _names_on_different_nodes(cclient: Any, ns: str, kinds: List[str]) -> List[str]:
    """One name per member, each primitive's slot on a different node."""
    names: List[str] = []
    nodes = set()
    for i in range(1000):
        candidate = f"n{i}"
        kind = "rlock" if kinds[len(names)] == "rlock" else "rw"
        key = _mutex(kinds[len(names)], candidate, cclient, ns)._keys.hash
        assert kind in key
        node = cclient.get_node_from_key(key).name
        if node not in nodes:
            nodes.add(node)
            names.append(candidate)
            if len(names) == len(kinds):
                return names
    raise AssertionError("no names on different nodes")


@pytest.mark.slow
@pytest.mark.parametrize(
    "kinds", [["rlock", "write"], ["rlock", "read", "write"]], ids=["2-mixed", "3-mixed"]
)
def test_processes_in_a_cycle_across_cluster_nodes_one_raises(
    cluster: LocalCluster, ns: str, kinds: List[str]
) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    cclient = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
    try:
        names = _names_on_different_nodes(cclient, ns, kinds)
        _run_processes({"cluster": cluster.startup_nodes}, cclient, ns, kinds, names)
    finally:
        cclient.close()


# -- no cycle, heavy contention ---------------------------------------------------------


def nested_worker(url: str, ns: str, names: List[str], data: str, seconds: float) -> None:
    """Threads take two of ``names`` in one global order (no cycle possible), briefly,
    over and over, with a tiny deadlock_timeout so waits run the check through waiting
    holders; any error is reported."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    options = dict(client=client, namespace=ns, deadlock_timeout=0.02)
    rw = rlocks.RWLock(names[1], **options)
    ordered = [rlocks.RLock(names[0], **options), rw.write_lock, rlocks.RLock(names[2], **options)]
    failures: List[BaseException] = []

    def work(index: int) -> None:
        try:
            end = time.monotonic() + seconds
            n = index
            while time.monotonic() < end:
                n += 1
                i, j = sorted(((n % 3), ((n + 1 + index) % 3)))
                outer = ordered[i] if i != 1 or n % 2 else rw.read_lock
                inner = ordered[j] if j != i else None
                assert outer.acquire(timeout=60)
                try:
                    if inner is not None:
                        assert inner.acquire(timeout=60)
                        inner.release()
                finally:
                    outer.release()
                client.incr(f"{data}:sections")
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            failures.append(exc)
            _procs.report_error(client, f"{data}:errors")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.load
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_heavy_nested_contention_without_a_cycle_raises_no_deadlock(
    client: Any, redis_url: str, ns: str, name: str
) -> None:
    names = [f"{name}-{i}" for i in range(3)]
    data = f"{ns}:data"
    children = [
        SPAWN.Process(target=nested_worker, args=(redis_url, ns, names, data, 20.0))
        for _ in range(5)
    ]
    try:
        for p in children:
            p.start()
        for p in children:
            p.join(120)
        errors = [e.decode() for e in client.lrange(f"{data}:errors", 0, -1)]
        assert errors == []
        assert [p.exitcode for p in children] == [0] * len(children)
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join(10)
    sections = int(client.get(f"{data}:sections") or 0)
    checked = int(client.get(wait_seq_key(ns)) or 0)
    print(f"\nno-cycle load: {sections} sections, {checked} waits checked for deadlocks")
    assert sections > 0
    assert checked > 0, "no wait lasted deadlock_timeout: the run checked nothing"
    assert _no_edges(client, ns)


# -- a wait behind a queued entry (strict FIFO) -----------------------------------------


def _counting_checks(count: Callable[[Any], None]) -> Callable[[Any], Any]:
    """``deadlock.check`` calling ``count(det)`` after each check that finished (found a
    cycle or not): a test waits for checks to have run, not for time to pass."""
    check = deadlock.check

    def counted(det: Any) -> Any:
        found = yield from check(det)
        count(det)
        return found

    return counted


def queued_writer(spec: Dict[str, Any], ns: str, name: str, data: str, wait: float) -> None:
    """In a process of its own: take ``name``'s write side (it queues behind the readers),
    report ``dead``/``acquired``/``timeout`` to ``{data}:out``; each of its deadlock checks
    that finished counts in ``{data}:writer-checks``."""
    client = _procs.make_client(spec)
    deadlock.check = _counting_checks(lambda det: client.incr(f"{data}:writer-checks"))
    try:
        writer = rlocks.RWLock(
            name, client=client, namespace=ns, deadlock_timeout=DEADLOCK_TIMEOUT
        ).write_lock
        try:
            got = writer.acquire(timeout=wait)
        except rlocks.DeadlockError as exc:
            # Any waiter of the cycle may be the one accused, this one too: its message
            # describes the same cycle, for the test to check.
            client.rpush(f"{data}:messages", str(exc))
            client.rpush(f"{data}:out", "dead")
            return
        if got:
            writer.release()
        client.rpush(f"{data}:out", "acquired" if got else "timeout")
    except BaseException:  # noqa: BLE001 - reported to the test
        _procs.report_error(client, f"{data}:errors")
        raise


def _behind_a_queued_writer(
    client: Any, redis_url: str, ns: str, name: str, cycle: bool, wait: float,
    monkeypatch: pytest.MonkeyPatch,
) -> List[str]:
    """Thread A holds RLock ``L``; thread B (same process) reads RWLock ``R``; a writer
    in another process queues for ``R``; then A asks to read ``R``: granted to nobody but
    a reader, it still waits behind the queued writer (FIFO). With ``cycle``, B then asks
    for ``L``: A waits for the writer, the writer for B's read, B for A. Without, B holds
    on until A's wait and the writer's have each finished three more deadlock checks
    after both recorded their edges. Returns the three outcomes."""
    checks: Dict[str, int] = {}  # this process's finished deadlock checks, by owner

    def count(det: Any) -> None:
        checks[det.owner] = checks.get(det.owner, 0) + 1

    monkeypatch.setattr(deadlock, "check", _counting_checks(count))
    lock = rlocks.RLock(f"{name}-L", client=client, namespace=ns, deadlock_timeout=DEADLOCK_TIMEOUT)
    rw = rlocks.RWLock(f"{name}-R", client=client, namespace=ns, deadlock_timeout=DEADLOCK_TIMEOUT)
    data = f"{ns}:data"
    errors: List[BaseException] = []
    a_holds, b_holds, a_queued, b_done, a_ended = (threading.Event() for _ in range(5))

    def outcome(acquire: Any) -> str:
        try:
            got = acquire(timeout=wait)
        except rlocks.DeadlockError as exc:
            client.rpush(f"{data}:messages", str(exc))
            return "dead"
        return "acquired" if got else "timeout"

    a_owner: List[str] = []

    def thread_a() -> None:
        try:
            a_owner.append(identity.thread_owner())
            with lock:
                a_holds.set()
                assert b_holds.wait(30)
                wait_until(lambda: client.zcard(rw.write_lock._keys.queue) == 1, 60,
                           "the writer queued")
                a_queued.set()  # (set just before: B's wait for L may start with A's)
                result = outcome(rw.read_lock.acquire)
                a_ended.set()
                if result == "acquired":
                    rw.read_lock.release()
                if not cycle:
                    assert b_done.wait(30)
            client.rpush(f"{data}:out", result)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    def thread_b() -> None:
        try:
            with rw.read_lock:
                b_holds.set()
                assert a_queued.wait(60)
                if cycle:
                    result = outcome(lock.acquire)
                    if result == "acquired":
                        lock.release()
                    client.rpush(f"{data}:out", result)
                    return
                # No cycle: hold the read side while A and the writer wait and check
                # (each edge recorded, then three finished checks each, counted rather
                # than timed: a loaded run may check nothing in a given second), then
                # let them go. A wait that ended meanwhile (accused) ends this at once:
                # its outcome fails the test.
                wait_until(
                    lambda: all(client.exists(wait_key(ns, o)) for o in owners), 30,
                    "both waits recorded an edge",
                )
                a_from = checks.get(a_owner[0], 0)
                writer_from = int(client.get(f"{data}:writer-checks") or 0)

                def checked_or_ended() -> bool:
                    if a_ended.is_set() or client.llen(f"{data}:out"):
                        return True
                    return (checks.get(a_owner[0], 0) >= a_from + 3
                            and int(client.get(f"{data}:writer-checks") or 0) >= writer_from + 3)

                wait_until(checked_or_ended, 30, "three more deadlock checks of each wait")
            b_done.set()
            client.rpush(f"{data}:out", "released")
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    owners: List[str] = []
    ta, tb = threading.Thread(target=thread_a), threading.Thread(target=thread_b)
    ta.start()
    assert a_holds.wait(10)
    tb.start()
    assert b_holds.wait(10)
    writer = SPAWN.Process(
        target=queued_writer, args=({"url": redis_url}, ns, f"{name}-R", data, wait)
    )
    writer.start()
    try:
        if not cycle:
            wait_until(lambda: client.zcard(rw.write_lock._keys.queue) == 2, 60, "A queued")
            # queue members: '<arrival>:<side>:<owner>' (lua/lib.lua)
            owners.extend(m.decode().split(":", 2)[2]
                          for m in client.zrange(rw.write_lock._keys.queue, 0, -1))
        ta.join(wait + 60)
        tb.join(wait + 60)
        outcomes = _outcomes(client, data, 3)
        writer.join(30)
        assert writer.exitcode == 0
    finally:
        if writer.is_alive():
            writer.kill()
        writer.join(10)
    if errors:
        raise errors[0]
    return outcomes


@pytest.mark.slow
def test_a_reader_queued_behind_a_waiting_writer_is_part_of_a_cycle(
    client: Any, redis_url: str, ns: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue is an edge too: a reader that only readers hold back, but that waits
    behind a queued writer (FIFO), waits for that writer; a cycle through it raises
    DeadlockError in one waiter (before the fix, all three waited until their timeout)."""
    outcomes = _behind_a_queued_writer(client, redis_url, ns, name, cycle=True, wait=WAIT,
                                       monkeypatch=monkeypatch)
    assert outcomes.count("dead") == 1 and outcomes.count("acquired") == 2, outcomes
    message = client.lindex(f"{ns}:data:messages", 0).decode()
    assert f"{name}-L" in message and f"{name}-R" in message, message
    assert "a place ahead in the queue of RWLock" in message, message
    assert _no_edges(client, ns)


@pytest.mark.slow
def test_a_reader_queued_behind_a_writer_outside_any_cycle_is_not_accused(
    client: Any, redis_url: str, ns: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same queue edge without a cycle (the reader holding the write side's way
    never waits for the first lock): both waiters record edges and check, nobody is
    accused, and all proceed once the reader releases."""
    outcomes = _behind_a_queued_writer(client, redis_url, ns, name, cycle=False, wait=WAIT,
                                       monkeypatch=monkeypatch)
    assert outcomes == ["acquired", "acquired", "released"], outcomes
    assert _no_edges(client, ns)


_RW_ACQUIRE = scripts.load("rw_acquire", "rw_lib")


def _rw_ask(client: Any, keys: Any, owner: str, side: str) -> int:
    """One fair acquire of an RWLock side by ``owner`` (a 30 s lease, a 30 s queue entry
    when refused): the script's status."""
    return scripts.Call(_RW_ACQUIRE, (keys.hash, keys.queue, keys.leases, keys.fence),
                (owner, side, 30000, 0, "1", 30000, keys.wake, 100))(client).status


def test_deadlock_holders_names_the_live_entry_just_ahead(
    client: Any, ns: str, name: str
) -> None:
    """The script behind the queue edge: the holds, and the owner, side and arrivals of
    the live entry just ahead of the given owner's; nothing for the head, for no owner
    (fair=False), for an owner not queued, or when the entry ahead's lease has ended."""
    k = keys_for(ns, "rw", name)
    try:
        assert _rw_ask(client, k, "p:r1", "r") == scripts.GRANTED
        assert _rw_ask(client, k, "p:w", "w") == scripts.WAIT
        assert _rw_ask(client, k, "p:r2", "r") == scripts.WAIT  # behind a queued writer: FIFO

        def holders(owner: str) -> Any:
            holds, ahead = client.eval(deadlock._HOLDERS.source, 3, k.hash, k.queue,
                                       k.leases, "rw", owner)
            return sorted(h.decode() for h in holds), [a.decode() for a in ahead]

        # members '<arrival>:<side>:<owner>' (lua/lib.lua): in arrival order when sorted
        members = sorted(m.decode() for m in client.zrange(k.queue, 0, -1))
        assert [m.split(":", 2)[2] for m in members] == ["p:w", "p:r2"]
        arrivals = [m.split(":", 1)[0] for m in members]
        assert holders("p:r2") == (["r:p:r1"], ["p:w", "w", arrivals[0], arrivals[1]])
        assert holders("p:w") == (["r:p:r1"], [])  # the head waits for holders only
        assert holders("") == (["r:p:r1"], [])  # fair=False: the queue is not looked at
        assert holders("nobody") == (["r:p:r1"], [])
        client.zadd(k.queue, {members[0]: 1}, xx=True)  # the writer's entry lease has ended
        assert holders("p:r2") == (["r:p:r1"], [])
    finally:
        client.delete(k.hash, k.queue, k.leases)


@pytest.mark.timeout(120)
def test_a_cycle_the_victims_walk_cannot_close_is_reported_by_another_member(
    client: Any, ns: str, name: str
) -> None:
    """A writer blocked by more readers than a walk visits (``MAX_OWNERS``, holders without
    an edge included) waits, as the youngest wait of a cycle, for one of those readers,
    which waits for an RLock the writer holds. The writer's own walk stops before it
    comes back; the reader's closes the cycle at once but accuses the writer, so it
    leaves an accusation that the writer confirms and raises on."""
    options: Dict[str, Any] = {"client": client, "namespace": ns,
                               "deadlock_timeout": DEADLOCK_TIMEOUT}
    rw = rlocks.RWLock(f"{name}-rw", **options)
    x = rlocks.RLock(f"{name}-x", **options)
    done, a_holds, b_reads = threading.Event(), threading.Event(), threading.Event()
    ready = threading.Semaphore(0)
    outcome: Dict[str, Any] = {}

    def idle_reader() -> None:
        with rw.read_lock:
            ready.release()
            done.wait(90)

    def reader_b() -> None:  # a reader that then waits for x: the oldest wait
        with rw.read_lock:
            b_reads.set()
            a_holds.wait(30)
            outcome["b"] = x.acquire(timeout=WAIT)
            if outcome["b"]:
                x.release()

    def writer_a() -> None:  # holds x, then waits for the write side: the youngest wait
        with x:
            a_holds.set()
            # (after the reader's first check drew its wait's number: then this wait's is
            # higher, so this writer is the victim)
            wait_until(lambda: bool(_edges(client, ns)), 10, "the reader's edge")
            started = time.monotonic()
            try:
                outcome["a"] = rw.write_lock.acquire(timeout=10.0)
            except rlocks.DeadlockError as exc:
                outcome["a"] = exc
            outcome["a_waited"] = time.monotonic() - started

    idle = [threading.Thread(target=idle_reader) for _ in range(deadlock.MAX_OWNERS)]
    b, a = threading.Thread(target=reader_b), threading.Thread(target=writer_a)
    try:
        for t in idle:
            t.start()
        for _ in idle:
            assert ready.acquire(timeout=30)
        b.start()
        assert b_reads.wait(30)
        a.start()
        a.join(60)
        b.join(60)
    finally:
        done.set()
        a_holds.set()
        for t in idle + [a, b]:
            t.join(30)
    assert isinstance(outcome.get("a"), rlocks.DeadlockError), outcome
    assert "holds" in str(outcome["a"]) and repr(f"{name}-x") in str(outcome["a"])
    # found at one of the writer's first checks after the reader's accusation, not at its
    # time-out
    assert outcome["a_waited"] < 10 * DEADLOCK_TIMEOUT, outcome
    assert outcome["b"] is True  # the reader goes on once the writer gave x back
    assert _no_edges(client, ns)
    assert not any(True for _ in client.scan_iter(match=f"{ns}:accuse:*"))


@pytest.mark.parametrize("flavour", ["threading", "asyncio"])
def test_an_ended_wait_deletes_its_edge(
    redis_url: str, client: Any, ns: str, name: str, flavour: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of a wait deletes its edge, whatever its lease. An edge left behind says
    that a thread that moved on still waits, and a real holder's wait for that thread's
    lock is then confirmed as a cycle: a false DeadlockError (a bug hunt with 300 threads
    once saw one when the deletion was skipped).

    Nothing here races the clock: the wait ends when the test releases the holder, and
    before that the edge loses its lease while no check runs (from then on the checks
    are held back, so none can renew or rewrite it): only the ended wait's own deletion
    can remove it."""
    real = deadlock.check
    gate = threading.Lock()
    held_back = threading.Event()
    running = [0]

    def gated(det: Any) -> Any:
        with gate:
            if held_back.is_set():
                det.due = time.monotonic() + det.timeout
                return None
            running[0] += 1
        try:
            return (yield from real(det))
        finally:
            with gate:
                running[0] -= 1

    monkeypatch.setattr(deadlock, "check", gated)
    holder = rlocks.RLock(name, client=client, namespace=ns)
    assert holder.acquire()

    def hold_back_checks() -> None:
        with gate:
            held_back.set()

    def pin_the_edge() -> None:
        # (called once no check runs, nor will: none can renew or rewrite the edge)
        edges = _edges(client, ns)
        assert len(edges) == 1, edges
        assert client.persist(edges[0]) == 1
        holder.release()

    try:
        if flavour == "threading":
            waiter = rlocks.RLock(name, client=client, namespace=ns, deadlock_timeout=0.2)
            out: List[bool] = []

            def wait() -> None:
                got = waiter.acquire(timeout=60)
                out.append(got)
                if got:
                    waiter.release()

            t = threading.Thread(target=wait)
            t.start()
            wait_until(lambda: bool(_edges(client, ns)), 30, "the waiter's edge")
            hold_back_checks()
            wait_until(lambda: running[0] == 0, 30, "the check in progress to end")
            pin_the_edge()
            t.join(30)
            assert not t.is_alive(), "the waiter's acquire did not return"
            assert out == [True]
        else:

            async def main() -> bool:
                aclient = redis.asyncio.Redis.from_url(redis_url)
                try:
                    awaiter = rlocks.asyncio.RLock(
                        name, client=aclient, namespace=ns, deadlock_timeout=0.2
                    )

                    async def wait() -> bool:  # (a task owns what it acquired)
                        got = await awaiter.acquire(timeout=60)
                        if got:
                            await awaiter.release()
                        return got

                    task = asyncio.ensure_future(wait())
                    deadline = time.monotonic() + 30
                    while not _edges(client, ns):
                        assert time.monotonic() < deadline, "no edge for the waiter in 30 s"
                        await asyncio.sleep(0.01)
                    hold_back_checks()
                    while running[0]:  # (a check in progress runs in this loop)
                        assert time.monotonic() < deadline, "the check did not end"
                        await asyncio.sleep(0.01)
                    pin_the_edge()
                    return await asyncio.wait_for(task, 30)
                finally:
                    await aclient.aclose()

            assert asyncio.run(main()) is True
        # Deleted at the wait's end: the edge had no lease left to end it.
        assert _edges(client, ns) == []
    finally:
        if holder.owned():  # (pin_the_edge was not reached)
            holder.release()
        for key in _edges(client, ns):
            client.delete(key)


def test_a_stale_accusation_accuses_nobody(client: Any, ns: str, name: str) -> None:
    """An accusation whose cycle is no longer there (a member's edge is gone) is confirmed
    by the accused wait itself and ignored; one for another wait is ignored unread."""
    x = rlocks.RLock(f"{name}-x", client=client, namespace=ns)
    assert x.acquire()
    key = x._keys.hash
    try:
        det = _wait(ns, "w.a", "x", key, name)
        assert _checked(client, det) is None  # draws the wait's number, records its edge
        holder = identity.thread_owner()
        mine = deadlock.Edge("w.a", det.seq, "x", key)
        gone = deadlock.Edge(holder, det.seq - 1, "x", f"{key}-other")  # no such edge
        for seq in (det.seq, det.seq + 1):  # this wait's, and another's
            accusation = {"c": [["w.a", mine._replace(seq=seq).value()],
                                [holder, gone.value()]], "w": ["x", "x"]}
            client.set(accuse_key(ns, "w.a"), json.dumps(accusation), px=30000)
            assert _checked(client, det) is None
    finally:
        x.release()
        client.delete(wait_key(ns, "w.a"), accuse_key(ns, "w.a"))


@pytest.mark.parametrize("flavour", ["threading", "asyncio"])
@pytest.mark.timeout(60)
def test_waiters_past_the_deadlock_timeout_do_not_each_take_a_connection(
    redis_url: str, name: str, flavour: str
) -> None:
    """Every waiter past ``deadlock_timeout`` runs its own deadlock check. The checks (and
    the asks) of many waiters of one process must not each hold a connection of the pool
    at once (a probe once counted 56 connections for 64 threads waiting 2 s)."""
    admin = redis.Redis.from_url(redis_url)
    holder = rlocks.RLock(name, client=admin, namespace="rlocks-dl-conns")
    assert holder.acquire()
    tag = f"dl-conns-{uuid.uuid4().hex[:8]}"
    waiters = 32

    def threads() -> None:
        client = redis.Redis.from_url(redis_url, client_name=tag)
        lock = rlocks.RLock(name, client=client, namespace="rlocks-dl-conns",
                            deadlock_timeout=0.05)
        started = [threading.Thread(target=lambda: lock.acquire(timeout=30) and lock.release())
                   for _ in range(waiters)]
        for thread in started:
            thread.start()
        for thread in started:
            thread.join(40)

    async def tasks() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, client_name=tag)
        lock = rlocks.asyncio.RLock(name, client=client, namespace="rlocks-dl-conns",
                                    deadlock_timeout=0.05)

        async def wait() -> None:
            assert await lock.acquire(timeout=30)
            await lock.release()

        await asyncio.gather(*(wait() for _ in range(waiters)))

    runner = threading.Thread(
        target=threads if flavour == "threading" else lambda: asyncio.run(tasks()))
    runner.start()
    peak = 0
    try:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            mine = [c for c in admin.client_list() if c.get("name") == tag]
            peak = max(peak, len(mine))
            time.sleep(0.01)
    finally:
        holder.release()
        runner.join(60)
    # the wake-up subscriber, the renewer, and a few calls and reads in flight at once
    assert peak <= 6, peak
