"""The ``rlocks`` command line (also ``python -m rlocks``).

``rlocks [--url URL] [--namespace NS] [--json] COMMAND``, where COMMAND is ``list``,
``inspect``, ``watch``, ``top``, ``release --force`` or ``demo``. The global options may also be
given after the command (``rlocks list --json``).

Built on click, which is a dependency of rlocks itself rather than of an extra: the
``rlocks`` console script is installed with the package and must not fail on import, and
click is small, pure Python and has no dependencies of its own.

A shell user's expectations, kept here in one place:

- output for people on stdout (``--json`` for programs), problems on stderr;
- exit status 0 when the command did what was asked; 1 when it could not (server
  unreachable, unknown name, confirmation refused); 2 for a usage error (bad option, a
  URL that is not a Redis URL, an ambiguous name);
- every expected failure is one line, ``Error: ...``, never a traceback: Redis errors are
  translated once, in :class:`_Group`. The password of a URL is never printed.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
import redis

from . import __version__, top
from ._engine import checks
from ._engine import state as _state
from ._engine.clients import DEFAULT_URL, encoding_of

__all__ = ["cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])

# Kind names a user may type, to the key kind (see rlocks._engine.keys): each kind's code
# and its public class name, from the one table of kinds (state.KINDS); a BoundedSemaphore
# is stored as a Semaphore.
_KIND_NAMES = {
    **{code: code for code in _state.KINDS},
    **{kind.label.lower(): code for code, kind in _state.KINDS.items()},
    "boundedsemaphore": "sem",
}


class Failure(click.ClickException):
    """An expected failure: one line on stderr, then exit 1."""

    # A class attribute, as click declares it (a ClassVar since click 8.2): the exit code is
    # chosen by the class raised, not set on the instance.
    exit_code = 1


class UsageFailure(Failure):
    """A failure the caller's arguments caused (bad URL, option, name): exit 2."""

    exit_code = 2


@dataclass
class _Settings:
    url: Optional[str] = None  # given with --url or RLOCKS_URL; None: neither
    namespace: str = "rlocks"
    json: bool = False
    _client: Any = None

    @property
    def effective_url(self) -> str:
        return self.url or DEFAULT_URL

    def client(self) -> "redis.Redis":
        """The client for the URL (made once). Failure (exit 2) for a malformed URL."""
        if self._client is None:
            try:
                # Bounded waits: a dead server must give an error, not a hung terminal.
                self._client = redis.Redis.from_url(
                    self.effective_url, socket_timeout=5, socket_connect_timeout=3
                )
            except ValueError as exc:
                url = redact(self.effective_url)
                raise UsageFailure(f"invalid Redis URL {url!r}: {exc}") from None
            self._client = _cluster_if_one(self._client, self.effective_url)
        client: "redis.Redis" = self._client
        return client


def _cluster_if_one(client: Any, url: str) -> Any:
    """A cluster client when the URL's server is a node of a Redis Cluster (its masters are
    then all scanned), else ``client`` itself. An error asking is left to the command."""
    try:
        enabled = int(client.info("cluster").get("cluster_enabled", 0))
    except redis.RedisError:
        return client
    if not enabled:
        return client
    from redis.cluster import RedisCluster

    client.close()
    return RedisCluster.from_url(url, socket_timeout=5, socket_connect_timeout=3)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe to print)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return "<unparsable URL>"


def _settings() -> _Settings:
    return click.get_current_context().ensure_object(_Settings)


# -- global options, accepted before and after the command ------------------------------


