"""Lua scripts: loading, running (FCALL or EVALSHA), and the one place replies are decoded.

Every change to a primitive's state is one Lua script, run as a function of the queue
library (:class:`Library`, Redis 7.0+) or with EVALSHA, so each operation is atomic on the
server and costs one round trip. Scripts live as ``.lua`` files in
``rlocks/_engine/lua/``; each starts with a header listing its KEYS, ARGV (with units) and
return values. Names and owner ids only ever travel as KEYS/ARGV: no user string is pasted
into script text, so no name can change what a script does.

The reply contract, one for every script :func:`decode` reads (it is the only code that
reads raw integers; :class:`Reply` is what the rest of the engine sees). A script answers
one text: the line ``status value``, or ``status value aux token[ items]`` for the
queue-and-hand-over scripts (``queue_lib.lua`` prepended, see :func:`load_queued`; the
contract in that file's header, the design in docs/design/handover.md), integers in
decimal and ``items`` comma-joined, followed by one line per wake-up line. One text is
one element for redis-py to parse where a nested array is one per value: with its own
parser (no hiredis) that saves about 7 µs of client CPU per uncontended acquire+release.

=========  ==========================================================================
status     meaning, and ``value`` / ``aux``
=========  ==========================================================================
 1         OK. acquire: granted, value = the caller's holds now, aux = lease ms.
           release: value = holds left (sem_release: permits free after the
           hand-over; an rlock or rw release that carried its process's next
           waiter's queueing: ``items`` = that queueing's status, value, aux and
           token). renew: value = items renewed (``items``: each one's status,
           1 done / -1 not there). leave: value 0 = left, else the re-pointed entry's
           position. force_release: released, value 0. cond_*: notified / queued /
           done, value as in each file's header.
 2         ADOPTED (acquire): a hand-over grant this waiter had missed, recorded now;
           nothing added; value = holds, aux = lease ms
 3         QUEUED (acquire): value = position (1 = head), aux = ms until the earliest
           holder lease ends (-1: none), the re-check hint
 4         PASSED (leave): a grant the leaving waiter had not adopted was given back
           and passed on; value = holds given back
 0         BUSY. acquire with queue = 0: nothing granted or queued; value = ms until
           the earliest holder lease ends (-1: none), aux = entries queued.
           cond_check / cond_leave: still waiting
-1         NOT HELD. acquire: re-entry refused (the hold is gone); release, leave:
           nothing held or queued for this owner (sem_release: value = the 1-based
           pair whose owner holds fewer permits than listed); force_release: no
           holds hash; cond_*: the entry is gone
-2         UPGRADE (rw_acquire): the write side asked by an owner that only reads
-3         OVER (sem_release): a BoundedSemaphore would exceed its value
=========  ==========================================================================

A refusal (-1, -2, -3, and 0) changes no hold of the caller, but a queue script still
does its housekeeping first: expired holds and entries are dropped, what they freed is
handed over (``wakes``), and the keys' expiries are set again. ``wakes`` are the lines the
script published ("g <waiter> <token>" granted, a semaphore's without the token; "w
<waiter>" woken to try again). ``token``: the fencing token of the hold an RLock or RWLock
acquire granted fresh or adopted (0 when the reply carries none: re-entry keeps its
token).

A queue script's operation is applied at most once: the same op id sent again (a
re-send by redis-py after a lost reply) gets the first run's reply, with no wakes, and
changes nothing (``lua/op_lib.lua``; a refusal is not recorded and is decided afresh).

Error replies (a ``ResponseError``, nothing changed): ``RLOCKS_BAD_ARG <name>`` for a
malformed ARGV (the engine validates first, so only a bug or a foreign caller sees it);
``RLOCKS_SEM_MISMATCH <value> <bounded>`` from a semaphore script when the stored
semaphore was made with another initial value or kind (``rlocks.semaphore`` turns it into
a ValueError). The deadlock detector's two scripts are outside the contract, read by
:mod:`.deadlock` itself: ``deadlock_holders.lua`` (a read-only list of hold fields) and
``deadlock_accuse.lua`` (1 or 0: an accusation written or not).
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import weakref
from collections.abc import Generator
from functools import cache
from importlib import resources
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import redis
from redis.exceptions import NoScriptError, RedisClusterException, ResponseError

from ..errors import RLocksError
from . import identity
from .clients import io_client
from .dialogue import adrive, drive

__all__ = [
    "ADOPTED",
    "GRANTED",
    "BUSY",
    "OVER",
    "PASSED",
    "QUEUED_STATUS",
    "UPGRADE",
    "NOT_OWNER",
    "OP",
    "Call",
    "Reply",
    "arun",
    "Script",
    "decode",
    "direct_command",
    "foreign",
    "load",
    "load_queued",
    "new_op",
    "op_stream",
    "run",
    "stamped",
    "unsent",
    "with_op",
]

GRANTED = 1
BUSY = 0
NOT_OWNER = -1
ADOPTED = 2
QUEUED_STATUS = 3
PASSED = 4
UPGRADE = -2
OVER = -3
_STATUSES = (GRANTED, BUSY, NOT_OWNER, ADOPTED, QUEUED_STATUS, PASSED, UPGRADE, OVER)

Arg = Union[str, int, float, bytes]

#: The op ARGV of a queue script (lua/op_lib.lua) as a primitive builds its arguments: no
#: id yet. :class:`Call`, :func:`run` and :func:`arun` put a fresh id in its place each time
#: they send (``#<seq>:<stream>``), so a re-send by redis-py of that very command is a
#: repeat the script answers from its record; sent as is, the script records nothing.
OP = "#"
# Unique per process; the stream (an owner id) names the process, so ids never collide.
_op_seq = itertools.count(1)


def op_stream() -> str:
    """The stream of the calling code's operations: its asyncio task's (see
    :func:`identity.op_stream`), or outside a task its thread's owner id. No I/O."""
    return identity.op_stream()


