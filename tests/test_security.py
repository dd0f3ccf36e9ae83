"""Hostile names, least-privilege ACL users, TLS, and secrets kept out of output.

- Names and namespaces full of quotes, brackets, braces, newlines, ``%`` and Lua syntax
  are inert (hypothesis): acquire and release work, the one key created is exactly the
  escaped one, and nothing else appears in or disappears from Redis.
- rlocks works under an ACL user allowed only its namespace's keys and channels and only
  the commands it sends (:data:`ACL_RULES`, the line ``docs/operations.md`` documents):
  RLock, RWLock and Semaphore acquire, wait and are woken, renew and release; the same
  user is refused any other key.
- TLS: a throwaway CA and server certificate, redis-server with ``--tls-port``, a
  ``rediss://`` client: acquire, wait, wake-up, release.
- A password in the URL never shows in rlocks' reprs, messages or log records.
"""

from __future__ import annotations

import logging
import socket
import ssl
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Set

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlocks
from rlocks._engine import clients
from rlocks.server import TemporaryRedisServer, free_port

from ._servers import RENEWED_TTL, make_tls_files, server_version, wait_renewed, wait_until
from ._threads import hub_waiters
from .conftest import NAMESPACE, holds_in, without_counters

# -- hostile names -------------------------------------------------------------------------

NASTY = st.lists(
    st.sampled_from(
        list("{}[]()'\"\\\n\r\t%:*?-=;,.# ")
        + ["]]", "[[", "--", "..", "{a}", "%7B", "nil", "end", "redis.call('FLUSHALL')", "\x00", "é", "🔒"]
    ),
    min_size=1,
    max_size=12,
).map("".join)


def listening(prim: Any) -> bool:
    """Whether this process's wake-up subscriber for ``prim``'s client and namespace has
    its subscription confirmed by the server (no I/O)."""
    hub = prim._backend._hubs.get(prim._keys.wake)
    return hub is not None and hub.ready.is_set()


def expected_key(namespace: str, kind: str, name: str) -> bytes:
    """Written out here, not imported: the test states the escaping rule itself."""

    def esc(part: str) -> str:
        return part.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")

    return f"{esc(namespace)}:{kind}:{{{esc(name)}}}".encode()


@pytest.mark.timeout(120)
@settings(
    max_examples=60, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=NASTY, namespace=NASTY)
def test_hostile_names_and_namespaces_are_inert(client: Any, name: str, namespace: str) -> None:
    namespace = f"{NAMESPACE}-fuzz{namespace}"

    def fuzz_keys() -> Set[bytes]:
        # Only this test's namespaces (filtered here, not by a glob the hostile namespace
        # could subvert): other tests' keys expire or appear on their own schedule.
        return {k for k in without_counters(client.keys("*"))
                if k.startswith(f"{NAMESPACE}-fuzz".encode())}

    before = fuzz_keys()
    lock = rlocks.RLock(name, client=client, namespace=namespace, ttl=10)
    rw = rlocks.RWLock(name, client=client, namespace=namespace, ttl=10)
    sem = rlocks.BoundedSemaphore(name, 2, client=client, namespace=namespace, ttl=10)
    assert lock.acquire(blocking=False) and lock.acquire(blocking=False)
    assert rw.read_lock.acquire(blocking=False)
    assert sem.acquire(blocking=False)
    # Each primitive's hash and, beside it under the same tag, its holders' lease ends
    # (an RLock's one lease is its hash's own expiry).
    assert fuzz_keys() - before == {
        expected_key(namespace, "rlock", name),
        *(key + suffix
          for key in (expected_key(namespace, "rw", name), expected_key(namespace, "sem", name))
          for suffix in (b"", b":l")),
    }
    assert holds_in(client, expected_key(namespace, "rlock", name)) == {
        rlocks._engine.identity.thread_owner().encode(): b"2"
    }
    assert lock.locked() and rw.read_lock.locked() and not rw.write_lock.locked()
    other = {}

    def contend() -> None:
        other["rlock"] = rlocks.RLock(name, client=client, namespace=namespace).acquire(blocking=False)
        other["write"] = rw.write_lock.acquire(blocking=False)

    t = threading.Thread(target=contend)
    t.start()
    t.join(10)
    assert other == {"rlock": False, "write": False}
    lock.release()
    lock.release()
    rw.read_lock.release()
    sem.release()
    assert fuzz_keys() == before


# -- ACL -------------------------------------------------------------------------------------

ACL_NAMESPACE = "rlocks-acl"

