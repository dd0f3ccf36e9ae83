"""``rlocks top``: the view (rlocks.top) on hand-built states, the command on a real server,
and the live screen in a real terminal (tmux).

The engine's states carry the queue of waiters (``state.queue``, one entry per waiting
thread or task); top also renders a state without one (``N proc``), so rows built from
states with and without a queue are both tested.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import redis
from click.testing import CliRunner, Result
from rich.console import Console

import rlocks
from rlocks import cli, top
from rlocks._engine import identity
from rlocks._engine import state as ins
from rlocks.server import TemporaryRedisServer, free_port

OWNER_A = "web1:100:aaaaaaaaaaaaaaaa:1"
OWNER_B = "web2:200:bbbbbbbbbbbbbbbb:7"
OWNER_C = "web3:300:cccccccccccccccc:p"


def entry(waiter: str, side: str, lease_left_ms: int, age_ms: int) -> ins.QueueEntry:
    """One waiter, as the engine's ``state.queue`` lists them."""
    member = f"{0:016d}:{side[:1] or 'x'}:{waiter}"
    return ins.QueueEntry(waiter, side, 1, lease_left_ms, age_ms, member)


def state(name: str, holders: Tuple[ins.Holder, ...] = (), waiting: int = 0,
          kind: str = "rlock", **more: Any) -> ins.PrimitiveState:
    """A hand-built state; with ``queue=`` as the engine reads it, without one as a state
    whose queue was not read (``waiting`` counts its waiters)."""
    label = {"rlock": "RLock", "rw": "RWLock", "sem": "Semaphore"}[kind]
    return ins.PrimitiveState(
        namespace="ns", kind=kind, name=name, key=f"ns:{kind}:{{{name}}}", type=label,
        holders=holders, lease_ms=30000 if holders else None,
        waiting=(("wake", len(more.get("queue", ())) or waiting),), **more)


def held_by(owner: str, lease_ms: int = 20000, side: str = "") -> Tuple[ins.Holder, ...]:
    return (ins.Holder(owner, 1, lease_ms, side),)


