"""Small contracts from the bug hunt of issue 10: copying, Condition on a write lock that
also reads, and wake-up channels with a client that decodes replies in another encoding;
and the engine's module map (issue 11): imports only downward, no cycle.
"""

from __future__ import annotations

import ast
import copy
import pickle
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest
import redis
import redis.asyncio as ra_redis
from click.testing import CliRunner
from redis.connection import Encoder, PythonRespSerializer

import rlocks
import rlocks.asyncio as ra
from rlocks import cli
from rlocks._engine.identity import process_token, thread_owner
from rlocks._engine.scripts import GRANTED

from ._servers import wait_until
from ._threads import hub_waiters
from .conftest import NAMESPACE

# -- copy / pickle ----------------------------------------------------------------------------


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps])
def test_primitives_refuse_to_be_copied_or_pickled(
    client: "redis.Redis[bytes]", name: str, copier: Any
) -> None:
    # threading's locks raise TypeError ("cannot pickle '_thread.RLock' object"); a copy
    # of an rlocks primitive would share this process's held state.
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    prims = [
        rlocks.RLock(name, client=client, namespace=NAMESPACE),
        rw,
        rw.read_lock,
        rw.write_lock,
        rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE),
        rlocks.BoundedSemaphore(name, 2, client=client, namespace=NAMESPACE),
        ra.RLock(name, namespace=NAMESPACE),
        ra.RWLock(name, namespace=NAMESPACE),
        ra.Semaphore(name, 2, namespace=NAMESPACE),
    ]
    for prim in prims:
        with pytest.raises(TypeError, match="cannot pickle or copy") as info:
            copier(prim)
        assert name in str(info.value)
    with pytest.raises(TypeError):
        copier(threading.RLock())  # the control row: what threading does


# -- Condition on a write lock whose thread also reads ----------------------------------------


@pytest.mark.timeout(60)
def test_condition_wait_on_write_lock_of_a_downgraded_writer(
    client: "redis.Redis[bytes]", name: str
) -> None:
    # A downgraded writer holds both sides. Waiting on a Condition of the write side lets
    # both go (no one could write while it still read, so no one could notify) and takes
    # both back, instead of failing to re-take the write side with UpgradeError.
    rw = rlocks.RWLock(name, client=client, ttl=10, namespace=NAMESPACE)
    key = rw.write_lock._keys.hash
    cond = threading.Condition(rw.write_lock)
    state: List[Any] = []
    errors: List[BaseException] = []

    def notifier() -> None:
        try:
            with cond:  # only possible while the waiter has let go of both sides
                state.append(dict(client.hgetall(key)))
                cond.notify()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    me = thread_owner()
    assert rw.write_lock.acquire() and rw.read_lock.acquire()
    t = threading.Thread(target=notifier)
    try:
        with cond:
            t.start()
            notified = cond.wait(timeout=20)
            assert notified, "the notifier never got the write lock"
            assert rw.write_lock._recursion_count() == 2
            assert rw.read_lock._recursion_count() == 1
            fields = client.hgetall(key)
            assert fields[f"w:{me}".encode()] == b"2" and fields[f"r:{me}".encode()] == b"1"
        t.join(10)
        assert not errors, errors
        # Exact fields: a substring test matched another thread's owner (serial 1 in 15).
        assert not {f"w:{me}".encode(), f"r:{me}".encode()} & set(state[0]), state
        rw.read_lock.release()
        rw.write_lock.release()
        assert not client.exists(key)
    finally:
        t.join(10)
        client.delete(key)


# -- wake-up channels and the client's encoding -------------------------------------------------


def _client(redis_url: str, encoding: str, packer: str, decode: bool) -> redis.Redis:
    """A client of ``encoding`` whose connections pack str arguments as redis-py's own
    packer does (``"own"``: in ``encoding``) or as it does when hiredis is installed
    (``"hiredis"``: as UTF-8, whatever the encoding). The second is hiredis' behaviour
    without needing hiredis: redis-py's packer given a UTF-8 encoder."""
    kwargs: Dict[str, Any] = {}
    if packer == "hiredis":
        kwargs["command_packer"] = PythonRespSerializer(
            6000, Encoder("utf-8", "strict", False).encode
        )
    pool = redis.ConnectionPool.from_url(
        redis_url, decode_responses=decode, encoding=encoding, socket_timeout=10, **kwargs
    )
    return redis.Redis(connection_pool=pool)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("packer", ["own", "hiredis"])
