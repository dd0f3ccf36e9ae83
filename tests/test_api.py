"""The public surface as a new user meets it: silence by default, constructor errors that
name the public class, owned() and extend(), on every primitive and its asyncio twin."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Dict, List

import pytest
import redis
import redis.asyncio

import rlocks
import rlocks.asyncio as ra
from rlocks._engine.identity import thread_owner

from ._servers import wait_until
from ._threads import in_thread
from .conftest import NAMESPACE, snapshot, without_counters

# -- logging: a library is silent unless the program configures logging -----------------

_LOSE_A_HOLD = textwrap.dedent(
    """
    import sys
    {configure}
    import redis, rlocks
    client = redis.Redis.from_url(sys.argv[1])
    lock = rlocks.RLock(sys.argv[2], client=client, namespace=sys.argv[3], auto_renew=False)
    lock.acquire()
    client.delete(lock._keys.hash)          # the hold is gone: release() reports it lost
    try:
        lock.release()
    except rlocks.LockLostError:
        print("lost")
    """
)


def _lose_a_hold(redis_url: str, name: str, configure: str) -> "subprocess.CompletedProcess[str]":
    script = _LOSE_A_HOLD.format(configure=configure)
    return subprocess.run(
        [sys.executable, "-c", script, redis_url, name, NAMESPACE],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONWARNINGS": ""},
    )


def test_lost_warning_is_silent_when_the_program_configured_no_logging(
    redis_url: str, name: str
) -> None:
    quiet = _lose_a_hold(redis_url, name, configure="")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "lost"
    assert quiet.stderr == ""  # not through logging.lastResort
    # The same program with logging configured does get the warning: the silence above
    # is the NullHandler's doing, not a warning that was never logged.
    loud = _lose_a_hold(redis_url, name + "-2", configure="import logging; logging.basicConfig()")
    assert loud.returncode == 0, loud.stderr
    assert "lost by" in loud.stderr and "WARNING:rlocks" in loud.stderr


def test_the_package_logger_has_a_null_handler_and_no_other() -> None:
    import logging

    handlers = logging.getLogger("rlocks").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]


# -- constructor errors name the public class and the keyword meant ---------------------

CONSTRUCTORS: Dict[str, Callable[..., Any]] = {
    "rlocks.RLock": rlocks.RLock,
    "rlocks.Lock": rlocks.Lock,
    "rlocks.RWLock": rlocks.RWLock,
    "rlocks.Semaphore": rlocks.Semaphore,
    "rlocks.BoundedSemaphore": rlocks.BoundedSemaphore,
    "rlocks.asyncio.RLock": ra.RLock,
    "rlocks.asyncio.Lock": ra.Lock,
    "rlocks.asyncio.RWLock": ra.RWLock,
    "rlocks.asyncio.Semaphore": ra.Semaphore,
    "rlocks.asyncio.BoundedSemaphore": ra.BoundedSemaphore,
}


@pytest.mark.parametrize("label", list(CONSTRUCTORS))
def test_a_peer_keyword_names_the_public_class_and_the_rlocks_keyword(label: str) -> None:
    cls = CONSTRUCTORS[label]
    with pytest.raises(TypeError) as lease:
        cls("x", timeout=10)  # redis-py Lock's lease keyword
    text = str(lease.value)
    assert text.startswith(f"{label}('x'): ") and "'timeout'" in text
    assert "ttl=" in text and "Primitive" not in text and "__init__" not in text

    with pytest.raises(TypeError) as wait:
        cls("x", blocking_timeout=5)  # redis-py Lock's wait keyword
    text = str(wait.value)
    assert text.startswith(f"{label}('x'): ") and "acquire(timeout=" in text

    with pytest.raises(TypeError) as other:
        cls("x", expire=5)  # python-redis-lock's lease keyword
    assert str(other.value).startswith(f"{label}('x'): ") and "ttl=" in str(other.value)

    with pytest.raises(TypeError) as unknown:
        cls("x", colour="red")
    assert str(unknown.value) == f"{label}('x'): got an unexpected keyword argument 'colour'"

    with pytest.raises(TypeError) as missing:
        cls()
    assert str(missing.value).startswith(f"{label}(): ") and "'name'" in str(missing.value)


@pytest.mark.parametrize(
    "keyword",
    ["timeout", "expire", "blocking_timeout", "blocking", "sleep", "thread_local",
     "auto_renewal", "id", "token"],
)
def test_every_peer_keyword_the_readme_lists_gets_a_hint(keyword: str) -> None:
    with pytest.raises(TypeError) as raised:
        rlocks.RLock("x", **{keyword: 1})
    assert str(raised.value).startswith(
        f"rlocks.RLock('x'): got an unexpected keyword argument '{keyword}'; "
    )
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert f"`{keyword}=`" in readme.split("## Migrating", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("label", list(CONSTRUCTORS))
def test_constructors_keep_their_explicit_signature(label: str) -> None:
    # help() and inspect show the real keywords, not (*args, **kwargs).
    parameters = inspect.signature(CONSTRUCTORS[label]).parameters
    assert {"name", "client", "ttl", "auto_renew", "namespace", "on_lost"} <= set(parameters)
    assert all(p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in parameters.values())


@pytest.mark.parametrize("label", list(CONSTRUCTORS))
def test_validation_errors_inside_the_constructor_pass_unchanged(label: str) -> None:
    with pytest.raises(TypeError, match=r"ttl must be a number"):
        CONSTRUCTORS[label]("x", ttl="long")


@pytest.mark.parametrize(
    ("public", "decorate"),
    [
        ("synchronized", lambda **kw: rlocks.synchronized("x", **kw)),
        ("limited", lambda **kw: rlocks.limited("x", 2, **kw)),
    ],
    ids=["synchronized", "limited"],
)
def test_decorators_point_peer_keywords_to_theirs(
    public: str, decorate: Callable[..., Any]
) -> None:
    with pytest.raises(TypeError) as wait:
        decorate(blocking_timeout=5)
    assert f"{public}(timeout=" in str(wait.value)
    with pytest.raises(TypeError) as lease:
        decorate(expire=5)
    assert "ttl=" in str(lease.value) and "rlocks." in str(lease.value)
    decorate(timeout=5)  # the decorator's own wait keyword stays valid


# -- owned() and extend() ---------------------------------------------------------------

SYNC_KINDS = ["rlock", "lock", "read", "write", "semaphore", "bounded"]


def make(kind: str, name: str, client: Any, **options: Any) -> Any:
    options.setdefault("namespace", NAMESPACE)
    if kind == "rlock":
        return rlocks.RLock(name, client=client, **options)
    if kind == "lock":
        return rlocks.Lock(name, client=client, **options)
    if kind in ("read", "write"):
        rw = rlocks.RWLock(name, client=client, **options)
        return rw.read_lock if kind == "read" else rw.write_lock
    if kind == "semaphore":
        return rlocks.Semaphore(name, 2, client=client, **options)
    return rlocks.BoundedSemaphore(name, 1, client=client, **options)


def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_owned_is_the_callers_local_hold(client: Any, name: str, kind: str) -> None:
    lock = make(kind, name, client)
    assert lock.owned() is False
    assert lock.acquire()
    try:
        assert lock.owned() is True
        # Locks and semaphore permits belong to the thread that took them; a Lock's
        # hold to its process (any of its threads may release it).
        assert in_thread(lock.owned) is (kind == "lock")
    finally:
        lock.release()
    assert lock.owned() is False


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_extend_on_a_never_held_primitive_is_refused_without_io(
    client: Any, name: str, kind: str
) -> None:
    lock = make(kind, name, client)
    before = snapshot(client)
    with pytest.raises(rlocks.NotOwnedError, match="cannot extend un-acquired"):
        lock.extend()
    with pytest.raises(RuntimeError):
        lock.extend(10)
    assert snapshot(client) == before


@pytest.mark.parametrize("kind", SYNC_KINDS)
@pytest.mark.parametrize(
    "bad, error", [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), ("5", TypeError)]
)
def test_extend_with_a_bad_ttl_raises_before_any_io(
    client: Any, name: str, kind: str, bad: Any, error: type
) -> None:
    lock = make(kind, name, client, ttl=5, auto_renew=False)
    with pytest.raises(error):
        lock.extend(bad)  # not held: the ttl is checked first
    assert lock.acquire()
    try:
        before = snapshot(client)
        with pytest.raises(error):
            lock.extend(bad)
        after = snapshot(client)
        assert after.keys() == before.keys()
        assert after == before  # same fields and values (the lease end is a field, or PTTL)
    finally:
        lock.release()


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_extend_resets_the_lease_and_never_shortens_it(client: Any, name: str, kind: str) -> None:
    lock = make(kind, name, client, ttl=2, auto_renew=False)
    key = lock._keys.hash
    assert lock.acquire()
    try:
        assert 0 < client.pttl(key) <= 2000
        # Default: the primitive's own ttl again, once some of it has run out.
        assert eventually(lambda: client.pttl(key) < 1500)
        lock.extend()
        assert client.pttl(key) > 1500
        # Given seconds: the caller's lease is now that long.
        lock.extend(60)
        assert client.pttl(key) > 50_000
        # Less than what is left keeps what is left.
        lock.extend(1)
        assert client.pttl(key) > 50_000
        assert lock.owned()
    finally:
        lock.release()
    assert client.exists(key) == 0


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_the_renewer_does_not_cut_back_an_extended_lease(
    client: Any, name: str, kind: str
) -> None:
    lock = make(kind, name, client, ttl=0.6)  # renewed about every 0.2 s
    key = lock._keys.hash
    assert lock.acquire()
    try:
        lock.extend(60)
        hold = lock._hold(thread_owner())
        renewed_before = hold.due
        # Wait for the renewer's next pass over this hold (its next renewal moves on).
        assert eventually(lambda: hold.due > renewed_before)
        assert client.pttl(key) > 50_000  # renewal with ttl=0.6 kept the longer lease
    finally:
        lock.release()


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_extend_on_a_lost_hold_raises_lock_lost(client: Any, name: str, kind: str) -> None:
    lost: List[Any] = []
    lock = make(kind, name, client, ttl=30, auto_renew=False, on_lost=lost.append)
    assert lock.acquire()
    client.delete(lock._keys.hash)  # as `rlocks release --force` or an expiry would
    assert lock.owned() is True  # local truth: nobody has told this process yet
    with pytest.raises(rlocks.LockLostError):
        lock.extend()
    wait_until(lambda: lost == [lock], 5, "on_lost (it runs on the callback thread)")
    assert lock.owned() is False
    # Known lost: refused without I/O, and release() is still owed.
    with pytest.raises(rlocks.LockLostError):
        lock.extend(5)
    with pytest.raises(rlocks.LockLostError):
        lock.release()
    with pytest.raises(rlocks.NotOwnedError):
        lock.extend()
    assert client.exists(lock._keys.hash) == 0


def test_extend_of_one_thread_leaves_another_threads_read_lease_alone(
    client: Any, name: str
) -> None:
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE, ttl=60, auto_renew=False)
    assert rw.read_lock.acquire()
    try:
        other = rlocks.RWLock(name, client=client, namespace=NAMESPACE, ttl=1, auto_renew=False)

        def read_and_extend() -> int:
            assert other.read_lock.acquire()
            other.read_lock.extend(2)
            pttl: int = client.pttl(rw.read_lock._keys.hash)
            other.read_lock.release()
            return pttl

        # The key lives as long as its longest live lease (the first reader's 60 s).
        assert in_thread(read_and_extend) > 50_000
    finally:
        rw.read_lock.release()


# -- the asyncio twins ------------------------------------------------------------------

ASYNC_KINDS = ["rlock", "lock", "read", "write", "semaphore", "bounded"]


def amake(kind: str, name: str, client: Any, **options: Any) -> Any:
    options.setdefault("namespace", NAMESPACE)
    if kind == "rlock":
        return ra.RLock(name, client=client, **options)
    if kind == "lock":
        return ra.Lock(name, client=client, **options)
    if kind in ("read", "write"):
        rw = ra.RWLock(name, client=client, **options)
        return rw.read_lock if kind == "read" else rw.write_lock
    if kind == "semaphore":
        return ra.Semaphore(name, 2, client=client, **options)
    return ra.BoundedSemaphore(name, 1, client=client, **options)


@pytest.mark.parametrize("kind", ASYNC_KINDS)
def test_asyncio_owned_and_extend(redis_url: str, client: Any, name: str, kind: str) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis.from_url(redis_url)
        lock = amake(kind, name, c, ttl=2, auto_renew=False)
        key = lock._keys.hash
        assert lock.owned() is False
        with pytest.raises(rlocks.NotOwnedError):
            await lock.extend()
        with pytest.raises(ValueError):
            await lock.extend(0)
        assert await lock.acquire()
        assert lock.owned() is True

        async def other_task() -> bool:
            return bool(lock.owned())

        # Locks and semaphore permits belong to the task that took them (a Lock's
        # hold to its process).
        assert await asyncio.create_task(other_task()) is (kind == "lock")
        await lock.extend(60)
        assert await c.pttl(key) > 50_000
        await lock.extend(1)
        assert await c.pttl(key) > 50_000
        await c.delete(key)
        with pytest.raises(rlocks.LockLostError):
            await lock.extend()
        assert lock.owned() is False
        with pytest.raises(rlocks.LockLostError):
            await lock.release()
        await c.aclose()

    asyncio.run(main())


# -- one situation, one message ---------------------------------------------------------


def test_reentering_a_lost_lock_says_the_same_whether_the_loss_was_noticed_or_not(
    client: Any, name: str
) -> None:
    messages = []
    # Not noticed yet: the lease ran out with nobody renewing; the acquire script finds it.
    unnoticed = rlocks.RLock(name, client=client, namespace=NAMESPACE, ttl=0.2, auto_renew=False)
    assert unnoticed.acquire()
    assert eventually(lambda: client.exists(unnoticed._keys.hash) == 0)
    with pytest.raises(rlocks.LockLostError) as first:
        unnoticed.acquire()
    messages.append(str(first.value))
    assert first.value.lock is unnoticed  # type: ignore[attr-defined]
    with pytest.raises(rlocks.LockLostError):
        unnoticed.release()

    # Noticed: `rlocks release --force` deleted it and the renewer reported the loss.
    lost = threading.Event()
    noticed = rlocks.RLock(
        name, client=client, namespace=NAMESPACE, ttl=0.6, on_lost=lambda _lock: lost.set()
    )
    assert noticed.acquire()
    client.delete(noticed._keys.hash)
    assert lost.wait(10)
    with pytest.raises(rlocks.LockLostError) as second:
        noticed.acquire()
    messages.append(str(second.value))
    # The error belongs to the lock, so an enclosing `with` unwinds without a second report.
    assert second.value.lock is noticed  # type: ignore[attr-defined]
    with pytest.raises(rlocks.LockLostError):
        noticed.release()
    assert messages[0] == messages[1]


# -- the docs say what the code does ----------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_doc_synopsis_lists_each_commands_real_options() -> None:
    import re

    from rlocks.cli import cli

    text = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()
    block = text.split("rlocks [--url URL] [--namespace NS] [--json] COMMAND [ARGS]", 1)[1]
    block = block.split("```", 1)[0]
    documented: Dict[str, str] = {}
    command = None
    for line in block.splitlines():
        match = re.match(r"^  ([a-z]+)\b(.*)$", line)
        if match:
            command = match.group(1)
            documented[command] = match.group(2)
        elif command is not None and line.strip():
            documented[command] += " " + line
    assert set(documented) == set(cli.commands)  # type: ignore[attr-defined]
    global_options = {"--url", "--namespace", "--json"}
    for name, usage in documented.items():
        params = cli.commands[name].params  # type: ignore[attr-defined]
        real = {opt for p in params for opt in p.opts if opt.startswith("-")} - global_options
        written = set(re.findall(r"(?<![\w-])--?[a-z][a-z-]*", usage))
        assert {o for o in real if o.startswith("--")} == {
            o for o in written if o.startswith("--")
        }, name
        # A short option is written next to its long form, as --help shows it.
        for p in params:
            shorts = [o for o in p.opts if not o.startswith("--")]
            if any(s in written for s in shorts):
                assert all(o in written for o in p.opts), (name, p.opts)


# -- what a name is shared by -----------------------------------------------------------


def test_a_name_is_per_kind_lock_rwlock_and_semaphore_are_independent(
    client: Any, redis_url: str, name: str
) -> None:
    # As the README says: RLock, RWLock and (Bounded)Semaphore of one name are three
    # primitives; a threading and an asyncio object of one kind and name are one.
    lock = rlocks.RLock(name, client=client, namespace=NAMESPACE)
    assert lock.acquire()
    try:
        rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)

        def write_once() -> bool:
            got = rw.write_lock.acquire(blocking=False)
            if got:
                rw.write_lock.release()
            return bool(got)

        assert in_thread(write_once)
        sem = rlocks.Semaphore(name, 1, client=client, namespace=NAMESPACE)
        assert in_thread(lambda: sem.acquire(blocking=False))
        # Semaphore and BoundedSemaphore share a name's state, and refuse each other.
        with pytest.raises(ValueError, match="Semaphore"):
            rlocks.BoundedSemaphore(name, 1, client=client, namespace=NAMESPACE).acquire(
                blocking=False
            )
        sem.release()
        # Another thread's RLock of the same name is the same lock: refused.
        assert in_thread(
            lambda: rlocks.RLock(name, client=client, namespace=NAMESPACE).acquire(
                blocking=False
            )
        ) is False

        async def other_task() -> bool:
            c = redis.asyncio.Redis.from_url(redis_url)
            try:
                twin = ra.RLock(name, client=c, namespace=NAMESPACE)
                return bool(await twin.acquire(blocking=False))
            finally:
                await c.aclose()

        assert asyncio.run(other_task()) is False  # the asyncio twin is the same lock too
    finally:
        lock.release()


# -- the README's two ACL lines, on a real server ---------------------------------------


def _readme_acl_rules(user: str, namespace: str) -> List[str]:
    """The README's ``ACL SETUSER <user> ...`` line, for ``namespace``, as SETUSER args."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = [line.strip() for line in readme.splitlines()
             if line.strip().startswith(f"ACL SETUSER {user} ")]
    assert len(lines) == 1, f"README has {len(lines)} ACL lines for user {user!r}"
    words = lines[0].split()[3:]  # after ACL SETUSER <user>
    assert ">PASSWORD" in words and "~rlocks:*" in words and "&rlocks:*" in words
    rules = []
    for word in words:
        if word == ">PASSWORD":
            continue
        rules.append(word.replace("rlocks:*", f"{namespace}:*"))
    return rules