def new_op(stream: str) -> str:
    """A fresh op id of ``stream``: ``#<seq>:<stream>`` (see lua/op_lib.lua)."""
    return f"#{next(_op_seq)}:{stream}"


def with_op(args: Sequence[Arg], op: str) -> Sequence[Arg]:
    """``args`` with :data:`OP` replaced by the op id ``op`` (no OP: as is)."""
    for i, arg in enumerate(args):
        if arg == OP and isinstance(arg, str):
            return (*args[:i], op, *args[i + 1:])
    return args


def stamped(args: Sequence[Arg], stream: str) -> Sequence[Arg]:
    """``args`` with :data:`OP` replaced by a fresh op id of ``stream`` (no OP: as is)."""
    return with_op(args, new_op(stream))


class Reply(NamedTuple):
    """A decoded script reply (see the module docstring for the meaning of ``value``)."""

    status: int
    value: int
    #: Replicas that acknowledged the script's writes (WAIT); -1 when not asked.
    replicas: int = -1
    #: Queue scripts: the reply's third field (lease ms, re-check hint, entries queued).
    aux: int = 0
    #: Queue scripts: the wake-up lines the script published, in queue order.
    wakes: Tuple[str, ...] = ()
    #: Queue renew script: each item's status (1 done, -1 not there).
    items: Tuple[int, ...] = ()
    #: Acquire of an RLock/RWLock side: the fencing token of the fresh or adopted hold;
    #: 0 when none was issued (re-entry, a semaphore, every other script).
    token: int = 0

    @property
    def granted(self) -> bool:
        """Whether the caller holds what it asked for (ADOPTED: a missed hand-over)."""
        return self.status == GRANTED or self.status == ADOPTED

    @property
    def queued(self) -> bool:
        return self.status == QUEUED_STATUS

    @property
    def busy(self) -> bool:
        return self.status == BUSY

    @property
    def not_owner(self) -> bool:
        return self.status == NOT_OWNER

    @property
    def holds(self) -> int:
        """Hold count after a granted acquire (``value`` of a GRANTED or ADOPTED reply)."""
        assert self.status in (GRANTED, ADOPTED)
        return self.value

    @property
    def retry_after(self) -> float:
        """Seconds until the blocking hold's lease ends (busy replies); -1 when unknown."""
        assert self.status == BUSY
        return self.value / 1000.0 if self.value >= 0 else -1.0


