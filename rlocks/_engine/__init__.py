"""The shared lock engine (docs/design/core.md tells how it works).

Its modules, in import order: each imports only modules listed above it.

- ``clock``: the monotonic clock every deadline is read from.
- ``identity``: owner ids (host, process, thread or task).
- ``checks``: argument validation, before any Redis call.
- ``keys``: Redis key and channel names.
- ``clients``: the default client, and bounded clients for rlocks' own round trips.
- ``scripts``: the Lua scripts, how a call is sent, how its reply is read.
- ``callbacks``: where ``on_lost`` callbacks run.
- ``metrics``: OpenTelemetry metrics and spans.
- ``holds``: what this process knows of its holds (one state machine per hold).
- ``guard``: ``async with lock.guard():``, a section stopped when its hold is lost.
- ``nonreentrant``: the owners of a lock that is not reentrant (``rlocks.Lock``).
- ``steps``: the step vocabulary of the dialogues, and the blocking and awaited drivers.
- ``wakeups``: the wake-up hint subscribers and the waiters' table.
- ``backends``: one server or cluster, as the dialogues see it.
- ``quorum``: independent masters (Redlock), the same interface.
- ``state``: read-back views for ``statistics()`` and the CLI; force-release.
- ``deadlock``: wait-for edges and the cycle check.
- ``renewal``: the renewer (a thread, or a task per event loop), batched.
- ``dialogues``: acquire, release, extend, written once without I/O.
- ``condition``: the distributed Condition's wait and notify.
- ``barrier``: the distributed Barrier's arrive, wait and pass (dialogues and checks).
- ``constructors``: constructor argument errors that name the public class.
- ``primitive``: a primitive's settings, what it sends, the levels it took.
- ``event``: the distributed Event's flag, waiters and marks.
- ``multi``: several primitives taken in one global order, all or none.
- ``surface``: the ``threading`` and asyncio surfaces.
"""
