"""rlocks.server.TemporaryRedisServer: the throwaway server of the demo, tests and benchmarks.

free_port() names a port that was free a moment ago; suites that run side by side (CI's
lanes) can take it before the server binds it. The server must then not pass another
program's server off as its own: start() chooses again, or refuses a port it was given.
"""

from __future__ import annotations

from typing import Iterator, List

import pytest
import redis

from rlocks import server
from rlocks.server import TemporaryRedisServer


@pytest.fixture
def other() -> Iterator[TemporaryRedisServer]:
    with TemporaryRedisServer() as s:
        yield s


def _pid(s: TemporaryRedisServer) -> int:
    return int(redis.Redis(port=s.port).info("server")["process_id"])


def test_a_chosen_port_taken_before_the_bind_is_chosen_again(
    other: TemporaryRedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports: List[int] = [other.port]  # the first choice is taken by `other` meanwhile
    real = server.free_port
    monkeypatch.setattr(server, "free_port", lambda: ports.pop() if ports else real())
    with TemporaryRedisServer() as mine:
        assert mine.port != other.port
        assert mine.process is not None and _pid(mine) == mine.process.pid
    assert other.process is not None and _pid(other) == other.process.pid  # untouched


def test_a_given_port_that_another_server_holds_is_refused(other: TemporaryRedisServer) -> None:
    with pytest.raises(RuntimeError, match=f"port {other.port} belongs to another server"):
        TemporaryRedisServer(port=other.port).start()
    assert other.process is not None and _pid(other) == other.process.pid  # untouched
