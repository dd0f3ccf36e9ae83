"""Spawnable workers for the fencing token tests (picklable under "spawn"; they import
only rlocks, redis and the stdlib, like ``_procs.py``, whose client specs they take).

Each reports through Redis lists named after ``data`` and through its exit code.
"""

from __future__ import annotations

import os
from typing import Any, Dict

from ._procs import EXIT_FAILED, EXIT_OK, make_client, make_mutex, report_error


def token_worker(
    spec: Dict[str, Any], kind: str, name: str, namespace: str, data: str, rounds: int,
    timeout: float,
) -> None:
    """``rounds`` times: acquire the mutex ``(kind, name)`` (re-entered once, which must
    keep the token), ``rpush {data}:tokens <token>`` while holding it, release. A token
    that changes on re-entry, or is not None after the release, is an error in
    ``{data}:errors``. So the list is in grant order (the holds exclude each other).
    """
    client = make_client(spec)
    try:
        prim, acquire, release, nesting = make_mutex(kind, name, client, namespace, ttl=30.0)
        for _ in range(rounds):
            assert acquire(timeout=timeout), "acquire timed out"
            token = prim.token
            assert isinstance(token, int), token
            client.rpush(f"{data}:tokens", token)
            for _level in range(1, nesting):
                assert acquire(timeout=timeout)
                assert prim.token == token, (prim.token, token)
            for _level in range(nesting):
                assert prim.token == token, (prim.token, token)
                release()
            assert prim.token is None, prim.token
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it failed
        report_error(client, f"{data}:errors")
        os._exit(EXIT_FAILED)
    os._exit(EXIT_OK)