@pytest.mark.parametrize("encoding,suffix", [("latin-1", "plain"), ("utf-8", "café-ñ")])
def test_waiter_is_woken_whatever_the_clients_encoding(
    redis_url: str, name: str, decode: bool, packer: str, encoding: str, suffix: str
) -> None:
    # A wake-up hint names the primitive's key as the client's connections packed it (the
    # script publishes its KEYS[1]); the subscriber must recognise it coming back whether
    # redis-py hands it over as bytes or decoded, with redis-py's packer and with hiredis'
    # (which packs str as UTF-8 whatever the encoding). A latin-1 client only gets ASCII
    # names (test below), a UTF-8 one any name. The holder is another process's (its
    # scripts sent here as it sends them): its release reaches this process's waiter only
    # as a published hint, not through the local wake-up a release of this process gives.
    c = _client(redis_url, encoding, packer, decode)
    lock_name = f"{name}-{suffix}"
    ttl = 60.0
    # A long entry lease: without the hint the waiter asks again only after 20 s.
    waiter = rlocks.RLock(lock_name, client=c, ttl=ttl, namespace=NAMESPACE, entry_lease=60.0)
    ghost = "ghost:1:x:1"
    woken: List[float] = []
    errors: List[BaseException] = []
    owner: List[str] = []

    def wait() -> None:
        try:
            owner.append(thread_owner())
            assert waiter.acquire(timeout=ttl)
            woken.append(time.monotonic())
            waiter.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)

    assert waiter._spec.acquire(waiter, ghost, 0, 0)(c).status == GRANTED
    t = threading.Thread(target=wait)
    t.start()
    try:
        channel = waiter._keys.wake + process_token()
        wait_until(lambda: bool(hub_waiters(waiter)), 10, "the waiter")
        # (asked through the same client, so the name goes out as the hub's did)
        wait_until(
            lambda: c.pubsub_numsub(channel)[0][1] >= 1, 10, "the waiter's subscription"
        )
        released = time.monotonic()
        reply = waiter._spec.release(waiter, ghost, 1)(c)
        assert reply.status == GRANTED and reply.woken == tuple(owner), reply
        t.join(ttl)
        assert not errors, errors
        # Woken by the hint, not by asking again after 20 s.
        assert woken and woken[0] - released < 3.0, woken and woken[0] - released
    finally:
        t.join(10)
        c.delete(waiter._keys.hash, waiter._keys.queue)
        c.close()


