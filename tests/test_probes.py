"""The benchmarks' probes against the real engine: they build their calls with the
engine's own specs (KEYS and ARGV as the engine sends them), so a change to those that
breaks a probe fails here, not in the next person's measurement."""

from __future__ import annotations

import pytest
import redis

from benchmarks import script_cost
from rlocks.server import TemporaryRedisServer


def test_script_cost_runs_every_shape_and_checks_every_reply(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A server of its own: the probe reads INFO commandstats deltas call by call, which
    # other clients' commands (the suite's renewers) would land in.
    with TemporaryRedisServer() as server:
        found = script_cost.report(server.url, 20, 1)
        own = redis.Redis(port=server.port)
        try:
            left = own.keys("rlocks:*script-cost*")
        finally:
            own.close()
    out = capsys.readouterr().out
    titles = [shape.title for shape in script_cost.shapes(redis.Redis(), "x")]
    assert sorted(found) == sorted(titles) and all(t in out for t in titles)
    for title, (result,) in found.items():
        # every call ran a script that called Redis (a refused call would have raised on
        # its reply), and no call was left out for another client's traffic
        assert result.left_out == 0, title
        assert result.calls and all(us > 0 and nested >= 1 and by
                                    for us, nested, by in result.calls.values()), title
        assert result.plain_us > 0 and result.plain_nested >= 2, title
    rlock = found["RLock, uncontended"][0]
    assert list(rlock.calls) == ["acquire: free, nobody waits",
                                 "release: the last level, nobody waits"]
    for title in ("RLock, contended (fair)", "RWLock write side, contended (fair)",
                  "Semaphore(1), contended (fair)"):
        calls = found[title][0].calls
        assert calls["release: wakes the head waiter"][2].get("PUBLISH") == 1, title
        assert "ZADD" in calls["acquire: the releaser again, queued"][2], title
    assert left == [], "the probe left keys"


def test_script_cost_refuses_counts_it_cannot_use() -> None:
    with pytest.raises(SystemExit):
        script_cost.main(["-n", "0"])
    with pytest.raises(SystemExit):
        script_cost.main(["--url", "redis://10.1.2.3:6379"])
