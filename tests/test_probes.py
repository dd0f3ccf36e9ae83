"""The benchmarks' probes against the real engine: they build their calls from the
engine's own KEYS and ARGV, so a change to those that breaks a probe fails here, not in
the next person's measurement."""

from __future__ import annotations

import re

import pytest
import redis

from benchmarks import script_cost

from .conftest import has_functions


def test_script_cost_runs_both_shapes_and_checks_every_reply(
    client: "redis.Redis[bytes]", redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if not has_functions(client):
        pytest.skip("the probe sends FCALL: Redis Functions need Redis 7.0+ "
                    f"(this server: {client.info('server')['redis_version']})")
    before = set(client.keys("rlocks:*script-cost*"))
    script_cost.report(redis_url, script_cost.BATCH, 1, commands=True)
    out = capsys.readouterr().out
    for shape in ("uncontended acquire+release", "contended section (hand-over + queue)"):
        row = re.search(re.escape(shape) + r"\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)\s+([\d.]+)", out)
        assert row is not None, out
        total, inner, _, calls = (float(x) for x in row.groups())
        # every repetition ran scripts that called Redis: a probe whose calls were refused
        # would have raised on the reply, and one measuring nothing would print zeros
        assert total > inner > 0 and calls >= 10, out
    assert "PEXPIRE" in out and "RPUSH" in out  # the hand-over's wake-up line was pushed
    assert set(client.keys("rlocks:*script-cost*")) == before, "the probe left keys"


def test_script_cost_refuses_counts_it_cannot_batch() -> None:
    with pytest.raises(SystemExit):
        script_cost.main(["-n", "100"])
