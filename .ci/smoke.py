"""Smoke test of an installed rlocks (``.ci/run`` runs it in a fresh venv with the built
wheel, from a folder outside the checkout): the package imports from site-packages, its
Lua files are inside it, and each kind of primitive takes and gives back a hold on a
throwaway server, with threads and with asyncio."""

from __future__ import annotations

import asyncio
import sys
from importlib import resources

import redis
import redis.asyncio

import rlocks
import rlocks.asyncio
from rlocks.server import TemporaryRedisServer


def main() -> int:
    where = rlocks.__file__
    assert "site-packages" in where, f"rlocks imported from {where}, not an installed wheel"
    lua = sorted(p.name for p in resources.files("rlocks._engine").joinpath("lua").iterdir())
    assert lua and all(name.endswith(".lua") for name in lua), lua
    with TemporaryRedisServer() as server:
        client = redis.Redis.from_url(server.url)
        lock = rlocks.RLock("smoke", client=client)
        with lock:
            with lock:  # re-entry
                assert lock.owned() and lock.token is not None
        assert not lock.locked()
        pool = rlocks.BoundedSemaphore("smoke-pool", 2, client=client)
        assert pool.acquire(timeout=5) and pool.acquire(timeout=5)
        assert not pool.acquire(blocking=False)
        pool.release()
        pool.release()
        rw = rlocks.RWLock("smoke-rw", client=client)
        with rw.read_lock, rlocks.RWLock("smoke-rw", client=client).read_lock:
            assert rw.read_lock.locked() and not rw.write_lock.locked()
        with rw.write_lock:
            assert rw.write_lock.locked()

        async def twins() -> None:
            aclient = redis.asyncio.Redis.from_url(server.url)
            try:
                alock = rlocks.asyncio.RLock("smoke", client=aclient)
                async with alock:
                    async with alock:
                        assert alock.owned()
            finally:
                await aclient.aclose()

        asyncio.run(twins())
        left = [k for k in client.keys("rlocks:*") if b":fence:" not in k]
        assert not left, left
    print(f"smoke: OK ({where}; {len(lua)} Lua files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
