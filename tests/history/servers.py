"""The servers of a history run, which the nemesis may pause, kill and restart.

- ``Node``: one ``redis-server`` on a loopback port whose folder outlives a restart, with
  or without persistence (``appendonly yes``, ``appendfsync always``: what was
  acknowledged survives a crash);
- ``Cluster``: masters with one replica each, for failovers (graceful, forced, and a
  killed master that its replica replaces);
- the fenced store is a plain ``Node`` that no fault touches.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from rlocks.server import find_redis_server, free_port

__all__ = ["Node", "Cluster"]


def _wait(predicate, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Node:
    """A ``redis-server`` that can be paused, killed and started again on its port, with
    its folder (AOF, ``nodes.conf``) kept until :meth:`close`."""

    def __init__(self, args: Sequence[str] = (), *, persist: bool = False,
                 binary: Optional[str] = None) -> None:
        self.binary = binary or find_redis_server()
        self.args = list(args)
        self.persist = persist
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rlocks-history-")
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def client(self, **options: Any) -> "redis.Redis[bytes]":
        options.setdefault("socket_timeout", 5)
        return redis.Redis(port=self.port, **options)

    def start(self) -> "Node":
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.persist
                       else ["--appendonly", "no"])
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--dir", self.dir, "--daemonize", "no", "--loglevel", "warning",
               *persistence, *self.args]
        with open(os.path.join(self.dir, "server.log"), "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        probe = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            _wait(lambda: probe.ping() and self._loaded(probe), 20, f"redis-server on {self.port}")
        finally:
            probe.close()
        return self

    @staticmethod
    def _loaded(probe: "redis.Redis[bytes]") -> bool:
        return int(probe.info("persistence").get("loading", 0)) == 0

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self, down: float = 0.0) -> None:
        """Crash (SIGKILL) and start again on the same port and folder."""
        self.kill()
        time.sleep(down)
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class Cluster:
    """``masters`` masters with one replica each (node timeout ``node_timeout`` ms)."""

    def __init__(self, masters: int = 3, node_timeout: int = 1000) -> None:
        self.masters = masters
        self.node_timeout = node_timeout
        self.nodes: List[Node] = []
        self.bus: Dict[int, int] = {}

    @property
    def startup_nodes(self) -> List[Tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    def _node(self) -> Node:
        bus = free_port()
        node = Node(["--cluster-enabled", "yes", "--cluster-node-timeout", str(self.node_timeout),
                     "--cluster-port", str(bus), "--cluster-replica-validity-factor", "0"])
        self.bus[node.port] = bus
        return node

    def start(self) -> "Cluster":
        try:
            self.nodes = [self._node().start() for _ in range(2 * self.masters)]
            clients = [n.client() for n in self.nodes]
            step = 16384 // self.masters
            for i in range(self.masters):
                last = 16383 if i == self.masters - 1 else (i + 1) * step - 1
                clients[i].execute_command("CLUSTER ADDSLOTS", *range(i * step, last + 1))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port,
                                           self.bus[node.port])
            _wait(lambda: all(int(c.cluster("INFO")["cluster_known_nodes"]) == len(self.nodes)
                              for c in clients), 30, "the nodes to meet")
            for i in range(self.masters):
                master_id = clients[i].execute_command("CLUSTER", "MYID")
                if isinstance(master_id, bytes):
                    master_id = master_id.decode()
                replica = clients[self.masters + i]
                _wait(lambda: replica.execute_command("CLUSTER", "REPLICATE", master_id), 30,
                      "a replica to follow its master")
            self.wait_healthy()
            for c in clients:
                c.close()
        except BaseException:
            self.close()
            raise
        return self

    def roles(self) -> Dict[int, Tuple[str, Optional[int]]]:
        """port -> ("master", None) or ("replica", master's port), of the live nodes."""
        found: Dict[int, Tuple[str, Optional[int]]] = {}
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            try:
                info = node.client(socket_timeout=1).info("replication")
            except redis.RedisError:
                continue
            if info.get("role") == "master":
                found[node.port] = ("master", None)
            else:
                found[node.port] = ("replica", int(info.get("master_port", 0)))
        return found

    def wait_healthy(self, timeout: float = 30) -> None:
        """Every node up and ``cluster_state:ok``, every master with a replica in sync."""
        def healthy() -> bool:
            roles = self.roles()
            if len(roles) != len(self.nodes):
                return False
            masters = [p for p, (r, _) in roles.items() if r == "master"]
            if len(masters) != self.masters:
                return False
            for node in self.nodes:
                c = node.client(socket_timeout=1)
                try:
                    if c.cluster("INFO")["cluster_state"] != "ok":
                        return False
                    info = c.info("replication")
                    if info.get("role") != "master" and info.get("master_link_status") != "up":
                        return False
                finally:
                    c.close()
            return True

        _wait(healthy, timeout, "the cluster to be healthy", interval=0.05)

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def replica_of(self, master_port: int) -> Node:
        roles = self.roles()
        return next(self.node(p) for p, (r, m) in roles.items() if r == "replica" and m == master_port)

    def master_ports(self) -> List[int]:
        return sorted(p for p, (r, _) in self.roles().items() if r == "master")

    def failover(self, master_port: int, force: bool) -> None:
        """``CLUSTER FAILOVER [FORCE]`` on the master's replica; returns once it leads."""
        replica = self.replica_of(master_port)
        c = replica.client()
        try:
            c.execute_command("CLUSTER", "FAILOVER", *(["FORCE"] if force else []))
            _wait(lambda: c.info("replication")["role"] == "master", 20, "the replica to lead")
        finally:
            c.close()

    def kill_master(self, master_port: int) -> None:
        """SIGKILL a master; return once its replica leads and it is back as a replica."""
        replica = self.replica_of(master_port)
        victim = self.node(master_port)
        victim.kill()
        c = replica.client()
        try:
            _wait(lambda: c.info("replication")["role"] == "master", 30, "the replica to take over")
        finally:
            c.close()
        victim.start()

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.nodes = []