def decode(raw: Any, script_name: str = "script") -> Reply:
    """Turn a raw script reply into a :class:`Reply`: the text ``status value`` or
    ``status value aux token[ items]`` (integers, ``items`` comma-joined), then one
    wake-up line per line; bytes, or str from a client that decodes responses.

    Raises :class:`RLocksError` for anything else.
    """
    try:
        nl, sp, comma = (b"\n", b" ", b",") if isinstance(raw, bytes) else ("\n", " ", ",")
        head, newline, rest = raw.partition(nl)
        fields = head.split(sp)
        if len(fields) not in (2, 4, 5):
            raise ValueError(raw)
        status, value = int(fields[0]), int(fields[1])
        aux = token = 0
        items: Tuple[int, ...] = ()
        if len(fields) > 2:
            aux, token = int(fields[2]), int(fields[3])
            if len(fields) == 5:
                items = tuple(int(item) for item in fields[4].split(comma))
        wakes: Tuple[str, ...] = ()
        if newline:
            text = rest.decode("utf-8", "replace") if isinstance(rest, bytes) else rest
            wakes = tuple(text.split("\n"))
    except (TypeError, ValueError, IndexError, AttributeError):
        raise RLocksError(f"unexpected reply from {script_name}: {raw!r}") from None
    if status not in (_STATUSES if len(fields) > 2 else (GRANTED, BUSY, NOT_OWNER)):
        raise RLocksError(f"unexpected status from {script_name}: {raw!r}")
    return Reply(status, value, -1, aux, wakes, items, token)


class Script:
    """One Lua script, read and hashed once per process. A queue script also runs as a
    function of the queue library (:class:`Library`): ``function`` is its FCALL name."""

    __slots__ = ("name", "source", "sha", "function", "library")

    def __init__(
        self, name: str, source: str, library: Optional["Library"] = None
    ) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self.library = library
        self.function = None if library is None else f"{library.name}_{name}"

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:12]}>"


@cache
def _read(name: str) -> str:
    """The text of ``lua/<name>.lua``, read once per process (the library files go in
    front of every queue script and into the library)."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def load(name: str, prelude: str = "") -> Script:
    """The script in ``lua/<name>.lua``, read and hashed once per process.

    ``prelude`` names library files (``cond_lib``, or several joined by ``+``) whose
    functions the script uses; they are put in front, in that order, so each operation
    still is one script and one round trip.
    """
    source = _read(name)
    for part in reversed(prelude.split("+") if prelude else []):
        source = _read(part) + "\n" + source
    return Script(name, source)


#: The operation files that run on ``queue_lib.lua`` and ``op_lib.lua`` (see
#: :func:`load_queued`): every one of them is a function of the queue library.
QUEUED = tuple(
    f"{kind}_{op}" for kind in ("rlock", "rw", "sem") for op in ("acquire", "release",
                                                                "leave", "renew")
) + ("force_release",)

# The EVAL form's head: Redis 6.2 must be told to replicate effects before a write that
# follows TIME (7.0 always does; the name does not exist in a function library, so it
# stays out of the shared text), and the call's KEYS/ARGV globals are kept before the
# library's locals of those names hide them.
_EVAL_HEAD = """if redis.replicate_commands then
    redis.replicate_commands()