#: Everything rlocks sends on a standalone server, and the commands its Lua scripts call
#: (ACL checks those too).
ACL_RULES = [
    "on",
    "resetkeys", f"~{ACL_NAMESPACE}:*",
    "resetchannels", f"&{ACL_NAMESPACE}:*",
    "-@all",
    # sent by rlocks itself: the scripts, the wake-up subscriber, and the plain reads and
    # writes of the deadlock detector (wait-for edges, the wait counter) and of a settled
    # interrupted acquire
    "+evalsha", "+script|load", "+subscribe", "+unsubscribe",
    "+get", "+set", "+incr", "+del", "+hget",
    # called by its scripts (lua/*.lua)
    "+exists", "+type", "+time", "+publish", "+pexpire", "+persist", "+pttl",
    "+hset", "+hsetnx", "+hdel", "+hincrby", "+hexists", "+hkeys", "+hlen",
    "+zadd", "+zrem", "+zscore", "+zrange", "+zrangebyscore", "+zremrangebyscore",
]


@pytest.fixture
def acl_user(client: Any) -> Iterator[Dict[str, str]]:
    user, password = f"rlocks-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    client.acl_setuser(user, reset=True)
    client.execute_command("ACL", "SETUSER", user, f">{password}", *ACL_RULES)
    yield {"username": user, "password": password}
    client.acl_deluser(user)


@pytest.mark.timeout(60)
def test_rlocks_works_under_a_least_privilege_acl_user(
    client: Any, redis_url: str, acl_user: Dict[str, str]
) -> None:
    host_port = redis_url.split("//", 1)[1]
    limited = redis.Redis.from_url(
        f"redis://{host_port}", socket_timeout=10, **acl_user
    )
    # Scripts must be loaded by this user (NOSCRIPT recovery) on a fresh script cache.
    client.script_flush()
    lost: List[Any] = []
    prims = {
        "rlock": rlocks.RLock("r", client=limited, namespace=ACL_NAMESPACE, ttl=RENEWED_TTL, on_lost=lost.append),
        "write": rlocks.RWLock("w", client=limited, namespace=ACL_NAMESPACE, ttl=RENEWED_TTL, on_lost=lost.append).write_lock,
        "sem": rlocks.Semaphore("s", 1, client=limited, namespace=ACL_NAMESPACE, ttl=RENEWED_TTL, on_lost=lost.append),
    }
    for kind, prim in prims.items():
        assert prim.acquire(timeout=5), kind
        if kind != "sem":
            assert prim.locked()
    # Renewal, by this user's commands: each lease is pushed back twice.
    for prim in prims.values():
        wait_renewed(client, prim._keys.hash)
    assert not lost
    # Waiting and wake-up: another process's waiter is simulated by a thread that waits on
    # a second object (for the semaphore, a second process owner is needed, so the thread
    # waits on the RLock and the write side only) and is woken by the release.
    results: Dict[str, Any] = {}

    def waiter(kind: str) -> None:
        other = (
            rlocks.RLock("r", client=limited, namespace=ACL_NAMESPACE, ttl=5)
            if kind == "rlock"
            else rlocks.RWLock("w", client=limited, namespace=ACL_NAMESPACE, ttl=5).write_lock
        )
        began = time.monotonic()
        results[kind] = other.acquire(timeout=10)
        results[kind + "-took"] = time.monotonic() - began
        if results[kind]:
            other.release()

    threads = [threading.Thread(target=waiter, args=(k,)) for k in ("rlock", "write")]
    for t in threads:
        t.start()
    wait_until(
        lambda: len(hub_waiters(prims["rlock"]) + hub_waiters(prims["write"])) == 2
        and listening(prims["rlock"]),
        10,
        "both waiters registered, their subscriber listening",
    )
    for prim in prims.values():
        prim.release()
    for t in threads:
        t.join(10)
    assert results["rlock"] is True and results["write"] is True, results
    assert results["rlock-took"] < 5 and results["write-took"] < 5  # woken, not timed out
    assert not lost
    # Nothing left but counters kept by design (fencing tokens, the deadlock detector's
    # wait numbers): see conftest.without_counters.
    assert without_counters(client.keys(f"{ACL_NAMESPACE}:*")) == []
    # The same user may not touch anything outside its namespace.
    with pytest.raises(redis.exceptions.NoPermissionError):
        rlocks.RLock("x", client=limited, namespace=NAMESPACE).acquire(blocking=False)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.get("some-other-key")
    limited.close()


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server() -> Iterator[Dict[str, Any]]:
    if server_version() < (6, 0):
        pytest.skip(f"TLS needs redis-server 6 or newer; found {server_version() or 'none'}")
    with tempfile.TemporaryDirectory(prefix="rlocks-tls-") as folder:
        files = make_tls_files(folder)
        tls_port = free_port()
        server = TemporaryRedisServer(
            [
                "--tls-port", str(tls_port),
                "--tls-cert-file", files.cert,
                "--tls-key-file", files.key,
                "--tls-ca-cert-file", files.ca,
                "--tls-auth-clients", "no",
            ]
        )
        try:
            server.start()
        except RuntimeError as exc:
            if "tls" in str(exc).lower():
                version = ".".join(map(str, server_version()))
                pytest.skip(f"server {version} ({server.binary}) was built without TLS")
            raise
        try:
            yield {"url": f"rediss://127.0.0.1:{tls_port}/0", "ca": files.ca, "port": tls_port}
        finally:
            server.stop()


