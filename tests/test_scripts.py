"""Script loading and running (FCALL and EVALSHA, NOSCRIPT, the reply decoder) against a real Redis.

The scripts' own semantics, edge-case ARGV included, are tested one call at a time and
against a model in tests/test_handover_scripts.py (issue 12 replaced the old script set
these tests used to call: rw_lib / sem_lib layouts, claims, wake counts).
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Any, List

import pytest
import redis

import rlocks
from rlocks._engine import scripts
from rlocks._engine.keys import keys_for
from rlocks._engine.scripts import BUSY, GRANTED, Reply, load_queued, run
from rlocks.server import TemporaryRedisServer

from .conftest import NAMESPACE, has_functions

ACQUIRE = load_queued("rlock_acquire")


def _context() -> List[Any]:
    return ["", "PUBLISH", 1, 2000]


def test_every_script_has_a_header_contract() -> None:
    folder = resources.files("rlocks._engine").joinpath("lua")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".lua"))
    queue_scripts = {f"{kind}_{op}.lua" for kind in ("rlock", "rw", "sem")
                     for op in ("acquire", "release", "leave", "renew")}
    assert queue_scripts | {"queue_lib.lua", "force_release.lua"} <= set(names)
    lib = folder.joinpath("queue_lib.lua").read_text("utf-8")
    assert "KEYS[1]" in lib and "ARGV[1]" in lib and "tonumber" in lib
    for name in sorted(queue_scripts | {"force_release.lua"}):
        lines = folder.joinpath(name).read_text("utf-8").splitlines()
        header = "\n".join(line for line in lines[:next(
            i for i, line in enumerate(lines) if line and not line.startswith("--"))])
        assert header.startswith(f"-- {name[:-4]}:"), name
        assert "ARGV[" in header and ("repl" in header.lower() or "Return" in header), name


def test_noscript_is_recovered(client: Any, name: str) -> None:
    keys = keys_for(NAMESPACE, "rlock", name).queued()
    client.script_flush()
    reply = run(client, ACQUIRE, keys, [*_context(), "h:1:n:1", "h:1:n", 1000, 1, 0, 0])
    assert reply.status == GRANTED and reply.value == 1 and 0 < reply.aux <= 1000
    client.delete(*keys)


def test_concurrent_acquires_grant_exactly_one(client: Any, name: str) -> None:
    keys = keys_for(NAMESPACE, "rlock", name).queued()
    replies: List[Any] = []  # each contender's Reply, or the exception it raised
    barrier = threading.Barrier(8)

    def contender(i: int) -> None:
        owner, entry = f"h:{i}:n:1", f"h:{i}:n"
        try:
            barrier.wait(10)
            args = [*_context(), owner, entry, 5000, 1, 0, 0]
            replies.append((owner, run(client, ACQUIRE, keys, args)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            replies.append((owner, exc))

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Every contender answered (a crashed one would not be a loser), exactly one granted.
    assert len(replies) == 8 and all(isinstance(r, Reply) for _, r in replies), replies
    winners = [owner for owner, r in replies if r.granted]
    assert len(winners) == 1
    assert all(r.status == BUSY for owner, r in replies if owner not in winners)
    assert client.hgetall(keys[0]) == {winners[0].encode(): b"1"}
    client.delete(*keys)


def _runs(client: Any, command: str) -> int:
    """Runs of ``command`` that did not fail (an FCALL of a function not loaded fails)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def test_queue_scripts_run_as_functions_and_a_lost_library_is_loaded_again(name: str) -> None:
    """On a server with Redis Functions a plain client sends each queue script as FCALL
    of the queue library (compiled once per server, not once per call); a FUNCTION FLUSH
    (or a restart without persistence) costs one reload, not a failure. On Redis 6.2 the
    refused FCALL is tried once per pool, then EVALSHA it is."""
    with TemporaryRedisServer() as server:  # its own server: the counts are this test's
        c = redis.Redis.from_url(server.url)
        lock = rlocks.RLock(name, client=c, namespace=NAMESPACE, auto_renew=False)
        assert lock.acquire()
        lock.release()
        functions = has_functions(c)
        if functions:
            assert _runs(c, "fcall") == 2 and _runs(c, "evalsha") == 0
            c.execute_command("FUNCTION", "FLUSH")
        fcalls, evalshas = _runs(c, "fcall"), _runs(c, "evalsha")
        assert lock.acquire()
        lock.release()
        if functions:
            assert (_runs(c, "fcall") - fcalls, _runs(c, "evalsha") - evalshas) == (2, 0)
            # one flat field/value list per library (a mapping under RESP3)
            libraries = [lib if isinstance(lib, dict) else dict(zip(lib[::2], lib[1::2]))
                         for lib in c.function_list()]
            names = [lib.get(b"library_name", lib.get("library_name")) for lib in libraries]
            assert names == [lock._acquire_script.library.name.encode()]
        else:
            assert (_runs(c, "fcall"), _runs(c, "evalsha") - evalshas) == (0, 2)
        assert not lock.locked()
        c.close()