@pytest.mark.parametrize("packer", ["own", "hiredis"])
def test_a_non_ascii_name_is_refused_on_a_client_that_is_not_utf8(
    redis_url: str, name: str, packer: str
) -> None:
    # redis-py packs "café" as b"caf\xe9" for a latin-1 client, but as b"caf\xc3\xa9"
    # when hiredis is installed: two processes of one program, one with hiredis, would
    # hold "one" lock at the same time. Refused whichever packer this process has.
    c = _client(redis_url, "latin-1", packer, False)
    utf8 = _client(redis_url, "utf-8", packer, False)
    # (ports nothing listens on: a Quorum's masters must differ, and nothing connects)
    quorum = rlocks.Quorum([redis.Redis(port=port, encoding=encoding, socket_timeout=0.1)
                            for port, encoding in ((1, "utf-8"), (2, "latin-1"), (3, "utf-8"))])
    try:
        made: List[Any] = [
            lambda: rlocks.RLock(f"{name}-café", client=c, namespace=NAMESPACE),
            lambda: rlocks.RWLock(f"{name}-café", client=c, namespace=NAMESPACE),
            lambda: rlocks.BoundedSemaphore(f"{name}-café", 2, client=c, namespace=NAMESPACE),
            lambda: rlocks.RLock(name, client=c, namespace=f"{NAMESPACE}-ñ"),
            lambda: rlocks.RLock(f"{name}-café", client=quorum, namespace=NAMESPACE),
        ]
        for make in made:
            with pytest.raises(ValueError, match="not ASCII and the client's encoding is 'latin-1'"):
                make()
        # A Condition's own name too (its keys carry it), threading and asyncio.
        plain = rlocks.RLock(name, client=c, namespace=NAMESPACE)
        with pytest.raises(ValueError, match="the name 'café' is not ASCII"):
            rlocks.Condition(plain, name="café")
        # The asyncio twins check alike (no I/O: the client is never used).
        aclient = ra_redis.Redis.from_url(redis_url, encoding="latin-1")
        with pytest.raises(ValueError, match="not ASCII"):
            ra.RLock(f"{name}-café", client=aclient, namespace=NAMESPACE)
        with pytest.raises(ValueError, match="the name 'café' is not ASCII"):
            ra.Condition(ra.RLock(name, client=aclient, namespace=NAMESPACE), name="café")
        # The CLI looks the name up only as a primitive would name it.
        result = CliRunner().invoke(
            cli.cli, ["--url", f"{redis_url}?encoding=latin-1", "inspect", f"{name}-café"]
        )
        assert result.exit_code == 2 and "not ASCII" in result.output, result.output
        for command in (["list", "café*"], ["top", "--json", "café*"]):
            result = CliRunner().invoke(
                cli.cli, ["--url", f"{redis_url}?encoding=latin-1", *command]
            )
            assert result.exit_code == 2 and "pattern 'café*' is not ASCII" in result.output, result.output
        # An encoding that does not send ASCII as ASCII is refused whatever the name.
        with pytest.raises(ValueError, match="does not send ASCII text as ASCII"):
            rlocks.RLock(name, client=redis.Redis(port=1, encoding="utf-16"))
        # An ASCII name is the same bytes whatever packs it, and a UTF-8 client's names too.
        rlocks.RLock(name, client=c, namespace=NAMESPACE)
        rlocks.RLock(f"{name}-café", client=utf8, namespace=NAMESPACE)
        # nothing written (this test's keys only: other tests' keys come and go meanwhile)
        assert [k for k in c.scan_iter(match=f"{NAMESPACE}*") if name.encode() in k] == []
    finally:
        c.close()
        utf8.close()


# -- the engine's module map ------------------------------------------------------------------

PACKAGE = Path(rlocks.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, modules: Set[str]) -> Iterator[Tuple[str, int]]:
    """(rlocks module, line) of every import in ``path`` that can run: at load time or
    inside a function, but not under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # ``from pkg import mod`` imports the module; ``from mod import name`` the module.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules
                       else source for alias in node.names]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                yield target, node.lineno


def _import_graph() -> Dict[str, List[Tuple[str, int]]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: sorted(set(_runtime_imports(path, set(files)))) for name, path in files.items()}


def _engine_map() -> List[str]:
    doc = (PACKAGE / "_engine" / "__init__.py").read_text(encoding="utf-8")
    return re.findall(r"^- ``(\w+)``:", doc, flags=re.MULTILINE)


def test_the_engine_module_map_lists_every_module_once_and_none_shadows_the_stdlib() -> None:
    listed = _engine_map()
    present = sorted(p.stem for p in (PACKAGE / "_engine").glob("*.py") if p.stem != "__init__")
    assert sorted(listed) == present
    assert len(set(listed)) == len(listed)
    # An engine module named like a standard library one (the old ``inspect``) shadows it
    # for anyone who runs a file from that folder, and misleads every reader.
    assert not set(present) & set(sys.stdlib_module_names)


def test_engine_imports_run_only_downward_in_the_module_map() -> None:
    rank = {f"rlocks._engine.{m}": i for i, m in enumerate(_engine_map())}
    upward = [
        f"{source} -> {target} (line {line})"
        for source, edges in _import_graph().items() if source in rank
        for target, line in edges if target in rank and rank[target] >= rank[source]
    ]
    assert upward == []


def test_no_import_cycle_in_the_package() -> None:
    graph = {name: [target for target, _ in edges] for name, edges in _import_graph().items()}
    cycles: List[List[str]] = []
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in graph[node]:
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def test_renewal_touches_no_private_member_of_another_object() -> None:
    # The renewer once read six private members of Primitive; now it renews holds
    # (holds.Hold) through their public interface only, and touches no private member of
    # any object but its own.
    tree = ast.parse((PACKAGE / "_engine" / "renewal.py").read_text(encoding="utf-8"))
    attributes = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    assert any(isinstance(node.value, ast.Name) and node.value.id == "hold"
               for node in attributes), "renewal.py no longer renews holds?"
    used = {
        node.attr
        for node in attributes
        if node.attr.startswith("_") and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    }
    assert used == set(), used