end
local call_keys, call_argv = KEYS, ARGV
"""


# Stands for the library's name in its text until the text's hash names it.
_NAME = "<rlocks-library>"


class Library:
    """The queue scripts as one Redis Functions library (Redis 7.0+, Valkey).

    ``queue_lib.lua`` and ``op_lib.lua`` are compiled once per server instead of once per
    call: an EVAL script defines their few dozen functions again at every run, about a
    sixth of a queue script's server time (docs/operations.md). The name carries a hash of
    the whole text (flags included), so two rlocks versions on one server never replace
    each other's library.
    The same text, with :data:`_EVAL_HEAD`, is each queue script's EVAL form: the
    fallback for a server or user without functions (see :class:`Call`).
    """

    __slots__ = ("name", "code")

    def __init__(self) -> None:
        # The text is composed with a placeholder for the name, then named by its hash:
        # the Lua and the functions' flags both decide the name.
        parts = [_read("queue_lib") + "\n" + _read("op_lib") + "\n"]
        for op in QUEUED:
            # A function without flags is refused whole when the server is out of memory
            # (maxmemory, noeviction), where an EVAL script is refused only at its first
            # write that could grow memory: a release, a leave or a forced release (they
            # free memory) and a renewal (it rewrites what exists; refused, a hold would
            # be lost) must still run then. An acquire is refused before it changes
            # anything.
            flags = "" if op.endswith("_acquire") else "'allow-oom'"
            # (The operation's body is a local function defined once, in a block of its
            # own: its reply table becomes the text reply as the function returns.)
            parts.append(
                f"do\nlocal function body()\n{_read(op)}\nend\n"
                f"redis.register_function{{function_name='{_NAME}_{op}', flags={{{flags}}},"
                f" callback=function(keys, argv)\nbind(keys, argv)\n"
                f"return reply_text(body())\nend}}\nend\n"
            )
        body = "".join(parts)
        self.name = f"rlocks_{hashlib.sha1(body.encode('utf-8')).hexdigest()[:16]}"
        self.code = f"#!lua name={self.name}\n" + body.replace(_NAME, self.name)


def eval_form(name: str, libs: Sequence[str] = ("queue_lib", "op_lib")) -> str:
    """Queue operation ``name`` as one EVAL script on the library files ``libs`` (the
    engine's: both; tests of the queue alone leave out ``op_lib``)."""
    front = "".join(_read(lib) + "\n" for lib in libs)
    return (_EVAL_HEAD + front + "bind(call_keys, call_argv)\nlocal function body()\n"
            + _read(name) + "\nend\nreturn reply_text(body())\n")


@cache
def library() -> Library:
    """The queue library, built once per process."""
    return Library()


@cache
def load_queued(name: str) -> Script:
    """The queue-and-hand-over script ``lua/<name>.lua`` with ``queue_lib.lua`` (its KEYS,
    context ARGV and reply contract) and ``op_lib.lua`` (the op id, see :data:`OP`) in
    front, read and hashed once per process; also a function of :func:`library`."""
    if name not in QUEUED:
        raise ValueError(f"{name} is not a queue script")
    return Script(name, eval_form(name), library())


#: ``(replicas, ms)``: after the script, WAIT until that many replicas have its writes, or
#: that many milliseconds passed (one round trip with the script: same connection).
Replication = Optional[Tuple[int, int]]


#: How Redis refuses a long command from a connection that has not logged in (more than
#: ten arguments, or a long one): it closes the connection after this error reply. Whether
#: a client sees it or ``NOAUTH`` depends on what redis-py sent first on connecting.
_UNAUTHENTICATED = "Protocol error: unauthenticated"


def _login_refused(exc: ResponseError) -> Optional[redis.exceptions.AuthenticationError]:
    """The :class:`~redis.exceptions.AuthenticationError` that ``exc`` means, if it is
    Redis refusing a connection that is not logged in; waiting does not cure that."""
    if not str(exc).startswith(_UNAUTHENTICATED):
        return None
    return redis.exceptions.AuthenticationError(str(exc))


def run(
    client: Any,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Arg],
    replication: Replication = None,
) -> Reply:
    """Run ``script`` on ``client`` (a ``Redis`` or ``RedisCluster``): a queue script as
    its library function (FCALL) where the server and user allow it, else EVALSHA.

    One round trip normally. The first call on a server that does not know the script yet
    (new server, restart, SCRIPT FLUSH or FUNCTION FLUSH) gets NOSCRIPT or "function not
    found", loads it and runs it again; a server or user without functions is
    remembered (per connection pool) and gets EVALSHA, as a cluster client always does. With
    ``replication``, the reply also says how many replicas acknowledged. A refusal of a
    connection that is not logged in raises ``AuthenticationError``; other Redis errors
    propagate unchanged.
    """
    # A fresh op id (its NOSCRIPT re-run is the same operation: the first did not run).
    args = stamped(args, identity.thread_owner())

    def perform(op: Any) -> Any:
        if op is _LOAD:
            return client.script_load(script.source)
        if op is _LOAD_LIBRARY:
            return client.function_load(_library_code(script), replace=True)
        if isinstance(op, str):
            return client.execute_command(*_command(op, script, keys, args))
        return op.execute(raise_on_error=False)

    return drive(_run_steps(client, script, keys, args, replication), perform)


async def arun(
    client: Any,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Arg],
    replication: Replication = None,
) -> Reply:
    """:func:`run` for ``redis.asyncio`` clients: same contract (the same dialogue), awaited."""
    args = stamped(args, op_stream())

    async def perform(op: Any) -> Any:
        if op is _LOAD:
            return await client.script_load(script.source)
        if op is _LOAD_LIBRARY:
            return await client.function_load(_library_code(script), replace=True)
        if isinstance(op, str):
            return await client.execute_command(*_command(op, script, keys, args))
        return await op.execute(raise_on_error=False)

    return await adrive(_run_steps(client, script, keys, args, replication), perform)


#: What :func:`_run_steps` asks its driver for, besides a pipeline to execute.
_EVAL = "EVALSHA the script"
_LOAD = "SCRIPT LOAD the script"
_FCALL = "FCALL the script's library function"
_LOAD_LIBRARY = "FUNCTION LOAD the queue library"


