"""A referee for rlocks: record what users see, inject faults, check the promises.

This package knows nothing of rlocks' internals. Workers (real processes, each with
several threads, or asyncio tasks) use only the public API and record every operation's
invocation and completion on the host's monotonic clock, which every process of a Linux
host shares, with its outcome and what the user was told (``LockLostError``, ``owned()``
turning False, ``on_lost``). A nemesis pauses, kills and restarts workers and servers
and cuts or slows their links, recording each fault. The checker reads only these
records (and the fenced store's log) and decides whether the promises held:

- ``workload``: what each thread or task does, as I/O-free generators of actions;
- ``worker``: the process that runs them (a blocking and an awaited driver) and records;
- ``servers``: the servers under test (one server with or without persistence, behind a
  proxy; a cluster with replicas) and the fenced store;
- ``nemesis``: the faults, at random but reproducibly (a seed);
- ``check``: the checker, over the history alone;
- ``run``: one seeded run, start to report; ``plot``: its picture;
- ``__main__``: the soak command, ``python -m tests.history --help``.

It imports neither pytest nor anything of rlocks but its public names.
"""
