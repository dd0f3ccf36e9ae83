"""Small contracts from the bug hunt of issue 10: copying, Condition on a write lock that
also reads, and wake-up channels with a client that decodes replies in another encoding.
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
from typing import Any, List

import pytest
import redis

import rlocks
import rlocks.asyncio as ra

from .conftest import NAMESPACE


# -- copy / pickle ----------------------------------------------------------------------------


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps])
def test_primitives_refuse_to_be_copied_or_pickled(
    client: "redis.Redis[bytes]", name: str, copier: Any
) -> None:
    # threading's locks raise TypeError ("cannot pickle '_thread.RLock' object"); a copy
    # of an rlocks primitive would share this process's held state.
    rw = rlocks.RWLock(name, client=client, namespace=NAMESPACE)
    prims = [
        rlocks.RLock(name, client=client, namespace=NAMESPACE),
        rw,
        rw.read_lock,
        rw.write_lock,
        rlocks.Semaphore(name, 2, client=client, namespace=NAMESPACE),
        rlocks.BoundedSemaphore(name, 2, client=client, namespace=NAMESPACE),
        ra.RLock(name, namespace=NAMESPACE),
        ra.RWLock(name, namespace=NAMESPACE),
        ra.Semaphore(name, 2, namespace=NAMESPACE),
    ]
    for prim in prims:
        with pytest.raises(TypeError, match="cannot pickle or copy") as info:
            copier(prim)
        assert name in str(info.value)
    with pytest.raises(TypeError):
        copier(threading.RLock())  # the control row: what threading does
