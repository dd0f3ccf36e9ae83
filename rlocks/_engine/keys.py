"""Redis key and channel names.

Every key and channel of one primitive is built as::

    <namespace>:<kind>:{<name>}[:<suffix>]

The ``{<name>}`` part is the Redis Cluster hash tag, so a primitive's hash and its side
keys (queue ``:q``, holder leases ``:l``, a Condition's waiters ``:c:<name>``) map to
the same slot and one Lua script may touch them all. Wake-ups go to one channel per
process, ``<namespace>:wake:<process>`` (a hint published by a script, whatever its slot).
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
from functools import cache, lru_cache
from typing import List, NamedTuple, Tuple

__all__ = [
    "PrimitiveKeys", "accuse_key", "escape", "fence_key", "keys_for", "slot", "wait_key",
    "wait_seq_key",
]

_SLOTS = 16384  # Redis Cluster's hash slots: a key's slot is CRC16(tag) mod 16384


def _tag_bytes(i: int) -> bytes:
    """The 4-letter tag numbered ``i`` (0..65535): one nibble per letter, '`'..'o'."""
    return bytes((0x60 | i >> 12, 0x60 | (i >> 8) & 15, 0x60 | (i >> 4) & 15, 0x60 | i & 15))


def _crc_basis() -> Tuple[int, List[Tuple[int, int, int]]]:
    """How the low 14 bits of a tag's number ``i`` move its slot, as GF(2) algebra.

    For messages of one length CRC16 is linear, crc(a ^ b) = crc(a) ^ crc(b) ^ crc(0),
    and so is the slot (its low 14 bits). Returns the slot of tag 0 and 14 rows (pivot
    bit, slot change, bits of ``i``) reduced so that each pivot bit is set in its own row
    only. That there are 14 (checked here) means the tags 0..16383 map one to one onto
    the slots: each slot's first tag is its only one below 16,384.
    """
    s0 = binascii.crc_hqx(_tag_bytes(0), 0) % _SLOTS
    rows: List[Tuple[int, int, int]] = []
    for k in range(14):
        vec, comb = (binascii.crc_hqx(_tag_bytes(1 << k), 0) % _SLOTS) ^ s0, 1 << k
        for pivot, pvec, pcomb in rows:
            if vec & pivot:
                vec, comb = vec ^ pvec, comb ^ pcomb
        assert vec, "the first 16,384 tags reach every slot"
        pivot = 1 << (vec.bit_length() - 1)
        rows = [(p, v ^ vec, c ^ comb) if v & pivot else (p, v, c) for p, v, c in rows]
        rows.append((pivot, vec, comb))
    return s0, rows


_S0, _ROWS = _crc_basis()


@cache
def _slot_tag(slot: int) -> str:
    """The first tag, in the order of its number, whose keys land in ``slot``.

    The same tags as earlier versions, which tried tags in order into a table of all
    16,384 slots (about 20 ms at the first acquire), so the fencing counter keys are
    unchanged: the one tag below 16,384 of the slot, by solving the linear system.
    """
    want, i = slot ^ _S0, 0
    for pivot, vec, comb in _ROWS:
        if want & pivot:
            want, i = want ^ vec, i ^ comb
    raw = _tag_bytes(i)
    assert not want and binascii.crc_hqx(raw, 0) % _SLOTS == slot
    return raw.decode("ascii")


def slot(key: str) -> int:
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
    return f"{namespace}:fence:{{{_slot_tag(slot(hash_key))}}}"


def escape(part: str) -> str:
    """Percent-escape ``%``, ``{`` and ``}`` (``%`` first, so the mapping is reversible)."""
    return part.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


class PrimitiveKeys(NamedTuple):
    """The Redis names one primitive uses (all in one cluster slot)."""

    hash: str  # the holds: owner (or side:owner) -> count, plus '#' fields
    queue: str  # its waiters, ZSET (lua/lib.lua); exists only while someone waits
    leases: str  # holder lease ends, ZSET (RWLock, semaphores; an RLock's is its PEXPIRE)
    fence: str  # the fencing token counter of the slot (shared by the slot's primitives)
    wake: str  # prefix of the per-process wake-up channels: <namespace>:wake:<process>

    def condition(self, name: str) -> str:
        """The waiters of the Condition ``name`` (``""``: the lock's default one)."""
        return f"{self.hash}:c:{escape(name)}"


def keys_for(namespace: str, kind: str, name: str) -> PrimitiveKeys:
    """Key and channel names for primitive ``name`` of ``kind`` in ``namespace``."""
    assert kind and ":" not in kind and "{" not in kind, kind
    base = f"{escape(namespace)}:{kind}:{{{escape(name)}}}"
    return PrimitiveKeys(base, f"{base}:q", f"{base}:l", fence_key(base),
                         f"{escape(namespace)}:wake:")


def wait_key(namespace: str, owner: str) -> str:
    """The deadlock detector's wait-for edge of ``owner`` (see :mod:`.deadlock`).

    Tagged by the owner, not by a primitive: an owner waits for one primitive at a time,
    and the edges of a cycle are read one key at a time, wherever their slots are.
    """
    return f"{escape(namespace)}:wait:{{{escape(owner)}}}"


def accuse_key(namespace: str, owner: str) -> str:
    """The accusation another member of a deadlock cycle leaves ``owner``'s wait, its
    victim (see :mod:`.deadlock`): tagged like ``owner``'s edge, so one slot holds both."""
    return f"{escape(namespace)}:accuse:{{{escape(owner)}}}"


def wait_seq_key(namespace: str) -> str:
    """The counter that numbers the waits the deadlock detector records."""
    return f"{escape(namespace)}:wait-seq"
