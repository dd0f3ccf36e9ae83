"""Redis key and channel names.

Every key and channel of one primitive is built as::

    <namespace>:<kind>:{<name>}[:<suffix>]

The ``{<name>}`` part is the Redis Cluster hash tag, so a primitive's hash, its wake-up
channel and any side keys map to the same slot and one Lua script may touch them all.
Inside the namespace and the name, ``%``, ``{`` and ``}`` are percent-escaped: a name can
then never end the hash tag early, and the mapping from (namespace, kind, name) to key is
one-to-one (two different names never share a key). Everything else, ``:``, spaces,
unicode, is kept as it is, so keys stay readable in ``redis-cli``.

Fencing tokens come from a counter per namespace and cluster slot,
``<namespace>:fence:{<tag>}``, whose tag is chosen to land in the primitive's slot (so
a script may touch it with the primitive's keys): at most 16,384 such keys per
namespace, whatever the number of names, each shared by every primitive of its slot.
"""

from __future__ import annotations

import binascii
from functools import lru_cache
from typing import List, NamedTuple, Optional, Tuple

__all__ = ["PrimitiveKeys", "escape", "fence_key", "keys_for", "wait_key", "wait_seq_key"]

_SLOTS = 16384  # Redis Cluster's hash slots: a key's slot is CRC16(tag) mod 16384
_slot_tags: List[Optional[str]] = []


def _slot_tag(slot: int) -> str:
    """A short hash tag whose keys land in ``slot`` (the table is built on first use)."""
    if not _slot_tags:
        # Four letters from '`'..'o', one nibble each: CRC16 is linear in those 16 bits
        # and the first 16,384 strings already reach every slot (about 20 ms, once).
        table: List[Optional[str]] = [None] * _SLOTS
        left = _SLOTS
        for i in range(1 << 16):
            raw = bytes((0x60 | i >> 12, 0x60 | (i >> 8) & 15, 0x60 | (i >> 4) & 15, 0x60 | i & 15))
            slot_of = binascii.crc_hqx(raw, 0) % _SLOTS
            if table[slot_of] is None:
                table[slot_of] = raw.decode("ascii")
                left -= 1
                if not left:
                    break
        assert all(table), "every slot has a tag"
        _slot_tags[:] = table
    found = _slot_tags[slot]
    assert found is not None
    return found


def _slot(key: str) -> int:
    """The cluster slot of ``key`` (redis-py's rule: the first non-empty ``{...}``)."""
    raw = key.encode("utf-8")
    start = raw.find(b"{")
    if start > -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1:end]
    return binascii.crc_hqx(raw, 0) % _SLOTS


@lru_cache(maxsize=4096)
def fence_key(hash_key: str) -> str:
    """The fencing token counter of the primitive whose holds hash is ``hash_key``:
    ``<namespace>:fence:{<tag>}``, in the same cluster slot."""
    # hash_key is "<escaped namespace>:<kind>:{<escaped name>}": neither part has a '{'
    namespace = hash_key[: hash_key.index("{") - 1].rsplit(":", 1)[0]
    return f"{namespace}:fence:{{{_slot_tag(_slot(hash_key))}}}"


def escape(part: str) -> str:
    """Percent-escape ``%``, ``{`` and ``}`` (``%`` first, so the mapping is reversible)."""
    return part.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


class PrimitiveKeys(NamedTuple):
    """The Redis names one primitive uses."""

    hash: str  # owner id -> hold count, plus any per-primitive metadata fields
    channel: str  # prefix of the per-process wake-up channels (see wake)

    def wake(self, entry: str) -> str:
        """The wake-up channel of the process whose queue entry is ``entry`` (its process
        token): a hand-over publishes each woken process's lines there only
        (``lua/queue_lib.lua`` ``finish``), so it wakes no other process. The name keeps
        the hash tag, so a cluster script may publish on it as a shard channel. It also
        names the entry's wake-up list, which a waiter reading its own lines BLPOPs (the
        list's key is then in the primitive's slot).
        """
        return f"{self.channel}:{entry}"

    def queued(self) -> Tuple[str, str, str, str, str, str, str, str, str]:
        """The nine KEYS of every queue-and-hand-over script (``lua/queue_lib.lua``,
        ``lua/op_lib.lua``), in order: holds hash, holder lease ends, queue, entries, entry
        lease ends, wake-up channel prefix, fencing token counter, op records, op record ends.

        All but the counter carry the hash's tag and the counter a tag of the same slot,
        so one script touches one cluster slot.
        """
        base = self.hash
        return (
            base,
            f"{base}:leases",
            f"{base}:queue",
            f"{base}:entries",
            f"{base}:times",
            self.channel,
            fence_key(base),
            f"{base}:ops",
            f"{base}:op-ends",
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
