"""``rlocks.decorators``: ``@synchronized`` and ``@limited``."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator, List

import pytest
import redis

import rlocks
from rlocks._engine import state as ins
from rlocks.decorators import limited, synchronized

from .conftest import NAMESPACE


class CountingRLock(rlocks.RLock):
    """An RLock that counts how many were made (to see when the decorator makes one)."""

    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture(autouse=True)
def _reset_count() -> Iterator[None]:
    CountingRLock.made = 0
    yield


def test_decorating_makes_no_lock_and_the_first_call_makes_the_only_one(name: str) -> None:
    @synchronized(name, kind=CountingRLock, namespace=NAMESPACE)
    def work(x: int) -> int:
        return x * 2

    assert CountingRLock.made == 0
    assert [work(i) for i in range(3)] == [0, 2, 4]
    assert CountingRLock.made == 1
    assert work.get_lock() is work.get_lock()  # type: ignore[attr-defined]
    assert work.get_lock().name == name and work.get_lock().namespace == NAMESPACE


def test_the_default_client_is_chosen_at_the_first_call(
    name: str, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    # Importing (decorating) must not read RLOCKS_URL: here it points nowhere at first.
    monkeypatch.setenv("RLOCKS_URL", "redis://127.0.0.1:1/0")

    @synchronized(name, namespace=NAMESPACE)
    def work() -> str:
        return "done"

    monkeypatch.setenv("RLOCKS_URL", redis_url)
    assert work() == "done"


def test_metadata_is_kept(name: str) -> None:
    def original(a: int, b: int = 2) -> int:
        """Adds."""
        return a + b

    wrapped = synchronized(name)(original)
    assert wrapped.__name__ == "original" and wrapped.__doc__ == "Adds."
    assert wrapped.__wrapped__ is original  # type: ignore[attr-defined]
    assert wrapped.__qualname__ == original.__qualname__
    assert wrapped(1) == 3


def test_nested_decorated_calls_reenter_one_lock(
    client: "redis.Redis[bytes]", name: str
) -> None:
    seen: List[int] = []

    @synchronized(name, namespace=NAMESPACE)
    def inner() -> None:
        [state] = ins.find(client, NAMESPACE, name, "rlock")
        seen.append(state.holds)

    @synchronized(name, namespace=NAMESPACE)
    def outer() -> None:
        inner()  # a second lock object on the same name: re-entry, not a deadlock

    outer()
    assert seen == [2]
    assert not rlocks.RLock(name, namespace=NAMESPACE).locked()


def test_calls_from_many_threads_are_mutually_exclusive(
    client: "redis.Redis[bytes]", name: str
) -> None:
    counter = f"{NAMESPACE}:data:{name}"

    @synchronized(name, namespace=NAMESPACE)
    def add_one() -> None:
        value = int(client.get(counter) or 0)  # non-atomic on purpose
        client.set(counter, value + 1, ex=60)

    threads = [threading.Thread(target=lambda: [add_one() for _ in range(25)])
               for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert int(client.get(counter)) == 150


def test_methods_share_the_function_lock_across_instances(name: str) -> None:
    class Account:
        def __init__(self) -> None:
            self.balance = 0

        @synchronized(name, kind=CountingRLock, namespace=NAMESPACE)
        def deposit(self, amount: int) -> int:
            """Deposit."""
            self.balance += amount
            return self.balance

        @classmethod
        @synchronized(name, namespace=NAMESPACE)
        def bank(cls) -> str:
            return cls.__name__

    a, b = Account(), Account()
    assert a.deposit(5) == 5 and b.deposit(7) == 7 and a.deposit(1) == 6
    assert Account.deposit.__doc__ == "Deposit." and CountingRLock.made == 1
    assert Account.bank() == "Account"


def test_the_lock_is_released_when_the_function_raises(name: str) -> None:
    @synchronized(name, namespace=NAMESPACE)
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fail()
    assert not fail.get_lock().locked()  # type: ignore[attr-defined]


def test_timeout_raises_without_calling(name: str) -> None:
    holder = rlocks.RLock(name, namespace=NAMESPACE)
    ready, stop = threading.Event(), threading.Event()

    def hold() -> None:
        with holder:
            ready.set()
            stop.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    assert ready.wait(10)
    calls: List[int] = []

    @synchronized(name, namespace=NAMESPACE, timeout=0.2)
    def work() -> None:
        calls.append(1)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=name):
        work()
    assert calls == [] and time.monotonic() - started >= 0.2
    stop.set()
    thread.join(10)
    work()
    assert calls == [1]


def test_limited_allows_exactly_value_calls_at_once(name: str) -> None:
    inside, peak = [0], [0]
    mutex = threading.Condition()

    @limited(name, 2, namespace=NAMESPACE)
    def use() -> None:
        with mutex:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            mutex.notify_all()
            # Stay until a second caller is in (or a short while): the limit gets reached.
            mutex.wait_for(lambda: inside[0] >= 2, timeout=0.5)
        time.sleep(0.01)
        with mutex:
            inside[0] -= 1

    threads = [threading.Thread(target=lambda: [use() for _ in range(4)]) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert peak[0] == 2
    lock = use.get_lock()  # type: ignore[attr-defined]
    assert isinstance(lock, rlocks.BoundedSemaphore) and lock.value == 2


def test_semaphore_kind(name: str) -> None:
    @synchronized(name, kind=rlocks.Semaphore, value=3, namespace=NAMESPACE)
    def work() -> int:
        return 1

    assert work() == 1 and work.get_lock().value == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", [rlocks.RWLock, int, threading.RLock, "RLock"])
def test_unsupported_kinds_are_refused_at_decoration(name: str, kind: Any) -> None:
    with pytest.raises(TypeError):
        synchronized(name, kind=kind)


def test_bad_options_are_refused_at_decoration(name: str) -> None:
    with pytest.raises(TypeError, match="tll"):
        synchronized(name, tll=3)
    with pytest.raises(TypeError):
        synchronized(name, value=3)  # an RLock has no value
    with pytest.raises(ValueError):
        synchronized(name, timeout=-1)
    with pytest.raises(TypeError):
        synchronized(name, name="other")


def test_functions_whose_body_outlives_the_call_are_refused(name: str) -> None:
    async def coroutine() -> None:
        pass

    def generator() -> Iterator[int]:
        yield 1

    async def agen() -> Any:
        yield 1

    for func in (coroutine, generator, agen):
        with pytest.raises(TypeError, match="outside the hold"):
            synchronized(name)(func)
    with pytest.raises(TypeError):
        synchronized(name)(classmethod(lambda cls: None))  # type: ignore[arg-type]


def test_limited_errors_name_limited_not_synchronized(name: str) -> None:
    """A mistake in ``@limited(...)`` is reported as the call the user wrote."""
    with pytest.raises(TypeError, match=r"^limited\('.*'\): .*tll"):
        limited(name, 2, tll=3)
    with pytest.raises(TypeError, match=r"limited\(timeout=\.\.\.\)"):
        limited(name, 2, blocking_timeout=1)
    with pytest.raises(ValueError, match=r"^limited\("):
        limited(name, 2, timeout=-1)
    with pytest.raises(TypeError, match=r"^limited\(.*outside the hold"):
        limited(name, 2)(coroutine_function)
    with pytest.raises(TypeError, match=r"^synchronized\(.*synchronized\(timeout=\.\.\.\)"):
        synchronized(name, blocking_timeout=1)


async def coroutine_function() -> None:
    pass


@pytest.mark.parametrize("options", [
    {"ttl": -1}, {"namespace": ""}, {"entry_lease": 0}, {"deadlock_timeout": -1},
    {"kind": rlocks.Semaphore, "value": -2}, {"kind": rlocks.BoundedSemaphore, "value": 1.5},
])
def test_bad_option_values_are_refused_at_decoration(
    name: str, options: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad value fails where the decorator is written (at import), with the
    constructor's own error, not at the first call; no Redis is needed to find out."""
    monkeypatch.setenv("RLOCKS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises((ValueError, TypeError)):
        synchronized(name, **options)


def test_good_options_with_no_server_decorate_without_io(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLOCKS_URL", "redis://127.0.0.1:1/0")  # nothing listens there

    @synchronized(name, ttl=5, namespace=NAMESPACE)
    def job() -> int:
        return 1

    assert job.__name__ == "job"  # decorated; the first call would connect
