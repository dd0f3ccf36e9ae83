"""Engine pieces that need no lock around them: keys, reply decoding, identity, checks."""

from __future__ import annotations

import threading
from typing import List

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlocks._engine import identity, wakeups
from rlocks._engine.keys import escape, keys_for, slot
from rlocks._engine.scripts import Reply, decode
from rlocks.errors import RLocksError

text = st.text(min_size=1, max_size=20)


@given(text, text, text, text)
def test_keys_are_one_to_one(ns1: str, name1: str, ns2: str, name2: str) -> None:
    k1, k2 = keys_for(ns1, "rlock", name1), keys_for(ns2, "rlock", name2)
    assert (k1 == k2) == ((ns1, name1) == (ns2, name2))


@given(text, text)
def test_hash_tag_is_exactly_the_escaped_name(ns: str, name: str) -> None:
    """Every key of the primitive is tagged by its name; the fencing counter it shares
    with its slot lands in that same slot (one script may touch them all)."""
    k = keys_for(ns, "rlock", name)
    for key in (k.hash, k.queue, k.leases, k.condition("c")):
        start = key.index("{")
        assert key[start + 1 : key.index("}", start)] == escape(name)
    assert slot(k.fence) == slot(k.hash) and k.fence.startswith(escape(ns) + ":fence:{")
    assert k.wake == escape(ns) + ":wake:"  # a channel prefix: no slot


def test_kinds_do_not_collide() -> None:
    assert keys_for("a:rw", "rlock", "x") != keys_for("a", "rw", "x")
    assert len({keys_for("ns", kind, "x").hash for kind in ("rlock", "rw", "sem")}) == 3


def test_decode_accepts_the_contract_and_nothing_else() -> None:
    assert decode(b"1 3") == Reply(1, 3) and decode("0 1500") == Reply(0, 1500)
    assert decode(b"1") == Reply(1) and decode(b"-1") == Reply(-1)  # renew's answers
    token = 1764030000123456  # 16 digits: a fencing token in server microseconds
    assert decode(f"1 1 {token}".encode()) == Reply(1, 1, token)
    assert decode(b"-4 3 1") == Reply(-4, 3, 1)  # a semaphore of another value and kind
    # The owners the call woke, one per line after the status line.
    assert decode(b"1 0\nh:1:n:2\nh:2:m:a7") == Reply(1, 0, 0, ("h:1:n:2", "h:2:m:a7"))
    assert decode(b"2 1 9").ok and decode(b"1 0").ok and not decode(b"0 5").ok
    for bad in (None, b"x 1", 7, [1, 3], b"9", b"3 0", b"", b" 1", b"1 2 3 4", "1 2 x",
                b"1.5 0", b"\nh:1:n:2"):
        with pytest.raises(RLocksError, match="unexpected"):
            decode(bad, "rlock_acquire")


def test_a_hint_wakes_the_waiter_it_names_and_no_other() -> None:
    """A hint ``<key>\\n<owner>`` sets that owner's waiter on that key only; one that
    comes before its waiter registers is kept for it; junk wakes nobody."""
    key, other = "rlocks-test:rlock:{hint}", "rlocks-test:rlock:{other}"
    owner = identity.process_token() + ":hint-1"
    mine = wakeups.Waiter(key, owner, None)
    elsewhere = wakeups.Waiter(other, owner, None)
    wakeups._register(mine)
    wakeups._register(elsewhere)
    try:
        wakeups._dispatch(b"junk without a newline")
        wakeups._dispatch(f"{key}\n{owner}x".encode())
        assert not mine.wait(0) and not elsewhere.wait(0)
        wakeups._dispatch(f"{key}\n{owner}".encode())
        assert mine.wait(0) and not elsewhere.wait(0)
        assert not mine.wait(0)  # one hint, one wake-up
    finally:
        mine.close()
        elsewhere.close()
    late = wakeups.Waiter(key, owner + "late", None)
    wakeups._dispatch(f"{key}\n{owner}late")  # nobody registered yet: kept
    wakeups._register(late)
    try:
        assert late.wait(0)
    finally:
        late.close()


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
