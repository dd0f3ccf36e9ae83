"""One seeded history run: servers, workers, nemesis, then the checker's report.

``run(RunConfig(...))`` starts the servers (one, with or without persistence, behind a
proxy; or a cluster with replicas) and the fenced store, spawns the workers, lets the
nemesis inject faults for ``seconds``, leaves a quiet tail, stops the workers, and checks
the history. Everything the run wrote stays in its folder: each worker's events, the
nemesis', ``config.json``, ``report.json`` and ``report.txt``, and ``history.png`` where
matplotlib is installed and asked for.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._proxy import FaultyLink
from .check import Params, Report, check, load
from .nemesis import CLUSTER_FAULTS, SINGLE_FAULTS, Nemesis
from .servers import Cluster, Node
from .worker import FENCE_KEYS, Recorder
from .workload import KINDS

__all__ = ["RunConfig", "Result", "run"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunConfig:
    seed: int = 1
    seconds: float = 30.0
    topology: str = "single"  # or "cluster"
    driver: str = "thread"  # or "asyncio"
    kinds: Sequence[str] = KINDS
    faults: Optional[Sequence[str]] = None  # None: every kind the topology has
    persist: bool = True  # single server: appendonly yes, appendfsync always
    workers: int = 3
    threads: int = 2  # per kind and worker
    ttl: float = 0.6  # object "a"; object "b" has ttl2 (more than 3 times longer, so that a
    ttl2: float = 2.1  # re-entry through "a" that cut "b"'s lease would lose the hold)
    entry_lease: float = 0.5
    permits: int = 2
    fair: bool = True
    cancel: float = 0.05  # asyncio: share of acquires and releases cancelled
    socket_timeout: float = 2.0
    load: int = 0  # CPU hogs beside the workers
    quiet: Tuple[float, float] = (1.5, 3.0)
    shape: Dict[str, float] = field(default_factory=dict)
    out: Optional[str] = None
    plot: bool = False

    def fault_kinds(self) -> Sequence[str]:
        every = CLUSTER_FAULTS if self.topology == "cluster" else SINGLE_FAULTS
        chosen = every if self.faults is None else self.faults
        unknown = [k for k in chosen if k not in every]
        if unknown:
            raise ValueError(f"faults {unknown} do not apply to a {self.topology} run "
                             f"(choose from {', '.join(every)})")
        return chosen

    def params(self) -> Params:
        return Params(ttl=max(self.ttl, self.ttl2), entry_lease=self.entry_lease,
                      permits=self.permits, fair=self.fair)


@dataclass
class Result:
    folder: str
    report: Report
    events: int

    @property
    def ok(self) -> bool:
        return self.report.ok


class Workers:
    """The run's worker processes, by id; a killed one is replaced by a new id."""

    def __init__(self, folder: str, config_path: str, record: Recorder) -> None:
        self.folder = folder
        self.config_path = config_path
        self.record = record
        self.procs: Dict[str, subprocess.Popen[bytes]] = {}
        self.serial = 0
        self.retired: Dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self) -> str:
        self.serial += 1
        wid = f"w{self.serial}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        err = open(os.path.join(self.folder, f"{wid}.err"), "wb")
        try:
            self.procs[wid] = subprocess.Popen(
                [sys.executable, "-m", "tests.history.worker", self.config_path, wid],
                cwd=str(ROOT), env=env, stdout=err, stderr=subprocess.STDOUT)
        finally:
            err.close()
        self.record(a="spawn", target=wid, t=time.monotonic())
        return wid

    def live(self) -> Dict[str, "subprocess.Popen[bytes]"]:
        return dict(self.procs)

    def replace(self, wid: str) -> str:
        self.retired[wid] = self.procs.pop(wid)
        return self.spawn()

    def started(self) -> bool:
        for wid in self.procs:
            path = os.path.join(self.folder, f"{wid}.jsonl")
            try:
                with open(path) as f:
                    if '"a":"start"' not in f.readline():
                        return False
            except OSError:
                return False
        return True

    def crashed(self) -> List[Tuple[str, int]]:
        return [(w, p.returncode) for w, p in self.procs.items()
                if p.poll() is not None and p.returncode != 0]

    def stop(self, grace: float) -> None:
        Path(self.folder, "stop").touch()
        deadline = time.monotonic() + grace
        for wid, proc in self.procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
                self.record(a="hung", target=wid, t=time.monotonic())

    def kill_all(self) -> None:
        for proc in list(self.procs.values()) + list(self.retired.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)


