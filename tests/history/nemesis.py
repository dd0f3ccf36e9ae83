"""The faults of a history run, chosen at random but reproducibly (a seed).

Every fault kind of the run comes once per round, in an order the seed shuffles anew each
round (kinds not injected yet first), each after a quiet spell; each is recorded as an event ``{"a": "fault", "k": kind,
"target": worker or None, "inv": start, "ret": end, "recover": seconds}`` in
``nemesis.jsonl``. ``recover`` is how long after ``ret`` the fault may still be felt by
design (a black-holed link is only noticed at the client's socket timeout).

Kinds:

- ``stop_worker``: SIGSTOP a worker for 1.2 times the shortest to 1.2 times the longest
  ttl (longer than some leases, and sometimes than all), then SIGCONT;
- ``kill_worker``: SIGKILL a worker (not one stopped in the last ttl + 1 s: a process
  killed while stopped never acts again, so its holds end where the stop began, which the
  nemesis does not try to record) and start a new one in its place;
- ``pause_server``: SIGSTOP the server (on a cluster, one master) for 0.1 to 0.5 s;
- ``client_kill``: ``CLIENT KILL TYPE normal`` and ``TYPE pubsub`` on every server;
- ``restart``: SIGKILL the server and start it again on its port (with or without
  persistence, as the run says);
- ``proxy_delay``: the proxy holds each chunk 20 to 150 ms, for 0.5 to 1.5 s;
- ``proxy_drop``: the proxy drops every byte, both ways, for 0.2 to 1 s;
- ``failover``, ``failover_force``: ``CLUSTER FAILOVER [FORCE]`` on a master's replica;
- ``kill_master``: SIGKILL a master, wait for its replica to lead, start it again (it
  comes back as a replica).
"""

from __future__ import annotations

import random
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import redis

__all__ = ["SINGLE_FAULTS", "CLUSTER_FAILOVERS", "CLUSTER_FAULTS", "Nemesis"]

WORKER_FAULTS = ("stop_worker", "kill_worker")
SINGLE_FAULTS = WORKER_FAULTS + ("pause_server", "client_kill", "restart", "proxy_delay",
                                 "proxy_drop")
CLUSTER_FAILOVERS = ("failover", "failover_force", "kill_master")
CLUSTER_FAULTS = WORKER_FAULTS + ("pause_server", "client_kill") + CLUSTER_FAILOVERS