def _command(op: str, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Tuple[Any, ...]:
    """The script call of a :func:`_run_steps` step (``_EVAL`` or ``_FCALL``). (A plain
    command, not the evalsha or fcall methods: redis-py's cluster client routes it by its
    keys, and its cluster pipeline refuses the evalsha method.)"""
    if op is _FCALL:
        return ("FCALL", script.function, len(keys), *keys, *args)
    assert op is _EVAL
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def _library_code(script: Script) -> str:
    assert script.library is not None
    return script.library.code


def _functions_key(client: Any) -> Any:
    """What a server's answer about functions is remembered by: the client's connection
    pool; None for a client that never sends FCALL, a cluster client (it has no pool of
    its own): redis-py's cluster client asks a node for an FCALL's keys (COMMAND GETKEYS)
    before each one, a round trip more than the EVALSHA it routes by itself."""
    return getattr(client, "connection_pool", None)


def _run_steps(
    client: Any, script: Script, keys: Sequence[str], args: Sequence[Arg], replication: Replication
) -> Generator[Any, Any, Reply]:
    """The dialogue of :func:`run` and :func:`arun`, written once without I/O: yields
    ``_FCALL``, ``_LOAD_LIBRARY``, ``_EVAL``, ``_LOAD`` or a pipeline to execute and
    receives its answer, or has the exception it raised thrown in (a missing script or
    function is loaded, a server or user without functions falls back to EVALSHA, a
    login refusal becomes ``AuthenticationError``, anything else propagates unchanged);
    returns the decoded reply. Driven by :mod:`.dialogue`."""
    key = _functions_key(client)
    done: Tuple[str, ...] = ()  # the recovery steps taken for this call
    try:
        while True:
            fcall = bool(script.function is not None and key is not None
                         and _functions.get(key, True))
            try:
                if replication is not None:
                    results = yield _queue_with_wait(client, script, keys, args, replication, fcall)
                    return _decode_with_wait(results, script)
                return decode((yield _FCALL if fcall else _EVAL), script.name)
            except ResponseError as exc:
                step = _recovery(exc, fcall, done)
                if step is None:
                    raise
            done += (step,)
            if step is _EVAL:
                _functions[key] = False
                continue
            try:
                yield step
            except ResponseError:
                if step is _LOAD:
                    raise
                _functions[key] = False  # a refused FUNCTION LOAD: EVALSHA from now on
    except ResponseError as exc:
        login = _login_refused(exc)
        if login is None:
            raise
        raise login from exc


def _queue_with_wait(
    client: Any,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Arg],
    replication: Tuple[int, int],
    fcall: bool = False,
) -> Any:
    pipe = client.pipeline(transaction=False)
    pipe.execute_command(*_command(_FCALL if fcall else _EVAL, script, keys, args))
    pipe.execute_command("WAIT", *replication)
    return pipe


def _decode_with_wait(results: List[Any], script: Script) -> Reply:
    for result in results:
        if isinstance(result, Exception):
            raise result
    return decode(results[0], script.name)._replace(replicas=int(results[1]))


# redis-py closes a connection whose read was interrupted unless told not to (the keyword
# exists since redis-py 4.6); kept open, an interrupted read can be resumed.
_KEEP_OPEN: Dict[str, bool] = (
    {"disconnect_on_error": False}
    if "disconnect_on_error"
    in inspect.signature(redis.connection.Connection.read_response).parameters
    else {}
)


def foreign(exc: BaseException) -> bool:
    """Whether ``exc`` came from outside redis-py's I/O (a signal handler's exception:
    KeyboardInterrupt, an alarm-based timeout), which may hit between any two lines and
    leaves the connection readable, rather than from the connection or Redis."""
    return not isinstance(exc, (redis.RedisError, RedisClusterException, OSError))


def _direct_pool(client: Any) -> Any:
    """The pool to send pre-packed commands on, or ``None`` where only the client may send.

    Only a plain ``redis.Redis`` (no ``execute_command`` override, so no instrumentation
    is bypassed) on a standard pool without client-side caching or a pinned single
    connection qualifies. Cluster clients route by slot and always take the generic path.
    """
    if type(client).execute_command is not redis.Redis.execute_command:
        return None
    if getattr(client, "connection", None) is not None:  # single_connection_client
        return None
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, redis.ConnectionPool) or getattr(pool, "cache", None) is not None:
        return None
    return pool