@pytest.mark.timeout(30)
def test_acquire_wait_release_over_tls(tls_server: Dict[str, Any]) -> None:
    secure = redis.Redis.from_url(
        tls_server["url"], ssl_ca_certs=tls_server["ca"], socket_timeout=10
    )
    assert secure.ping()
    assert secure.connection_pool.connection_class is redis.SSLConnection
    lock = rlocks.RLock("tls", client=secure, namespace=NAMESPACE, ttl=RENEWED_TTL)
    assert lock.acquire()
    wait_renewed(secure, lock._keys.hash)  # renewal over TLS
    result: Dict[str, Any] = {}

    def waiter() -> None:
        other = rlocks.RLock("tls", client=secure, namespace=NAMESPACE, ttl=5)
        result["got"] = other.acquire(timeout=10)
        if result["got"]:
            other.release()

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: hub_waiters(lock) and listening(lock), 10,
               "the waiter to subscribe over TLS")
    released = time.monotonic()
    lock.release()
    t.join(10)
    assert result["got"] is True
    assert time.monotonic() - released < 3
    # An unverified certificate is refused: the client really checks the CA.
    bad = redis.Redis.from_url(tls_server["url"], socket_timeout=5, ssl_cert_reqs="required")
    with pytest.raises(redis.exceptions.ConnectionError):
        bad.ping()
    secure.close()


@pytest.mark.timeout(30)
def test_tls_certificates_pass_strict_verification(tls_server: Dict[str, Any]) -> None:
    """The test CA and certificate satisfy X.509 strict mode on every Python: 3.13's default
    context turns it on (key identifiers, CA constraints, key usage), older ones do not."""
    context = ssl.create_default_context(cafile=tls_server["ca"])
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_connection(("127.0.0.1", tls_server["port"]), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"PING\r\n")
            assert tls.recv(64) == b"+PONG\r\n"


# -- secrets ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_passwords_in_urls_stay_out_of_reprs_messages_and_logs(
    client: Any, redis_url: str, acl_user: Dict[str, str], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = acl_user["password"]
    host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    url = f"redis://{acl_user['username']}:{secret}@{host_port}/0"
    monkeypatch.setenv("RLOCKS_URL", url)
    caplog.set_level(logging.DEBUG, logger="rlocks")
    seen: List[str] = []
    lost = threading.Event()

    lock = rlocks.RLock("pw", namespace=ACL_NAMESPACE, ttl=0.5, on_lost=lambda _l: lost.set())
    rw = rlocks.RWLock("pw", namespace=ACL_NAMESPACE)
    sem = rlocks.Semaphore("pw", 1, namespace=ACL_NAMESPACE)
    assert lock.acquire() and rw.read_lock.acquire() and sem.acquire()
    seen += [repr(p) for p in (lock, rw, rw.read_lock, rw.write_lock, sem)]
    seen += [str(p.client) for p in (lock, sem)]
    # Errors: not owner, lost, and bad arguments all name the lock, never the URL.
    t_err: List[BaseException] = []
    t = threading.Thread(target=lambda: t_err.append(_catch(lock.release)))
    t.start()
    t.join(10)
    client.delete(lock._keys.hash)
    assert lost.wait(5)
    errors = [t_err[0], _catch(lock.release), _catch(lambda: lock.acquire(timeout=-3))]
    rw.read_lock.release()
    sem.release()
    # Connection failures with the password in the URL: a dead port and a wrong password.
    dead = f"redis://{acl_user['username']}:{secret}@127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("RLOCKS_URL", dead)
    errors.append(_catch(lambda: rlocks.RLock("pw", namespace=ACL_NAMESPACE).acquire()))
    wrong = url.replace(secret, secret[::-1])
    monkeypatch.setenv("RLOCKS_URL", wrong)
    errors.append(_catch(lambda: rlocks.RLock("pw", namespace=ACL_NAMESPACE).acquire()))
    assert all(e is not None for e in errors), errors
    seen += [str(e) for e in errors] + [repr(e) for e in errors]
    seen += [r.getMessage() for r in caplog.records]
    seen += [r.exc_text or "" for r in caplog.records]
    assert caplog.records, "expected rlocks to log the lost hold"
    for text in seen:
        assert secret not in text and secret[::-1] not in text, text
    clients._clients.clear()  # drop the cached clients built for these URLs


def _catch(call) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - returned for inspection
        return exc
    return None