def _hogs(count: int) -> List["subprocess.Popen[bytes]"]:
    if count <= 0:
        return []
    if shutil.which("stress-ng"):
        return [subprocess.Popen(["stress-ng", "--cpu", str(count), "--quiet"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run(cfg: RunConfig) -> Result:
    kinds = cfg.fault_kinds()
    folder = cfg.out or tempfile.mkdtemp(prefix="rlocks-history-run-")
    os.makedirs(folder, exist_ok=True)
    for stale in Path(folder).glob("*.jsonl"):
        stale.unlink()
    Path(folder, "stop").unlink(missing_ok=True)
    rng = random.Random(cfg.seed)
    record = Recorder(folder, "nemesis")
    store = Node().start()
    single: Optional[Node] = None
    cluster: Optional[Cluster] = None
    link: Any = None
    workers: Optional[Workers] = None
    hogs: List[Any] = []
    try:
        if cfg.topology == "cluster":
            cluster = Cluster().start()
            client: Dict[str, Any] = {"cluster": cluster.startup_nodes}
        else:
            single = Node(persist=cfg.persist).start()
            if any(k.startswith("proxy") for k in kinds):
                link = FaultyLink(single.port)
            client = {"url": link.url if link is not None else single.url}
        client["socket_timeout"] = cfg.socket_timeout
        worker_cfg = {
            "dir": folder, "seed": cfg.seed, "driver": cfg.driver, "kinds": list(cfg.kinds),
            "threads": cfg.threads, "client": client, "store": store.url,
            "namespace": "history", "name": f"h{cfg.seed}", "ttl": cfg.ttl, "ttl2": cfg.ttl2,
            "entry_lease": cfg.entry_lease, "permits": cfg.permits, "fair": cfg.fair,
            "cancel": cfg.cancel if cfg.driver == "asyncio" else 0.0, "shape": cfg.shape,
        }
        config_path = os.path.join(folder, "config.json")
        with open(config_path, "w") as f:
            json.dump({"run": asdict(cfg), "worker": worker_cfg,
                       "params": asdict(cfg.params())}, f, indent=1)
        hogs = _hogs(cfg.load)
        workers = Workers(folder, config_path, record)
        for _ in range(cfg.workers):
            workers.spawn()
        deadline = time.monotonic() + 60
        while not workers.started():
            if workers.crashed() or time.monotonic() > deadline:
                raise RuntimeError("workers did not start: " + _stderr(folder, workers))
            time.sleep(0.05)
        began = time.monotonic()
        nemesis = Nemesis(rng, kinds, workers, record, ttls=(cfg.ttl, cfg.ttl2),
                          socket_timeout=cfg.socket_timeout, quiet=cfg.quiet,
                          single=single, link=link, cluster=cluster)
        tail = cfg.params().bound + 1.0
        nemesis.run(until=began + cfg.seconds - tail)
        time.sleep(max(0.0, began + cfg.seconds - time.monotonic()))
        for wid, code in workers.crashed():
            record(a="crash", target=wid, t=time.monotonic(), code=code)
        shape_timeout = float(cfg.shape.get("timeout", 5.0)) + float(cfg.shape.get("wait_timeout", 2.0))
        workers.stop(grace=shape_timeout + 10.0)
        log = _store_log(store)
    finally:
        if workers is not None:
            workers.kill_all()
        for hog in hogs:
            hog.kill()
            hog.wait()
        if link is not None:
            link.close()
        for server in (single, cluster, store):
            if server is not None:
                server.close()
    events = load(folder)
    report = check(events, cfg.params(), log)
    for ev in events:
        if ev["a"] == "crash":
            report.add("crash", ev["t"], "-", f"worker {ev['target']} exited with "
                       f"{ev['code']}: {_tail(folder, ev['target'])}")
    with open(os.path.join(folder, "report.json"), "w") as f:
        json.dump(report.to_json(), f, indent=1)
    with open(os.path.join(folder, "report.txt"), "w") as f:
        f.write(report.summary(limit=200) + "\n")
    if cfg.plot or not report.ok:
        try:
            from .plot import draw
        except ImportError:
            pass  # no matplotlib: the report says it all in words
        else:
            draw(events, report, os.path.join(folder, "history.png"))
    return Result(folder, report, len(events))


def _store_log(store: Node) -> List[Tuple[str, int, str]]:
    c = store.client()
    try:
        entries = c.lrange(FENCE_KEYS[1], 0, -1)
    finally:
        c.close()
    out = []
    for raw in entries:
        kind, token, hold = raw.decode().split(" ", 2)
        out.append((kind, int(token), hold))
    return out


def _tail(folder: str, wid: str, lines: int = 15) -> str:
    try:
        with open(os.path.join(folder, f"{wid}.err"), errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no output)"


def _stderr(folder: str, workers: Workers) -> str:
    return "\n".join(f"{w}: {_tail(folder, w)}" for w in workers.procs)