def _acl_client(admin: Any, redis_url: str, user: str, rules: List[str]) -> "redis.Redis[bytes]":
    password = f"pw-{user}"
    admin.acl_setuser(user, reset=True)
    admin.execute_command("ACL", "SETUSER", user, f">{password}", *rules)
    host_port = redis_url.split("//", 1)[1]
    return redis.Redis.from_url(
        f"redis://{host_port}", username=user, password=password, socket_timeout=10
    )


@pytest.mark.timeout(120)
def test_readme_acl_lines_library_and_command_line(
    client: Any, redis_url: str, name: str
) -> None:
    from click.testing import CliRunner

    from rlocks.cli import cli

    ns = f"acl-{name[-12:]}"
    tag = name[-8:]
    library_user, cli_user = f"rlocks-lib-{tag}", f"rlocks-cli-{tag}"
    lib = _acl_client(client, redis_url, library_user, _readme_acl_rules("rlocks", ns))
    ops = _acl_client(client, redis_url, cli_user, _readme_acl_rules("rlocks-ops", ns))
    try:
        client.script_flush()  # each user must be able to load the scripts itself
        # The library line: every operation of every primitive, extend included.
        lock = rlocks.RLock("r", client=lib, namespace=ns, ttl=5, auto_renew=False)
        rw = rlocks.RWLock("w", client=lib, namespace=ns, ttl=5, auto_renew=False)
        sem = rlocks.BoundedSemaphore("s", 2, client=lib, namespace=ns, ttl=5, auto_renew=False)
        assert lock.acquire(timeout=5) and lock.acquire(timeout=5) and lock.locked()
        lock.extend(10)
        assert rw.write_lock.acquire(timeout=5) and rw.read_lock.acquire(timeout=5)
        rw.write_lock.extend()
        rw.write_lock.release()
        assert rw.read_lock.locked() and not rw.write_lock.locked()
        assert sem.acquire(timeout=5)
        sem.extend(10)
        # A waiter (another thread) subscribes to the namespace's wake-up channel.
        assert in_thread(lambda: lock.acquire(timeout=0.2)) is False

        # The command line under the operator's line: list, inspect, watch, top, release.
        url = f"redis://{cli_user}:pw-{cli_user}@{redis_url.split('//', 1)[1]}"
        runner = CliRunner()

        def run(*args: str) -> Any:
            result = runner.invoke(cli, ["--url", url, "--namespace", ns, *args])
            assert result.exit_code == 0, (args, result.output)
            return result

        listed = run("list").output
        assert "RLock" in listed and "RWLock" in listed and "BoundedSemaphore" in listed
        assert "r" in run("inspect", "r").output
        run("watch", "r", "--count", "1")
        assert "RLock" in run("top", "--count", "1").output
        assert json.loads(run("top", "--json").output)["primitives"]
        run("release", "--force", "r", "--yes", "--kind", "rlock")
        assert lib.exists(lock._keys.hash) == 0
        # ... and the library line alone is not enough for it (why there are two lines).
        lib_url = f"redis://{library_user}:pw-{library_user}@{redis_url.split('//', 1)[1]}"
        refused = runner.invoke(cli, ["--url", lib_url, "--namespace", ns, "list"])
        assert refused.exit_code != 0 and "permission" in refused.output.lower()

        for _level in range(2):  # each level of the force-released hold reports the loss
            with pytest.raises(rlocks.LockLostError):
                lock.release()
        rw.read_lock.release()
        sem.release()
        assert without_counters(client.keys(f"{ns}:*")) == []
    finally:
        lib.close()
        ops.close()
        client.acl_deluser(library_user, cli_user)


def test_license_file_matches_the_declared_license_and_a_changelog_exists() -> None:
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    assert config["metadata"]["license"] == "MIT"
    license_text = open(os.path.join(ROOT, "LICENSE"), encoding="utf-8").read()
    assert license_text.startswith("MIT License") and "the rlocks authors" in license_text
    changelog = open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8").read()
    assert "## [Unreleased]" in changelog and f"## [{rlocks.__version__}]" in changelog
