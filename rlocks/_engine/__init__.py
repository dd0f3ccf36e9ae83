"""The shared lock engine under every rlocks primitive.

Module map, lowest first. Each module imports (at load time or lazily, inside a function)
only modules listed above it, so no import runs upward and none goes in a circle;
``tests/test_hygiene.py`` parses the imports and holds the code to this list. An import
under ``if TYPE_CHECKING:`` (it never runs) may name a higher module for a type hint.

- ``clock``: the monotonic clock every deadline is read from.
- ``dialogue``: the blocking and the awaited driver of every I/O-free dialogue (a generator
  that yields the I/O step it needs: a script call, acquire, renewal, the hub's reader).
- ``metrics``: optional OpenTelemetry metrics and spans (acquire and hold durations,
  waiters, losses, renewals, hand-overs); nothing recorded without the API, and no cost
  to speak of when no provider is configured.
- ``identity``: owner ids (host, pid, per-process nonce renewed at fork, per-thread serial).
- ``keys``: Redis key and channel names, with the hash tag that keeps one primitive in one
  cluster slot.
- ``checks``: argument validation, done before any Redis call.
- ``callbacks``: the one thread per process that runs users' ``on_lost`` callbacks.
- ``constructors``: constructor argument errors that name the public class.
- ``clients``: the default client (``RLOCKS_URL``) and the bounded I/O clients.
- ``scripts``: the Lua files, EVALSHA with NOSCRIPT recovery, and the one reply decoder.
- ``state``: a primitive's state as stored in Redis (kinds, holders, queue) read back,
  the forced release; for ``statistics()`` and the CLI.
- ``quorum``: a quorum of independent masters (Redlock) passed as ``client=``.
- ``deadlock``: the wait-for graph and its check, written without I/O.
- ``wakehub``: the per-process wake-up hub (one subscriber connection per pool and
  namespace): its table of waiters and its reader dialogue.
- ``sharded``: the hub's Redis Cluster transport (a subscriber per shard, SSUBSCRIBE).
- ``waiting``: which hub a waiter uses (the registry), and a waiter's deadline plan.
- ``renewal``: the per-process lease renewer (one daemon thread, batched round trips).
- ``queued``: the acquire through the server-side queue, written once without I/O (a
  generator yielding the call or wait it needs) for the threading and asyncio drivers.
- ``primitive``: the base class a primitive is built from: local bookkeeping of holds,
  acquire / release / lost-hold handling on top of the modules above, split into I/O-free
  ``_begin_*`` / ``_finish_*`` halves around one script call.
- ``reentrant``: the ``threading.RLock`` surface shared by RLock and both RWLock sides.
- ``aio``: the asyncio drivers (task owners, awaited calls, a hub and a renewer per loop)
  that turn a primitive into its ``rlocks.asyncio`` twin.
- ``condition``: the Condition core shared by ``rlocks.Condition`` and its asyncio twin.

A primitive module (``rlocks/rlock.py`` ...) chooses its scripts, its key kind, its owner
scope and its wake policy; it never grows its own wait loop or renewal.
"""