@pytest.mark.parametrize("error, refused, missing", [
    (redis.ResponseError("Function not found"), True, True),
    (redis.ResponseError("unknown command 'FCALL', with args beginning with: 'x'"), True, False),
    (redis.ResponseError("unsupported command 'fcall'"), True, False),  # a proxy's words
    (redis.exceptions.NoPermissionError(
        "User u has no permissions to run the 'fcall' command"), True, False),
    # the script's own errors, and a refused key: no fallback would change them
    (redis.exceptions.NoPermissionError("No permissions to access a key"), False, False),
    (redis.ResponseError("RLOCKS_BAD_ARG owner"), False, False),
    (redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."), False, False),
])
def test_which_fcall_errors_fall_back(error: Any, refused: bool, missing: bool) -> None:
    """An FCALL answer that says the call did not run for want of the function (load it)
    or of FCALL itself (EVALSHA from then on); every other error goes to the caller."""
    assert (scripts._function_refused(error), scripts._function_missing(error)) == (
        refused, missing)


def test_a_release_runs_when_the_server_is_out_of_memory(name: str) -> None:
    """At maxmemory (noeviction) a release, which frees memory, must still run; an
    acquire is refused and leaves nothing. As FCALL the functions say so by their flags
    (an unflagged function is refused whole under OOM)."""
    with TemporaryRedisServer() as server:  # its own server: it is filled to the brim
        c = redis.Redis.from_url(server.url)
        held = rlocks.RLock(name, client=c, namespace=NAMESPACE, auto_renew=False)
        other = rlocks.RLock(f"{name}-other", client=c, namespace=NAMESPACE, auto_renew=False)
        assert held.acquire()
        c.config_set("maxmemory-policy", "noeviction")
        c.config_set("maxmemory", int(c.info("memory")["used_memory"]) + 200_000)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(10_000):
                c.set(f"fill:{i}", "x" * 1000)
        # (OutOfMemoryError from a function; an EVAL script's refused write says the same
        # inside a ResponseError, before the script changed anything)
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            other.acquire(blocking=False)
        assert not c.exists(other._keys.hash)
        held.release()
        assert not c.exists(held._keys.hash)
        c.close()


class _LosingFunctions(redis.Redis):
    """A server whose libraries vanish right after each load (a FUNCTION FLUSH racing the
    load, or a pool whose connections reach another node)."""

    def function_load(self, code: str, replace: bool = False) -> Any:
        loaded = super().function_load(code, replace=replace)
        self.function_flush()
        return loaded


def test_a_library_that_does_not_stick_falls_back_to_evalsha_and_loads_the_script(
    name: str,
) -> None:
    """Each recovery step is taken once per call, whatever came before: the library that
    keeps vanishing sends the call to EVALSHA, whose NOSCRIPT still gets its one load (a
    shared budget of steps once left NOSCRIPT unrecovered there)."""
    with TemporaryRedisServer() as server:  # its own server: flushed at will
        c = _LosingFunctions.from_url(server.url)
        if not has_functions(c):
            pytest.skip("this server has no Redis Functions (6.2): nothing to lose")
        c.script_flush()
        keys = keys_for(NAMESPACE, "rlock", name).queued()
        reply = run(c, ACQUIRE, keys, [*_context(), "h:1:n:1", "h:1:n", 1000, 1, 0, 0])
        assert reply.status == GRANTED and reply.value == 1
        assert scripts._functions.get(c.connection_pool) is False  # EVALSHA from now on
        c.close()