class FakeClock:
    """A monotonic clock the test moves by hand (the HoldClock's only input besides states)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def render(rows: List[top.Row], width: int = 160) -> List[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(top.screen(rows, "title"))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in text.splitlines()]


def cells_of(line: str) -> List[str]:
    # Columns are at least two spaces apart (one of padding on each side).
    return re.split(r"\s{2,}", line.strip())


def row_line(lines: List[str], name: str) -> Optional[List[str]]:
    for line in lines:
        found = cells_of(line)
        if len(found) >= 2 and found[1] == name:
            return found
    return None


# -- the view, on hand-built states -----------------------------------------------------------


def test_waiters_first_then_the_longest_holds_then_the_rest() -> None:
    clock = FakeClock()
    hold_clock = top.HoldClock(clock)
    old = state("old-hold", held_by(OWNER_A))
    hold_clock.observe([old])  # seen at the first look: its age is a lower bound
    clock.now += 30
    young = state("young-hold", held_by(OWNER_B))
    subscribed = state("subscribed", held_by(OWNER_A), waiting=1)
    queued = state("queued", held_by(OWNER_C), queue=(
        entry(OWNER_B, "", 9000, 4500), entry(OWNER_A, "", 9000, 1200)))
    free_sem = state("idle-pool", kind="sem", value=3, free=3)
    states = [free_sem, young, old, subscribed, queued]
    ages = hold_clock.observe(states)
    clock.now += 2
    rows = top.rows_for(states, ages)
    # The queued one has a known oldest waiter (4.5 s); the bare count has none.
    assert [row.state.name for row in rows] == [
        "queued", "subscribed", "old-hold", "young-hold", "idle-pool"]

    lines = render(rows)
    order = [cells[1] for cells in map(cells_of, lines) if len(cells) == 8][1:]  # no header
    assert order == ["queued", "subscribed", "old-hold", "young-hold", "idle-pool"]
    assert row_line(lines, "queued") == [
        "RLock", "queued", "1", "web3:300:p", "0.0s", "20s", "2", "4.5s"]
    assert row_line(lines, "subscribed") == [
        "RLock", "subscribed", "1", "web1:100:1", "0.0s", "20s", "1 proc", "?"]
    assert row_line(lines, "old-hold") == [
        "RLock", "old-hold", "1", "web1:100:1", ">=30s", "20s", "-", "-"]
    assert row_line(lines, "idle-pool") == [
        "Semaphore", "idle-pool", "0 (3/3 free)", "-", "-", "-", "-", "-"]
    # The legend explains "N proc" only when such a cell is shown.
    legend = " ".join(lines)
    assert "N proc: processes subscribed to wake-ups" in legend
    assert "N proc" not in " ".join(render([top.rows_for([queued])[0]]))


def test_a_primitive_with_waiters_outranks_an_older_hold_without() -> None:
    clock = FakeClock()
    hold_clock = top.HoldClock(clock)
    cold = state("cold", held_by(OWNER_A))
    hold_clock.observe([cold])
    clock.now += 3600
    hot = state("hot", held_by(OWNER_B), waiting=2)
    rows = top.rows_for([cold, hot], hold_clock.observe([cold, hot]))
    assert [row.state.name for row in rows] == ["hot", "cold"]
    assert row_line(render(rows), "cold")[4] == ">=1h00m"


def test_the_hold_clock_ages_holds_from_when_it_first_saw_them() -> None:
    clock = FakeClock()
    hold_clock = top.HoldClock(clock)
    a = state("x", held_by(OWNER_A))
    assert hold_clock.observe([a]) == {("rlock", "x", OWNER_A, ""): (0, True)}
    clock.now += 1.5
    b = state("x", held_by(OWNER_B))  # A released, B took it between two refreshes
    assert hold_clock.observe([b]) == {("rlock", "x", OWNER_B, ""): (0, False)}
    clock.now += 2.25
    assert hold_clock.observe([b]) == {("rlock", "x", OWNER_B, ""): (2250, False)}
    clock.now += 1
    hold_clock.observe([])  # released: forgotten
    assert hold_clock.observe([a]) == {("rlock", "x", OWNER_A, ""): (0, False)}


def test_an_rwlock_row_counts_sides_and_ages_its_oldest_hold() -> None:
    clock = FakeClock()
    hold_clock = top.HoldClock(clock)
    first = state("cfg", kind="rw", holders=held_by(OWNER_A, 5000, "read"))
    hold_clock.observe([first])
    clock.now += 12
    both = state("cfg", kind="rw", holders=held_by(OWNER_A, 5000, "read")
                 + held_by(OWNER_B, 4000, "read"))
    row = top.rows_for([both], hold_clock.observe([both]))[0]
    assert (row.hold_age_ms, row.hold_age_floor, row.lease_left_ms) == (12000, True, 4000)
    assert top.cells(row)[2:6] == ("2r", "web1:100:1 +1", ">=12s", "4.0s")


def test_names_and_owners_are_shown_as_written_never_as_markup() -> None:
    name = "[bold red]jobs[/] :100: [link=x]"
    owner = "db:1:aaaaaaaaaaaaaaaa:[b]"
    rows = top.rows_for([state(name, held_by(owner))])
    lines = render(rows)
    assert row_line(lines, name) == ["RLock", name, "1", "db:1:[b]", "?", "20s", "-", "-"]


def test_formatting_helpers() -> None:
    assert [top.format_ms(ms) for ms in (None, -5, 400, 9_960, 12_500, 185_000, 7_300_000)] == [
        "-", "0.0s", "0.4s", "10.0s", "12s", "3m05s", "2h01m"]
    assert top.short_owner(OWNER_A) == "web1:100:1"
    assert top.short_owner(OWNER_C) == "web3:300:p"
    assert top.short_owner("not-an-owner-id") == "not-an-owner-id"


def test_snapshot_rows_carry_the_queue_when_the_state_has_one() -> None:
    waiting = entry(OWNER_B, "write", 8000, 700)
    queued = state("q", held_by(OWNER_A), queue=(waiting,))
    data = top.rows_for([queued])[0].to_dict()
    assert data["queue"] == [{"waiter": OWNER_B, "side": "write", "wanted": 1,
                              "lease_left_ms": 8000, "age_ms": 700, "entry": waiting.entry}]
    assert (data["queue_length"], data["queue_source"], data["oldest_wait_ms"]) == (
        1, "queue", 700)
    plain = top.rows_for([state("p", held_by(OWNER_A), waiting=3)])[0].to_dict()
    assert (plain["queue"], plain["queue_length"], plain["queue_source"],
            plain["oldest_wait_ms"], plain["hold_age_ms"]) == (None, 3, "subscribers", None, None)


# -- the command, on the test server -----------------------------------------------------------


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def ns() -> str:
    return f"top-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def run(ns: str) -> Callable[..., Result]:
    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli.cli, ["--namespace", ns, *args], catch_exceptions=False)

    return invoke


class Contention:
    """``cold`` held with nobody waiting; after ``start()``, ``hot`` held with waiters.

    Every hold is this process's (a thread each); ``let_go`` ends the waiters' holds.
    Errors of the waiting threads are re-raised by ``close``.
    """

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.cold = rlocks.RLock("cold", namespace=ns)
        self.hot = rlocks.RLock("hot", namespace=ns)
        assert self.cold.acquire()
        self.granted: List[str] = []  # waiters' owner ids, in grant order
        self.let_go = threading.Event()
        self.errors: List[BaseException] = []
        self.threads: List[threading.Thread] = []

    def start(self, waiters: int = 2) -> "Contention":
        assert self.hot.acquire()
        self.threads = [threading.Thread(target=self._wait, daemon=True) for _ in range(waiters)]
        for thread in self.threads:
            thread.start()
        return self

    def _wait(self) -> None:
        try:
            lock = rlocks.RLock("hot", namespace=self.ns)
            if not lock.acquire(timeout=60):
                raise AssertionError("a waiter was never granted 'hot'")
            self.granted.append(identity.thread_owner())
            self.let_go.wait(60)
            lock.release()
        except BaseException as exc:  # re-raised in the main thread by close()
            self.errors.append(exc)

    def close(self) -> None:
        self.let_go.set()
        for lock in (self.hot, self.cold):
            try:
                lock.release()
            except RuntimeError:
                pass  # released by the test already, or never taken
        for thread in self.threads:
            thread.join(30)
        if self.errors:
            raise self.errors[0]


@pytest.fixture
def contention(ns: str) -> Iterator[Contention]:
    scene = Contention(ns)
    try:
        yield scene
    finally:
        scene.close()


def test_json_prints_one_snapshot_contended_first(
    run: Callable[..., Result], ns: str, contention: Contention
) -> None:
    contention.start()
    def snapshot() -> Dict[str, Any]:
        result = run("top", "--json")
        assert result.exit_code == 0, result.output
        assert len(result.stdout.splitlines()) == 1
        data: Dict[str, Any] = json.loads(result.stdout)
        return data

    data = wait_for(lambda: (d := snapshot())["primitives"][0]["queue_length"] == 2 and d,
                    "both waiters to show")
    assert set(data) == {"time", "namespace", "primitives"} and data["namespace"] == ns
    assert [p["name"] for p in data["primitives"]] == ["hot", "cold"]
    hot, cold = data["primitives"]
    for entry in (hot, cold):
        # inspect's fields, plus top's.
        assert {"type", "name", "holders", "lease_ms", "waiting", "hold_age_ms",
                "lease_left_ms", "queue", "queue_length", "queue_source",
                "oldest_wait_ms"} <= set(entry)
        assert entry["hold_age_ms"] is None  # one snapshot has seen no hold begin
        assert entry["lease_left_ms"] > 0
    assert hot["holders"][0]["owner"] == identity.thread_owner()
    # One entry per waiting thread: the two waiters, both threads of this process.
    assert hot["queue_source"] == "queue" and len(hot["queue"]) == 2
    waiters = [entry["waiter"] for entry in hot["queue"]]
    assert len(set(waiters)) == 2 and identity.thread_owner() not in waiters
    assert all(w.startswith(identity.process_token() + ":") for w in waiters)
    assert hot["oldest_wait_ms"] == max(entry["age_ms"] for entry in hot["queue"]) >= 0
    assert (cold["queue"], cold["queue_length"], cold["oldest_wait_ms"]) == ([], 0, None)


def test_without_a_terminal_each_refresh_is_printed(
    run: Callable[..., Result], ns: str, contention: Contention
) -> None:
    contention.start()
    result = run("top", "--count", "2", "--interval", "0.1")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("rlocks top") == 2
    assert result.stdout.count(f"namespace {ns!r}") == 2
    assert result.stdout.count(" cold ") == 2
    assert "2 primitives" in result.stdout
    only_cold = run("top", "cold", "--count", "1", "--kind", "rlock")
    assert " cold " in only_cold.stdout and " hot " not in only_cold.stdout


def test_an_empty_namespace(run: Callable[..., Result]) -> None:
    result = run("top", "--count", "1")
    assert result.exit_code == 0 and "(no primitives)" in result.stdout
    assert json.loads(run("top", "--json").stdout)["primitives"] == []


def one_line_error(result: Result) -> str:
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--interval", "0"], "Invalid value for '-n' / '--interval'"),
    (["--interval", "soon"], "'soon' is not a valid float"),
    (["--count", "0"], "Invalid value for '--count'"),
    (["--kind", "mutex"], "Invalid value for '--kind'"),
    (["--json", "--count", "2"], "--count has no effect with --json"),
    (["--namespace", ""], "--namespace must not be empty"),
    (["--url", "foo://localhost"], "invalid Redis URL"),
])
def test_bad_options_are_usage_errors_before_any_connection(args: List[str], message: str) -> None:
    # An unreachable URL: a usage error (exit 2) must come before any attempt to connect
    # (which would fail with exit 1).
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = CliRunner().invoke(cli.cli, ["--url", url, "top", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_an_unreachable_server_is_one_line_and_hides_the_password() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    for args in (["top", "--count", "1"], ["top", "--json"]):
        result = CliRunner().invoke(cli.cli, ["--url", url, *args])
        assert result.exit_code == 1, result.output
        assert one_line_error(result).startswith("Error: cannot reach Redis at redis://:***@")
        assert "hunter2" not in result.output


def test_a_refresh_that_cannot_reach_redis_keeps_the_view_and_retries() -> None:
    """Redis goes away after the first refresh and comes back on the same port: the view
    says so, keeps the last rows, and resumes; it does not end on the dropped link."""
    server = TemporaryRedisServer().start()
    client = redis.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)
    lock = rlocks.RLock("kept", client=client, namespace="topdrop")
    assert lock.acquire()
    reads = 0

    def read() -> List[ins.PrimitiveState]:
        nonlocal server, reads
        reads += 1
        if reads == 2:
            server.stop()  # refreshes 2 and 3 find nobody listening
        if reads == 4:
            server = TemporaryRedisServer(port=server.port).start()  # empty: nothing held
        return ins.list_primitives(client, "topdrop", "*")

    out = io.StringIO()
    try:
        top.run_live(read, lambda rows: f"frame of {len(rows)}", 0.01, count=5,
                     console=Console(file=out, width=200))
    finally:
        # The restarted server forgot the hold: the release finds it lost.
        with pytest.raises(rlocks.LockLostError):
            lock.release()
        server.stop()
    titles = [line for line in out.getvalue().splitlines()
              if line.startswith(("frame of", "Redis unreachable"))]
    assert [title.split(",")[0] for title in titles] == [
        "frame of 1", "Redis unreachable", "Redis unreachable", "frame of 0", "frame of 0"
    ]
    # While unreachable, the last rows stay on the screen.
    frames = out.getvalue().split("Redis unreachable")
    assert " kept " in frames[1] and " kept " in frames[2]


def test_the_first_refresh_that_cannot_reach_redis_ends_the_view() -> None:
    def read() -> List[ins.PrimitiveState]:
        raise redis.exceptions.ConnectionError("nobody there")

    with pytest.raises(redis.exceptions.ConnectionError):
        top.run_live(read, lambda rows: "never", 0.01, count=3,
                     console=Console(file=io.StringIO(), width=200))


def test_without_rich_the_screen_says_what_to_install_and_json_still_works(
    run: Callable[..., Result], ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("rich", "rich.live", "rich.table"):
        monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError
    result = run("top", "--count", "1")
    assert result.exit_code == 1
    error = one_line_error(result)
    assert "pip install 'rich>=13.0'" in error and "pip install '.[top]'" in error
    assert run("top", "--json").exit_code == 0


# -- a real terminal ---------------------------------------------------------------------------


class Tmux:
    """A tmux server of our own (its socket in ``folder``), one detached session running
    ``command``."""

    def __init__(self, folder: Path, command: List[str], width: int = 150, height: int = 30
                 ) -> None:
        self.socket = str(folder / "tmux.sock")
        # The shell stays after the command so a crash is on the screen, not a lost pane.
        line = f"{shlex.join(command)}; echo EXITED $?; sleep 120"
        self._tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), line)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def screen(self) -> List[str]:
        return self._tmux("capture-pane", "-p", "-t", "top").splitlines()

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def wait_for(self, predicate: Callable[[List[str]], Any], what: str,
                 may_exit: bool = False) -> List[str]:
        last: List[str] = []

        def check() -> Any:
            nonlocal last
            last = self.screen()
            if not may_exit and any(line.startswith("EXITED") for line in last):
                raise AssertionError("rlocks top exited:\n" + "\n".join(last))
            return predicate(last)

        try:
            wait_for(check, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n" + "\n".join(last)) from None
        return last

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_in_a_real_terminal(
    redis_url: str, ns: str, contention: Contention, tmp_path: Path,
) -> None:
    tmux = Tmux(tmp_path, [sys.executable, "-m", "rlocks", "--url", redis_url, "--namespace", ns,
                 "top", "--interval", "0.2"])
    try:
        def hot_row(lines: List[str]) -> Optional[List[str]]:
            return row_line(lines, "hot")

        # First only 'cold', held since before top started.
        lines = tmux.wait_for(lambda lines: row_line(lines, "cold"), "'cold'")
        assert row_line(lines, "cold")[4].startswith(">=")  # type: ignore[index]

        # Then 'hot', with two waiters: it comes first, though 'cold' is held for longer.
        contention.start()
        # The waiters queue a moment after they start: wait for both on the screen.
        lines = tmux.wait_for(lambda lines: (row := hot_row(lines)) and row[6] == "2",
                              "'hot' with QUEUE 2")
        names = [cells[1] for cells in map(cells_of, lines) if cells[:1] == ["RLock"]]
        assert names == ["hot", "cold"], lines
        assert any("2 primitives, 1 with waiters" in line for line in lines), lines
        hot = hot_row(lines)
        cold = row_line(lines, "cold")
        assert hot is not None and cold is not None
        me = top.short_owner(identity.thread_owner())
        assert hot[2:4] == ["1", me] and cold[2:4] == ["1", me]
        # A hold that began while top watched has a measured age, not a lower bound.
        assert not hot[4].startswith(">=") and cold[4].startswith(">="), lines
        assert re.fullmatch(r"[0-9.]+s", hot[7]), lines
        assert cold[6:] == ["-", "-"]

        # The holder lets go: the head waiter is granted, and the row follows; the other
        # waiter keeps its place in the queue.
        contention.hot.release()
        first = wait_for(lambda: contention.granted[:1], "a waiter's grant")[0]
        lines = tmux.wait_for(
            lambda lines: (row := hot_row(lines)) and row[3] == top.short_owner(first)
            and row[6] == "1",
            "the new holder of 'hot', with QUEUE 1")
        hot = hot_row(lines)
        assert hot is not None and hot[2] == "1", lines

        # Everyone lets go: 'hot' has no key any more and leaves the screen; cold stays.
        contention.let_go.set()
        lines = tmux.wait_for(lambda lines: hot_row(lines) is None
                              and row_line(lines, "cold") is not None, "'hot' to go")
        assert any("1 primitive, 0 with waiters" in line for line in lines), lines

        # Ctrl-C ends it quietly: status 0, the last frame left on the screen.
        tmux.keys("C-c")
        lines = tmux.wait_for(lambda lines: "EXITED 0" in lines, "exit status 0 after Ctrl-C",
                              may_exit=True)
        assert row_line(lines, "cold") is not None, lines
        assert not any("Traceback" in line or "Aborted" in line for line in lines), lines
    finally:
        tmux.close()