class Nemesis:
    """Injects faults into ``workers`` and the servers until told to stop.

    ``workers`` is the run's pool: ``live()`` (worker id -> Popen), ``replace(id)``
    (start a new worker in a killed one's place). ``single`` is a ``servers.Node`` (with
    ``link``, a proxy, or None) or None; ``cluster`` a ``servers.Cluster`` or None.
    """

    def __init__(self, rng: random.Random, kinds: Sequence[str], workers: Any,
                 record: Callable[..., None], *, ttls: Sequence[float], socket_timeout: float,
                 quiet: Sequence[float], single: Any = None, link: Any = None,
                 cluster: Any = None) -> None:
        self.rng = rng
        self.kinds = list(kinds)
        self.workers = workers
        self.record = record
        self.ttls = (min(ttls), max(ttls))
        self.ttl = max(ttls)
        self.socket_timeout = socket_timeout
        self.quiet = quiet
        self.single, self.link, self.cluster = single, link, cluster
        self.resumed: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}

    def run(self, until: float) -> None:
        """Quiet spell, fault, quiet spell, ... while a fault fits before ``until``: each
        round in an order the seed shuffles, kinds not injected yet first, a kind that
        would not end in time left out."""
        if not self.kinds:
            time.sleep(max(0.0, until - time.monotonic()))
            return
        done: Set[str] = set()
        while True:
            round_ = list(self.kinds)
            self.rng.shuffle(round_)
            round_.sort(key=lambda k: k in done)
            quiet = [self.rng.uniform(*self.quiet) for _ in round_]
            injected = False
            for kind, pause in zip(round_, quiet):
                if time.monotonic() + pause + self._longest(kind) > until:
                    continue
                time.sleep(pause)
                self.inject(kind)
                done.add(kind)
                injected = True
            if not injected:
                return

    def _longest(self, kind: str) -> float:
        return {"stop_worker": 1.2 * self.ttl, "kill_worker": 0.5, "kill_master": 8.0,
                "failover": 3.0, "failover_force": 3.0, "pause_server": 0.5,
                "client_kill": 0.1}.get(kind, 1.5)

    def inject(self, kind: str) -> None:
        getattr(self, "_" + kind)()
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _fault(self, kind: str, inv: float, target: Optional[str] = None,
               recover: float = 0.0, **detail: Any) -> None:
        self.record(a="fault", k=kind, target=target, inv=inv, ret=time.monotonic(),
                    recover=recover, **detail)

    # -- workers ----------------------------------------------------------------------------

    def _pick(self, avoid_resumed: bool) -> Optional[str]:
        now = time.monotonic()
        live = sorted(w for w, p in self.workers.live().items() if p.poll() is None
                      and (not avoid_resumed or now - self.resumed.get(w, -1e9) > self.ttl + 1))
        return self.rng.choice(live) if live else None

    def _stop_worker(self) -> None:
        wid = self._pick(False)
        if wid is None:
            return
        proc = self.workers.live()[wid]
        inv = time.monotonic()
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1.2 * self.rng.uniform(*self.ttls))
        proc.send_signal(signal.SIGCONT)
        self.resumed[wid] = time.monotonic()
        self._fault("stop_worker", inv, wid)

    def _kill_worker(self) -> None:
        wid = self._pick(True)
        if wid is None:
            return
        proc = self.workers.live()[wid]
        inv = time.monotonic()
        proc.kill()
        proc.wait(10)
        self._fault("kill_worker", inv, wid)
        self.workers.replace(wid)

    # -- servers ----------------------------------------------------------------------------

    def _server_nodes(self) -> List[Any]:
        if self.cluster is not None:
            return [n for n in self.cluster.nodes if n.process is not None]
        return [self.single]

    def _pause_server(self) -> None:
        if self.cluster is not None:
            node = self.cluster.node(self.rng.choice(self.cluster.master_ports()))
        else:
            node = self.single
        inv = time.monotonic()
        node.pause()
        time.sleep(self.rng.uniform(0.1, 0.5))
        node.resume()
        self._fault("pause_server", inv, port=node.port)

    def _client_kill(self) -> None:
        inv = time.monotonic()
        for node in self._server_nodes():
            admin = node.client(socket_timeout=2)
            try:
                for kind in ("normal", "pubsub"):
                    admin.execute_command("CLIENT", "KILL", "TYPE", kind)
            except redis.RedisError:
                pass
            finally:
                admin.close()
        self._fault("client_kill", inv)

    def _restart(self) -> None:
        inv = time.monotonic()
        self.single.restart(down=self.rng.uniform(0.05, 0.3))
        self._fault("restart", inv, persist=self.single.persist)

    def _proxy_delay(self) -> None:
        inv = time.monotonic()
        self.link.slow(self.rng.uniform(0.02, 0.15))
        time.sleep(self.rng.uniform(0.5, 1.5))
        self.link.heal()
        self._fault("proxy_delay", inv)

    def _proxy_drop(self) -> None:
        inv = time.monotonic()
        self.link.blackhole()
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.link.heal()
        # Bytes dropped are only missed at the client's socket timeout.
        self._fault("proxy_drop", inv, recover=self.socket_timeout)

    def _failover(self, force: bool = False) -> None:
        master = self.rng.choice(self.cluster.master_ports())
        inv = time.monotonic()
        self.cluster.failover(master, force)
        self.cluster.wait_healthy()
        self._fault("failover_force" if force else "failover", inv, port=master)

    def _failover_force(self) -> None:
        self._failover(force=True)

    def _kill_master(self) -> None:
        master = self.rng.choice(self.cluster.master_ports())
        inv = time.monotonic()
        self.cluster.kill_master(master)
        self.cluster.wait_healthy()
        self._fault("kill_master", inv, port=master)