def direct_command(client: Any, *args: Any) -> Any:
    """Run one plain command (``args``) on ``client`` and return its raw reply (no
    response callback: a list where ``client.blpop`` gives a tuple), blocking for one
    round trip.

    On a plain ``redis.Redis`` (see :func:`_direct_pool`) it takes the path a
    :class:`Call` takes: a connection of the pool, the command sent and its reply read,
    without the per-command layers of redis-py's ``execute_command`` (its retry wrapper,
    argument filters, operation records), a sixth of a BLPOP's client CPU here (12 of
    82 µs); like every round trip of rlocks' own, it is never re-sent. An error
    reply is raised as ``ResponseError`` (the connection goes back to the pool); any other
    exception, an interrupt's included, closes the connection first (as redis-py does:
    its reply may still be on its way). Any other client: ``client.execute_command``.
    """
    pool = _direct_pool(client)
    if pool is None:
        return client.execute_command(*args)
    connection = pool.get_connection()
    try:
        connection.send_command(*args)
        reply = connection.read_response()
    except ResponseError:
        pool.release(connection)
        raise
    except BaseException:
        connection.disconnect()
        pool.release(connection)
        raise
    pool.release(connection)
    return reply


_UNSENT = "_rlocks_unsent"
# PING's argument after an interrupted read: a script's answer is never this string.
_FENCE = b"rlocks-fence-after-interrupt"
_FENCE_TEXT = _FENCE.decode()


def unsent(error: BaseException) -> bool:
    """Whether ``error`` was raised by :class:`Call` before its command was sent.

    Only then is it certain that the script did not run; after any other connection or
    timeout error its reply may have been lost on the way back.
    """
    return bool(getattr(error, _UNSENT, False))


#: Where the queue scripts may not run as functions (:class:`Library`), by connection
#: pool (see ``_functions_key``): absent until known (FCALL is tried first), False once
#: the server (Redis 6.2) or the ACL user (no ``+fcall`` or ``+function|load``) refused
#: them: EVALSHA from then on.
_functions: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _function_missing(exc: ResponseError) -> bool:
    """Whether ``exc`` answered an FCALL whose function is not loaded (a new server, a
    restart without persistence, FUNCTION FLUSH): loading the library helps."""
    return str(exc).lower().startswith("function not found")


def _function_refused(exc: ResponseError) -> bool:
    """Whether ``exc`` answered an FCALL that did not run: the function is missing, or
    the server (Redis 6.2, a fork without functions), a proxy in front of it ("unsupported
    command") or the ACL user has no FCALL. An error of the script itself (a malformed
    argument, a refused inner command or key) is not."""
    text = str(exc).lower()
    return (
        _function_missing(exc)
        or text.startswith("unknown command")
        or ("fcall" in text and ("unsupported" in text or "not supported" in text))
        or (isinstance(exc, redis.exceptions.NoPermissionError) and "'fcall'" in text)
    )


def _recovery(exc: ResponseError, fcall: bool, done: Tuple[str, ...]) -> Optional[str]:
    """What a script call that Redis refused unrun does next, decided once for
    :func:`run`'s dialogue and :class:`Call` (no I/O): ``_LOAD`` (NOSCRIPT: load the
    script, send the call again), ``_LOAD_LIBRARY`` (an FCALL of a function not loaded:
    load the library, send it again), ``_EVAL`` (no FCALL for this server or user:
    EVALSHA from now on, sent again), or None: the error goes to the caller (the script
    ran and failed, or it cannot run here). ``fcall``: the call was an FCALL. ``done``:
    the steps already taken for this call. Each load is made once per call: a script
    refused again right after its load is an error (the server keeps losing it), a
    library missing again makes the call fall back to EVALSHA. So :func:`run` sends a
    call at most four times (FCALL, FCALL, EVALSHA, EVALSHA); a :class:`Call` whose script
    is lost again after its load hands it to :func:`run`."""
    if isinstance(exc, NoScriptError):
        return None if _LOAD in done else _LOAD
    if fcall and _function_refused(exc):
        if _function_missing(exc) and _LOAD_LIBRARY not in done:
            return _LOAD_LIBRARY
        return _EVAL
    return None


def _send_on(pool: Any, command: Tuple[Any, ...]) -> bool:
    """Send ``command`` (a script or library load) on a connection of ``pool`` and read
    its answer: True if done, False if Redis refused it. Connection errors (and any
    exception raised meanwhile) propagate, with that connection closed."""
    connection = pool.get_connection()
    try:
        connection.send_command(*command, check_health=False)
        connection.read_response()
    except ResponseError:
        pool.release(connection)
        return False
    except BaseException:
        connection.disconnect()
        pool.release(connection)
        raise
    pool.release(connection)
    return True


