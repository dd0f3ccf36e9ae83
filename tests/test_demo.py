"""The README's first command: the demo runs and verifies itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlocks import demo


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_on_the_test_server(capsys: pytest.CaptureFixture[str]) -> None:
    # RLOCKS_URL points at the session server (conftest), as a user's config would.
    assert demo.main(["--processes", "2", "--threads", "2", "--iterations", "20"]) == 0
    out = capsys.readouterr().out
    assert "lost updates             0" in out and "critical sections run    80" in out


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
    assert "OK: no lost updates" in run.stdout


def test_demo_rejects_bad_arguments_in_one_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "rlocks", "demo", "--threads", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2 and "must be at least 1" in run.stderr
    assert "Traceback" not in run.stderr
