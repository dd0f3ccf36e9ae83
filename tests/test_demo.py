"""The README's first command: the demo runs its three use cases and verifies itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from typing import Any, Dict

import pytest
from click.testing import CliRunner

from rlocks import cli, demo

SMALL = ["--processes", "2", "--threads", "2", "--iterations", "20", "--pool-size", "2"]


def checks(report: Dict[str, Any]) -> Dict[str, Any]:
    return {c["check"]: c for c in report["checks"]}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_on_the_test_server(capsys: pytest.CaptureFixture[str]) -> None:
    # RLOCKS_URL points at the session server (conftest), as a user's config would.
    assert cli.main(["demo", *SMALL]) == 0
    out = capsys.readouterr().out
    assert re.search(r"RLock: lost updates +0 +ok", out), out
    assert re.search(r"Semaphore: peak pool use +2 \(limit 2\) +ok", out), out
    assert re.search(r"RWLock: half-done updates seen +0 +ok", out), out
    assert re.search(r"RLock: handoff latency p50 / p99 +[0-9.]+ / [0-9.]+ ms", out), out
    assert "FAILED" not in out and "OK: every check holds" in out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_json_report_holds_every_check() -> None:
    result = CliRunner().invoke(cli.cli, ["demo", *SMALL, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    found = checks(report)
    assert report["ok"] and all(c["ok"] for c in report["checks"])
    assert found["RLock: nested critical sections run"]["value"] == "80 of 80"
    assert found["RLock: lost updates"]["value"] == "0"
    assert found["Semaphore: peak pool use"]["value"] == "2 (limit 2)"
    assert found["RWLock: lost writes"]["value"] == "0"
    assert int(found["RWLock: peak concurrent readers"]["value"]) > 1
    assert found["lock keys left in Redis"]["value"] == "0"
    assert report["handoff_ms"]["samples"] > 0 and report["handoff_ms"]["p99"] is not None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_starts_its_own_server_without_rlocks_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLOCKS_URL")
    run = subprocess.run(
        [sys.executable, "-m", "rlocks", "demo", "--processes", "2", "--iterations", "10"],
        capture_output=True, text=True, timeout=110,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "started a throwaway redis-server" in run.stdout
    assert "OK: every check holds" in run.stdout


def test_a_worker_waits_for_its_start_longer_than_its_socket_timeout(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker waits for each phase's start token while the other processes finish the
    # previous phase; on a loaded machine that took longer than its client's socket
    # timeout, and one BLPOP as long as the whole wait died with redis TimeoutError.
    # Scaled down: a 1 s socket timeout, a 3 s wait in which no token ever comes.
    monkeypatch.setattr(demo, "WORKER_SOCKET_TIMEOUT", 1.0)
    monkeypatch.setattr(demo, "START_TIMEOUT", 3)
    monkeypatch.setattr(demo, "START_SLICE", 0.5)
    began = time.monotonic()
    demo._worker(redis_url, "rlocks-test", uuid.uuid4().hex[:8], demo.Options(threads=1))
    assert time.monotonic() - began >= 3  # it waited the whole START_TIMEOUT, then gave up


def test_a_failed_check_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "run", lambda *args, **kwargs: False)
    assert CliRunner().invoke(cli.cli, ["demo"]).exit_code == 1


def test_no_server_to_start_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLOCKS_URL")
    monkeypatch.setenv("RLOCKS_REDIS_SERVER", "/nonexistent/redis-server")
    result = CliRunner().invoke(cli.cli, ["demo", *SMALL])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.strip().startswith("Error: no --url or RLOCKS_URL")


@pytest.mark.parametrize("args, message", [
    (["--threads", "0"], "0 is not in the range x>=1"),
    (["--processes", "1", "--threads", "2", "--pool-size", "2"], "must be less than"),
])
def test_demo_rejects_bad_arguments(args: Any, message: str) -> None:
    run = subprocess.run([sys.executable, "-m", "rlocks", "demo", *args],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stderr
    assert "Traceback" not in run.stderr


def test_demo_with_an_unreachable_url_is_one_line() -> None:
    from rlocks.server import free_port

    result = CliRunner().invoke(
        cli.cli, ["--url", f"redis://127.0.0.1:{free_port()}/0", "demo", *SMALL])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "cannot reach Redis" in result.stderr


@pytest.mark.parametrize("kind, role, part", [
    ("rlock", "counter", 0), ("sem", "pool", 2), ("rw", "table", 1),
])
def test_a_lock_key_left_fails_the_check(client: Any, kind: str, role: str, part: int) -> None:
    """The "lock keys left" check counts every key of the demo's primitives: a holds
    hash, a lease set or a queue left in Redis fails the demo."""
    keys = demo._Keys(uuid.uuid4().hex[:8])
    key = demo._lock_keys("rlocks-test", kind, keys.lock(role))[part]
    if part:
        client.zadd(key, {"left": 1})  # the queue or the lease set: sorted sets
    else:
        client.hset(key, "left", 1)
    try:
        report = demo._verify(client, "rlocks-test", keys, demo.Options(),
                              {phase: True for phase in demo.PHASES}, {})
    finally:
        client.delete(key)
    found = checks(report)["lock keys left in Redis"]
    assert (found["value"], found["ok"], report["ok"]) == ("1", False, False)
