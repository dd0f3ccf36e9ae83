"""Engine pieces that need no lock around them: keys, reply decoding, identity, checks."""

from __future__ import annotations

import threading
from typing import List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlocks._engine import identity
from rlocks._engine.keys import escape, keys_for
from rlocks._engine.scripts import Reply, decode
from rlocks._engine.wakehub import wake_count
from rlocks.errors import RLocksError

text = st.text(min_size=1, max_size=20)


@given(text, text, text, text)
def test_keys_are_one_to_one(ns1: str, name1: str, ns2: str, name2: str) -> None:
    k1, k2 = keys_for(ns1, "rlock", name1), keys_for(ns2, "rlock", name2)
    assert (k1 == k2) == ((ns1, name1) == (ns2, name2))


@given(text, text)
def test_hash_tag_is_exactly_the_escaped_name(ns: str, name: str) -> None:
    for key in keys_for(ns, "rlock", name):
        start = key.index("{")
        assert key[start + 1 : key.index("}", start)] == escape(name)


def test_kinds_do_not_collide() -> None:
    assert keys_for("a:rw", "rlock", "x") != keys_for("a", "rw", "x")
    assert len({keys_for("ns", kind, "x").hash for kind in ("rlock", "rw", "sem")}) == 3


def test_decode_accepts_the_contract_and_nothing_else() -> None:
    assert decode(b"1 3") == Reply(1, 3) and decode("0 -1").retry_after == -1.0
    assert decode(b"0 1500").retry_after == 1.5
    token = 1764030000123456  # 16 digits: a fencing token in server microseconds
    assert decode(f"1 1 30000 {token}".encode()) == Reply(1, 1, -1, 30000, (), (), token)
    assert decode(b"1 0 0 0\ng p2:1 7\nw p3:1") == Reply(1, 0, -1, 0, ("g p2:1 7", "w p3:1"))
    assert decode("1 2 0 9 1,-1") == Reply(1, 2, -1, 0, (), (1, -1), 9)  # renew's items
    assert decode(b"3 2 -1 0").queued and decode(b"4 1 0 0").status == 4
    for bad in (None, b"1", b"2 0", b"x 1", 7, [1, 3], b"1 1 0 0 1,x", b"1 0 0 0 1 2",
                b"9 0 0 0", b"", b"1 2 3", "1 2 3"):
        with pytest.raises(RLocksError, match="unexpected"):
            decode(bad, "rlock_acquire")


def test_wake_count_decoding() -> None:
    assert wake_count(b"1") == 1 and wake_count("3") == 3
    assert wake_count(b"*") is None and wake_count(b"junk") is None
    assert wake_count(b"0") == 1  # a message always means at least one may proceed


def test_owner_ids_are_unique_per_thread_and_stable_within_one() -> None:
    seen: List[str] = []

    def record() -> None:
        first = identity.thread_owner()
        assert identity.thread_owner() == first
        seen.append(first)

    threads = [threading.Thread(target=record) for _ in range(30)]
    for t in threads:
        t.start()
        t.join()  # sequential: idents are likely reused, ids must not be
    assert len(set(seen)) == 30
    prefix = identity.process_token()
    assert all(owner.startswith(prefix + ":") for owner in seen)
    assert identity.process_owner() == prefix + ":p"
