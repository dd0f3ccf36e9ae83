"""Redis key and channel names.

Every key and channel of one primitive is built as::

    <namespace>:<kind>:{<name>}[:<suffix>]

The ``{<name>}`` part is the Redis Cluster hash tag, so a primitive's hash, its wake-up
channel and any side keys map to the same slot and one Lua script may touch them all.
Inside the namespace and the name, ``%``, ``{`` and ``}`` are percent-escaped: a name can
then never end the hash tag early, and the mapping from (namespace, kind, name) to key is
one-to-one (two different names never share a key). Everything else, ``:``, spaces,
unicode, is kept as it is, so keys stay readable in ``redis-cli``.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

__all__ = ["PrimitiveKeys", "escape", "keys_for", "wait_key", "wait_seq_key"]


def escape(part: str) -> str:
    """Percent-escape ``%``, ``{`` and ``}`` (``%`` first, so the mapping is reversible)."""
    return part.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


class PrimitiveKeys(NamedTuple):
    """The Redis names one primitive uses."""

    hash: str  # owner id -> hold count, plus any per-primitive metadata fields
    channel: str  # wake-ups published by the release scripts

    def wake(self, role: str = "") -> str:
        """The wake-up channel for waiters of ``role`` (``""``: the primitive's main one).

        A primitive whose waiters want different news (an RWLock's writers wait for "the
        last reader left", its readers for "the writer left") gives each its own channel,
        in the same hash tag, so a release wakes only waiters that can proceed.
        """
        return f"{self.channel}:{role}" if role else self.channel

    def queued(self) -> Tuple[str, str, str, str, str, str]:
        """The six KEYS of every queue-and-hand-over script (``lua/queue_lib.lua``), in
        order: holds hash, holder lease ends, queue, entries, entry lease ends, channel.

        All carry the hash's tag, so one script touches one cluster slot.
        """
        base = self.hash
        return (
            base,
            f"{base}:leases",
            f"{base}:queue",
            f"{base}:entries",
            f"{base}:times",
            self.channel,
        )


def keys_for(namespace: str, kind: str, name: str) -> PrimitiveKeys:
    """Key and channel names for primitive ``name`` of ``kind`` in ``namespace``."""
    assert kind and ":" not in kind and "{" not in kind, kind
    base = f"{escape(namespace)}:{kind}:{{{escape(name)}}}"
    return PrimitiveKeys(hash=base, channel=f"{base}:wake")


def wait_key(namespace: str, owner: str) -> str:
    """The deadlock detector's wait-for edge of ``owner`` (see :mod:`.deadlock`).

    Tagged by the owner, not by a primitive: an owner waits for one primitive at a time,
    and the edges of a cycle are read one key at a time, wherever their slots are.
    """
    return f"{escape(namespace)}:wait:{{{escape(owner)}}}"


def wait_seq_key(namespace: str) -> str:
    """The counter that numbers the waits the deadlock detector records."""
    return f"{escape(namespace)}:wait-seq"