def _set_url(ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> None:
    if value is not None:
        ctx.ensure_object(_Settings).url = value


def _set_namespace(ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> None:
    if value is not None:
        if not value:
            raise UsageFailure("--namespace must not be empty")
        ctx.ensure_object(_Settings).namespace = value


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(_Settings).json = True


def _global_options(func: F, *, group: bool = False, url_default: str = DEFAULT_URL) -> F:
    # Callbacks store into the one _Settings object the group made: the group's callbacks
    # run first, so an option after the command wins over the same option before it.
    # Only the group reads RLOCKS_URL, or the variable would override `rlocks --url X cmd`.
    options = [
        click.option(
            "--url", envvar="RLOCKS_URL" if group else None, expose_value=False,
            callback=_set_url, help=f"Redis URL [env RLOCKS_URL; default {url_default}]",
        ),
        click.option(
            "--namespace", expose_value=False, callback=_set_namespace,
            help="key namespace of the primitives [default: rlocks]",
        ),
        click.option(
            "--json", "as_json", is_flag=True, expose_value=False, callback=_set_json,
            help="machine-readable output",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


class _Group(click.Group):
    """Translates Redis errors into one-line failures, for every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except redis.exceptions.RedisError as exc:
            url = redact(ctx.ensure_object(_Settings).effective_url)
            raise Failure(_redis_message(exc, url)) from None


def _redis_message(exc: Exception, url: str) -> str:
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return f"Redis at {url} refused the credentials: {detail}"
    if isinstance(exc, redis.exceptions.TimeoutError):
        return f"Redis at {url} did not answer in time: {detail}"
    if isinstance(exc, redis.exceptions.ConnectionError):
        return f"cannot reach Redis at {url}: {detail}"
    if isinstance(exc, redis.exceptions.ResponseError):
        return f"Redis at {url} refused a command: {detail}"
    return f"Redis error at {url}: {detail}"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@functools.partial(_global_options, group=True)
@click.version_option(__version__, prog_name="rlocks")
def cli() -> None:
    """Inspect and manage rlocks primitives (RLock, Lock, RWLock, Semaphore, Event,
    Barrier) in Redis."""
    _settings()


# -- formatting ---------------------------------------------------------------------------


def _duration(ms: Optional[int]) -> str:
    # top's cells, with tenths up to a minute: inspect shows leases, which ttls keep short
    return top.format_ms(ms, none="no expiry", tenths_below=60.0)


def _quoted(name: str) -> str:
    # Shell-quoted only when needed, so a name can be pasted back into a command.
    return shlex.quote(name)


def _next_lease(state: _state.PrimitiveState) -> Optional[int]:
    leases = [holder.lease_ms for holder in state.holders if holder.lease_ms is not None]
    return min(leases) if leases else state.lease_ms


def _holders_cell(state: _state.PrimitiveState) -> str:
    if state.kind != "rw":
        return str(len(state.holders))
    writers = sum(1 for holder in state.holders if holder.side == "write")
    readers = len(state.holders) - writers
    if not writers:
        return f"{readers}r"
    return f"{writers}w {readers}r" if readers else f"{writers}w"  # readers: a downgrade


def _table(rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _known(value: Optional[int]) -> str:
    # A semaphore's value and free permits are unknown while it has no holds hash (a
    # Semaphore(0) whose waiters queued before anyone released a permit).
    return "?" if value is None else str(value)


def _list_lines(states: Sequence[_state.PrimitiveState]) -> List[str]:
    # A STATE column only when a kind without holders (an Event) is listed.
    detail = any(state.detail is not None for state in states)
    rows = [("TYPE", "NAME", "HOLDERS", "HOLDS", "FREE", "LEASE", "WAITING")
            + (("STATE",) if detail else ())]
    for state in states:
        free = f"{_known(state.free)}/{_known(state.value)}" if state.kind == "sem" else "-"
        holds = str(state.holds) if state.holders else "0"
        lease = _duration(_next_lease(state)) if state.holders else "-"
        waiting = state.waiting_total
        rows.append((
            state.type, _quoted(state.name), _holders_cell(state), holds, free, lease,
            "?" if waiting is None else str(waiting),
        ) + ((state.detail or "-",) if detail else ()))
    return _table(rows)


def _plural(count: int, word: str, many: str = "") -> str:
    if count == 1:
        return f"{count} {word}"
    return f"{count} " + (many or word + ("es" if word.endswith("s") else "s"))


def _inspect_lines(state: _state.PrimitiveState) -> List[str]:
    lines = [f"{state.type} {_quoted(state.name)}",
             f"  namespace  {state.namespace}",
             f"  key        {state.key}"]
    if state.kind == "sem":
        lines.append(f"  permits    {_known(state.free)} free of {_known(state.value)} "
                     f"({state.holds} held by {_plural(len(state.holders), 'owner')})")
    elif state.detail is not None:
        lines.append(f"  state      {state.detail}")
    else:
        lines.append(f"  held       {_plural(state.holds, 'hold')} by "
                     f"{_plural(len(state.holders), 'owner')}")
    lines.append(f"  key expiry {_duration(state.lease_ms)}")
    if state.holders:
        lines.append("  holders")
        rows = [("    OWNER", "SIDE", "COUNT", "LEASE LEFT", "RENEWED")]
        for holder in state.holders:
            rows.append((f"    {holder.owner}", holder.side or "-", str(holder.count),
                         _duration(holder.lease_ms), _renewed(holder)))
        lines += _table(rows)
    # (one entry per waiting thread or asyncio task, head first)
    lines.append(f"  queue      {_plural(len(state.queue or ()), 'entry', 'entries')} waiting")
    if state.queue:
        queue_rows: List[Tuple[str, ...]] = [
            ("    #", "WAITER", "SIDE", "WANTS", "LEASE LEFT", "WAITING FOR")
        ]
        for position, entry in enumerate(state.queue, 1):
            queue_rows.append((f"    {position}", entry.waiter, entry.side or "-",
                               str(entry.wanted), _duration(entry.lease_left_ms),
                               _duration(entry.age_ms)))
        lines += _table(queue_rows)
    if state.stale:
        lines.append(f"  stale entries  {state.stale} (leases ended; tidied by the next "
                     "operation on it)")
    return lines


def _renewed(holder: Any) -> str:
    """How long ago the holder's lease was set; flagged when that is over a third of the
    lease and a second (a live process renews every third: this one may be stopped)."""
    ago, left = holder.renewed_ms, holder.lease_ms
    if ago is None:
        return "-"
    text = f"{_duration(ago)} ago"
    if left is not None and ago > (ago + left) / 3 + 1000:
        text += " (late: is its process running?)"
    return text


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, sort_keys=True))


def _kind_code(kind: Optional[str]) -> Optional[str]:
    if kind is None:
        return None
    return _KIND_NAMES[kind.lower()]


_kind_option = click.option(
    "--kind", type=click.Choice(sorted(_KIND_NAMES), case_sensitive=False),
    help="only primitives of this kind",
)


def _not_found(name: str, settings: _Settings) -> Failure:
    return Failure(
        f"no primitive named {name!r} in namespace {settings.namespace!r} at "
        f"{redact(settings.effective_url)} (a free lock leaves no key)"
    )


# -- commands -----------------------------------------------------------------------------


@cli.command("list")
@click.argument("pattern", default="*")
@_kind_option
@_global_options
def list_command(pattern: str, kind: Optional[str]) -> None:
    """List the primitives whose name matches the glob PATTERN (default: all).

    WAITING counts the entries in the primitive's queue: one per waiting thread or
    asyncio task, whatever its process.
    """
    settings = _settings()
    code = _kind_code(kind)
    client = settings.client()
    _wire_checked(client, settings.namespace, "pattern", pattern)
    states = _state.list_primitives(
        client, settings.namespace, pattern, kinds=None if code is None else [code]
    )
    if settings.json:
        _emit_json([state.to_dict() for state in states])
        return
    if not states:
        click.echo(f"no primitives matching {pattern!r} in namespace "
                   f"{settings.namespace!r}", err=True)
        return
    for line in _list_lines(states):
        click.echo(line)


def _wire_checked(client: Any, namespace: str, what: str, text: str) -> None:
    """The check a primitive makes of its name, for a name or pattern the CLI looks up:
    over a client of another encoding than UTF-8, non-ASCII text could name other keys
    than the programs' (see docs/threading.md, "Names and encodings")."""
    try:
        checks.check_wire_names(
            {what: text, "namespace": namespace}, [encoding_of(client)], "rlocks"
        )
    except ValueError as exc:
        raise UsageFailure(str(exc)) from None


def _find(client: Any, namespace: str, name: str, code: Optional[str]) -> Any:
    """``state.find`` of a name that passed :func:`_wire_checked`."""
    _wire_checked(client, namespace, "name", name)
    return _state.find(client, namespace, name, code)


@cli.command("inspect")
@click.argument("name")
@_kind_option
@_global_options
def inspect_command(name: str, kind: Optional[str]) -> None:
    """Show one primitive: holders, counts, leases, waiters.

    When several kinds use NAME, all are shown (--kind picks one).
    """
    settings = _settings()
    states = _find(settings.client(), settings.namespace, name, _kind_code(kind))
    if not states:
        raise _not_found(name, settings)
    if settings.json:
        _emit_json(states[0].to_dict() if len(states) == 1 else [s.to_dict() for s in states])
        return
    for i, state in enumerate(states):
        if i:
            click.echo()
        for line in _inspect_lines(state):
            click.echo(line)


@cli.command("watch")
@click.argument("name")
@_kind_option
@click.option("-n", "--interval", type=click.FloatRange(min=0.05), default=1.0,
              show_default=True, help="seconds between refreshes")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="stop after this many refreshes [default: until Ctrl-C]")
@_global_options
def watch_command(name: str, kind: Optional[str], interval: float, count: Optional[int]) -> None:
    """Show NAME again every --interval seconds (a live view).

    A primitive with no key in Redis is shown as free: it may be taken later. With --json,
    one JSON object per refresh, one per line.
    """
    settings = _settings()
    client = settings.client()
    code = _kind_code(kind)
    _wire_checked(client, settings.namespace, "name", name)  # (once, not per refresh)
    redraw = sys.stdout.isatty() and not settings.json
    frame = 0
    try:
        while count is None or frame < count:
            if frame:
                time.sleep(interval)
            frame += 1
            states = _state.find(client, settings.namespace, name, code)
            stamp = time.strftime("%H:%M:%S")
            if settings.json:
                _emit_json({"time": time.time(), "name": name,
                            "primitives": [state.to_dict() for state in states]})
                continue
            lines = [f"{stamp}  every {interval:g}s  (Ctrl-C to stop)"]
            for state in states:
                lines += [""] + _inspect_lines(state)
            if not states:
                lines += ["", f"{_quoted(name)}: no key in namespace {settings.namespace!r} "
                              "(free, or never used)"]
            if redraw:
                click.clear()
            elif frame > 1:
                lines.insert(0, "")
            click.echo("\n".join(lines))
    except KeyboardInterrupt:
        # Ctrl-C is how a watch ends: no traceback, no "Aborted!".
        click.echo()


@cli.command("top")
@click.argument("pattern", default="*")
@_kind_option
@click.option("-n", "--interval", type=click.FloatRange(min=0.1), default=1.0,
              show_default=True, help="seconds between refreshes")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="stop after this many refreshes [default: until Ctrl-C]")
@_global_options
def top_command(pattern: str, kind: Optional[str], interval: float, count: Optional[int]
                ) -> None:
    """A live view of the namespace: contended primitives first.

    One row per primitive whose name matches the glob PATTERN (default: all): holders,
    how long the longest hold has been seen held, lease left, waiters and the oldest
    waiter's age; refreshed every --interval seconds until Ctrl-C. Primitives with
    waiters come first, then the longest holds. Once a refresh was shown, one that cannot
    reach Redis keeps the last rows and retries. With --json, one snapshot and exit.
    The live view needs rich (rlocks' top extra); --json does not.
    """
    settings = _settings()
    if settings.json and count is not None:
        raise UsageFailure("--count has no effect with --json, which prints one snapshot")
    if not settings.json:
        try:
            top.require_rich()
        except top.RichMissing as exc:
            raise Failure(str(exc)) from None
    client = settings.client()
    _wire_checked(client, settings.namespace, "pattern", pattern)
    code = _kind_code(kind)

    def read() -> List[_state.PrimitiveState]:
        return _state.list_primitives(client, settings.namespace, pattern,
                                        kinds=None if code is None else [code])

    if settings.json:
        _emit_json(top.snapshot(read(), settings.namespace))
        return

    where = f"namespace {settings.namespace!r} at {redact(settings.effective_url)}"

    def title(rows: Sequence[top.Row]) -> str:
        contended = sum(1 for row in rows if row.waiters)
        # Most telling first: a narrow terminal cuts the end of the line.
        return (f"rlocks top  {time.strftime('%H:%M:%S')}  "
                f"{_plural(len(rows), 'primitive')}, {contended} with waiters  "
                f"{where}  every {interval:g}s, Ctrl-C to stop")

    top.run_live(read, title, interval, count)


@cli.command("release")
@click.argument("name")
@click.option("--force", is_flag=True, help="required: delete the primitive's state")
@click.option("-y", "--yes", is_flag=True, help="do not ask for confirmation")
@_kind_option
@_global_options
def release_command(name: str, force: bool, yes: bool, kind: Optional[str]) -> None:
    """Force-release NAME: end every hold on it and wake its queue of waiters.

    Deletes the primitive's holds in one Lua script that also wakes every waiter in its
    queue; each asks again with its own acquire, so the freed primitive goes in queue
    order (the head; a semaphore: as many waiters as the permits cover; an RWLock: the
    next writer, or the readers before it) and the others keep their places. Live holders
    are not stopped: they find their hold lost at their next renewal or release
    (LockLostError, on_lost). Asks for confirmation unless --yes; refuses without --yes
    when stdin is not a terminal.
    """
    settings = _settings()
    if not force:
        raise UsageFailure("release needs --force: it ends holds that other processes own "
                           "(they will get LockLostError)")
    client = settings.client()
    states = _find(client, settings.namespace, name, _kind_code(kind))
    if not states:
        raise _not_found(name, settings)
    if len(states) > 1:
        kinds = ", ".join(state.type for state in states)
        raise UsageFailure(f"{name!r} names several primitives ({kinds}): choose one with --kind")
    state = states[0]
    if state.detail is not None:  # an Event or a Barrier: state, not holds
        raise Failure(f"{state.type} {_quoted(name)} has no holds to release: its own "
                      f"{'clear()' if state.kind == 'event' else 'reset()'} changes it")
    summary = (f"{state.type} {_quoted(name)}: {_plural(state.holds, 'hold')} of "
               f"{_plural(len(state.holders), 'owner')}")
    if not yes:
        if not _stdin_is_tty():
            raise Failure(f"refusing to force-release {summary} without --yes "
                          "(stdin is not a terminal to confirm on)")
        if not click.confirm(f"Force-release {summary}?", default=False, err=True):
            raise Failure("not released")
    forced = _state.force_release(client, settings.namespace, state.kind, name)
    if settings.json:
        # "handed_to" is the name earlier versions gave the count: kept for scripts.
        _emit_json({"released": forced.released, "woken": forced.handed,
                    "handed_to": forced.handed, "primitive": state.to_dict()})
    elif forced.released:
        woken = (f"woke {_plural(forced.handed, 'waiter')}" if forced.handed
                 else "nobody was waiting")
        click.echo(f"released {summary}; {woken}")
    else:
        click.echo(f"{state.type} {_quoted(name)} was already free", err=True)


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # closed or replaced stdin
        return False


@cli.command("demo")
@click.option("--processes", type=click.IntRange(min=1), default=4, show_default=True,
              help="worker processes")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="threads per worker process")
@click.option("--iterations", type=click.IntRange(min=1), default=150, show_default=True,
              help="critical sections per thread in each use case")
@click.option("--pool-size", type=click.IntRange(min=1), default=3, show_default=True,
              help="the Semaphore's limit (less than processes x threads)")
@functools.partial(_global_options, url_default="a throwaway redis-server it starts")
def demo_command(processes: int, threads: int, iterations: int, pool_size: int) -> None:
    """Run the three use cases across processes and threads, then verify them.

    Starts a throwaway redis-server when neither --url nor RLOCKS_URL is given.
    Exits 0 only when every check in the final table holds.
    """
    from . import demo  # multiprocessing and the server helper load only for the demo

    settings = _settings()
    if pool_size >= processes * threads:
        raise UsageFailure(f"--pool-size ({pool_size}) must be less than --processes x --threads "
                           f"({processes * threads}) so the pool is contended")
    if settings.url is not None:
        settings.client()  # a malformed URL fails here, in one line
    options = demo.Options(processes, threads, iterations, pool_size)
    try:
        ok = demo.run(settings.url, settings.namespace, options, as_json=settings.json)
    except demo.ServerUnavailable as exc:
        raise Failure(str(exc)) from None
    if not ok:
        sys.exit(1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``rlocks`` console script; returns the exit status."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="rlocks",
                 standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        sys.stderr.write(f"{code}\n")
        return 1
    return 0