class Call:
    """One script invocation with fixed KEYS/ARGV, packed into RESP once and re-sent as is.

    A primitive keeps one per (operation, owner, count): an uncontended acquire or release
    then costs one socket write and one read, with no per-call argument encoding (an
    :data:`OP` argument gets a fresh op id spliced into the packed bytes per send). Unlike
    redis-py's command path, a failed send is not retried: the caller's time stays bounded
    (a re-send would be safe: the script answers a repeat from its op record).
    """

    __slots__ = ("script", "keys", "args", "replication", "_packed", "_fpacked", "_route")

    def __init__(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        replication: Replication = None,
    ) -> None:
        self.script = script
        self.keys = tuple(keys)
        self.args = tuple(args)
        self.replication = replication
        # RESP bytes sent as is, or (before, after) the op id; None until the first send:
        # the EVALSHA form, and the FCALL form of a queue script (see _functions)
        self._packed: Any = None
        self._fpacked: Any = None
        # (client given, client to send through, its pool or None): a primitive passes
        # one client, so the lookups are made once per Call, not once per round trip.
        self._route: Tuple[Any, Any, Any] = (None, None, None)

    def __call__(
        self,
        client: Any,
        interrupted: Optional[Callable[[Reply], None]] = None,
        op: Optional[str] = None,
        *,
        done: Tuple[str, ...] = (),
    ) -> Reply:
        """Run the script on ``client``: one round trip; NOSCRIPT is recovered as in run().

        A queue script is sent as its queue library function (FCALL) where the server and
        user allow it: its server time is then that of the operation alone. The first call
        on a server without the library loads it (FUNCTION LOAD, then the call again); a
        server or user without functions is remembered per pool, and its calls use
        EVALSHA (both as in :func:`run`). The call is sent again on this path, so what is
        said above of interrupts holds for it (``done``: internal, the recovery steps taken
        so far, see :func:`_recovery`; a script lost again after its load goes to
        :func:`run`).

        ``interrupted``: for a round trip cut short, once the command was sent, by an
        exception that is not Redis's (raised by a signal handler: KeyboardInterrupt, an
        alarm-based timeout). The script ran or will run, so before the exception
        propagates a PING is sent after it on the same connection and the replies are
        read up to the PING's: the script has then surely run (a caller may look at its
        effect from any connection), and if its answer was read whole it is given to
        ``interrupted`` (to give back a grant nobody will record). The PING bounds that
        read even when the interrupt consumed part of the answer (a blind re-read would
        wait a socket timeout for bytes already taken). A second exception abandons it.
        ``op``: the op id to send (``None``: a fresh one of the calling thread), for a
        caller that must later tell from the op record whether this call ran.
        Only on the direct path (a plain ``redis.Redis``); an interrupt before or while
        the command is sent disconnects the connection (redis-py does) and tells nothing.

        It goes through :func:`~rlocks._engine.clients.io_client` (bounded, never re-sent).
        A connection or timeout error raised before anything was sent is marked so
        :func:`unsent` says so: only then is it certain that the script did not run.
        """
        given, sender, pool = self._route
        if given is not client:
            sender = io_client(client)
            pool = _direct_pool(sender)
            self._route = (client, sender, pool)
        client = sender
        if pool is None:
            return run(client, self.script, self.keys, self._args(op), self.replication)
        read: List[Any] = []  # the replies read so far: the script's, then WAIT's
        sent = False
        fcall = self.script.function is not None and _functions.get(pool, True)
        assert pool is _functions_key(client)
        # Nothing between taking the connection and the try: a signal handler's exception
        # raised there would strand it, counted in use by its pool for ever.
        try:
            connection = pool.get_connection()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            setattr(exc, _UNSENT, True)
            raise
        try:
            packed = self._fpacked if fcall else self._packed
            if packed is None:
                packed = self._pack(connection, fcall)
                if fcall:
                    self._fpacked = packed
                else:
                    self._packed = packed
            if isinstance(packed, tuple):
                # A fresh op id between the parts packed once (see _pack).
                sent_op = (op or new_op(identity.thread_owner())).encode()
                packed = [
                    b"%s$%d\r\n%s\r\n%s" % (packed[0], len(sent_op), sent_op, packed[1])
                ]
            connection.send_packed_command(packed, check_health=False)
            sent = True
            self._read_replies(connection, read)
            reply = decode(read[0], self.script.name)
            if self.replication is not None:
                reply = reply._replace(replicas=int(read[1]))
        except ResponseError as exc:
            refused = _login_refused(exc)
            if refused is not None:
                # Redis closes a connection it refuses for want of a login.
                connection.disconnect()
                pool.release(connection)
                raise refused from exc
            # An error reply, read whole: the connection is clean and goes back to the pool.
            pool.release(connection)
            step = _recovery(exc, fcall, done)
            if step is None:
                if isinstance(exc, NoScriptError):
                    # Loaded and lost again: the generic path has the last word (its own
                    # load raises what refuses it).
                    return run(client, self.script, self.keys, self._args(op), self.replication)
                raise
            # The call did not run: load what it lacks (or switch to EVALSHA), then send it
            # again on this path, so its interrupt handling holds for the call that runs.
            if step is _LOAD:
                _send_on(pool, ("SCRIPT", "LOAD", self.script.source))
            elif step is _LOAD_LIBRARY:
                if not _send_on(pool, ("FUNCTION", "LOAD", "REPLACE", _library_code(self.script))):
                    _functions[pool] = False
            else:
                _functions[pool] = False
            return self(client, interrupted, op, done=done + (step,))
        except BaseException as exc:
            if sent and interrupted is not None and connection._sock is not None and foreign(exc):
                self._finish_interrupted(connection, read, interrupted)
            # The reply may still be on its way: this connection cannot be reused.
            connection.disconnect()
            pool.release(connection)
            raise
        pool.release(connection)
        return reply

    def _args(self, op: Optional[str]) -> Sequence[Arg]:
        """The ARGV for the generic path (:func:`run`): with ``op`` in place of
        :data:`OP` if given (``None``: run stamps a fresh id)."""
        return self.args if op is None else with_op(self.args, op)

    def _pack(self, connection: Any, fcall: bool) -> Any:
        """The command(s) in RESP, once: as redis-py packs them, or with an :data:`OP`
        argument the bytes before and after it (each send puts a fresh op id there).
        ``fcall``: the script as its queue library function, else EVALSHA."""
        args = self.args
        marker = "#\x00rlocks-op\x00"  # never a real argument: ids and counts have no NUL
        stamp = any(arg == OP and isinstance(arg, str) for arg in args)
        if stamp:
            args = tuple(marker if arg == OP and isinstance(arg, str) else arg for arg in args)
        head = ("FCALL", self.script.function) if fcall else ("EVALSHA", self.script.sha)
        evalsha = (*head, len(self.keys), *self.keys, *args)
        if self.replication is None:
            packed = connection.pack_command(*evalsha)
        else:
            packed = connection.pack_commands([evalsha, ("WAIT", *self.replication)])
        if not stamp:
            return packed
        whole = b"".join(packed)
        bulk = b"$%d\r\n%s\r\n" % (len(marker), marker.encode())
        # The last one: KEYS (user names) come before the op ARGV, generated ids after it.
        at = whole.rindex(bulk)
        return whole[:at], whole[at + len(bulk):]

    def _read_replies(self, connection: Any, read: List[Any]) -> None:
        """Read the replies still missing from ``read``, appending each as it arrives.

        An error reply to the script is raised after WAIT's reply was read too, so the
        connection stays in step. An interrupted read leaves the connection open (the
        caller decides) and ``read`` says how far it got.
        """
        expected = 1 if self.replication is None else 2
        error: Optional[ResponseError] = None
        while len(read) < expected:
            try:
                read.append(connection.read_response(**_KEEP_OPEN))
            except ResponseError as exc:
                if len(read) or error is not None:
                    raise
                error = exc
                read.append(None)
        if error is not None:
            raise error

    def _finish_interrupted(
        self, connection: Any, read: List[Any], interrupted: Callable[[Reply], None]
    ) -> None:
        """After an interrupted read: fence with a PING, read up to its reply, then hand
        the script's answer (if it was read whole) to ``interrupted``."""
        expected = 1 if self.replication is None else 2
        try:
            connection.send_command("PING", _FENCE, check_health=False)
            while True:
                try:
                    answer = connection.read_response(**_KEEP_OPEN)
                except ResponseError as exc:
                    answer = exc
                if answer in (_FENCE, _FENCE_TEXT):
                    break
                read.append(answer)
            if len(read) != expected or isinstance(read[0], ResponseError):
                return  # part of the answer went with the interrupt: nothing to hand on
            reply = decode(read[0], self.script.name)
        except BaseException:  # noqa: BLE001 - abandoned: the first exception propagates
            return
        interrupted(reply)
