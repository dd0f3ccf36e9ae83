"""Reading the server's own counters: memory, command counts, CPU, connected clients."""

from __future__ import annotations

from typing import Any, Dict
from urllib.parse import urlparse

import redis


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def command_breakdown(client: redis.Redis) -> Dict[str, int]:
    """Calls per command (INFO commandstats), without INFO itself: the probe's own INFO
    calls must not count as traffic of what is being measured."""
    stats: Dict[str, Any] = client.info("commandstats")
    out: Dict[str, int] = {}
    for k, v in stats.items():
        name = k[len("cmdstat_"):] if k.startswith("cmdstat_") else k
        if isinstance(v, dict) and name != "info":
            out[name] = int(v["calls"])
    return out


def command_stats(client: redis.Redis) -> Dict[str, Dict[str, int]]:
    """Calls and server µs per command so far (INFO commandstats), by lower-case name
    (``evalsha``, ``hget``, ``config|resetstat``...), INFO itself included: the caller
    takes deltas and leaves out what is not the traffic it measures."""
    stats: Dict[str, Any] = client.info("commandstats")
    out: Dict[str, Dict[str, int]] = {}
    for k, v in stats.items():
        name = k[len("cmdstat_"):] if k.startswith("cmdstat_") else k
        if isinstance(v, dict):
            out[name] = {"calls": int(v["calls"]), "usec": int(v["usec"])}
    return out


def script_usec(client: redis.Redis) -> int:
    """Server time (µs) spent in scripts so far: EVAL/EVALSHA/FCALL and their read-only
    forms (their usec covers the commands they call, which are also counted on their own)."""
    stats: Dict[str, Any] = client.info("commandstats")
    total = 0
    for k, v in stats.items():
        name = k[len("cmdstat_"):] if k.startswith("cmdstat_") else k
        if isinstance(v, dict) and name in ("eval", "evalsha", "eval_ro", "evalsha_ro",
                                            "fcall", "fcall_ro"):
            total += int(v["usec"])
    return total


def command_calls(client: redis.Redis) -> int:
    """Total commands the server has executed, INFO excluded."""
    return sum(command_breakdown(client).values())


def breakdown_delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def server_cpu_s(client: redis.Redis) -> float:
    """CPU seconds (user+sys) the server has used, main thread and children."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def client_count(client: redis.Redis) -> int:
    """Connections open on the server right now, this one included."""
    return len(client.client_list())


def subscriber_count(client: redis.Redis) -> int:
    """Connections in subscriber mode (SUBSCRIBE / PSUBSCRIBE / SSUBSCRIBE) right now."""
    n = 0
    for c in client.client_list():
        if any(int(c.get(f, 0) or 0) > 0 for f in ("sub", "psub", "ssub")):
            n += 1
    return n


def server_version(client: redis.Redis) -> str:
    return str(client.info("server").get("redis_version", "?"))


def is_loopback_url(url: str) -> bool:
    """The suite only ever talks to this machine: refuse any other host."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return True
    host = (parsed.hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")
