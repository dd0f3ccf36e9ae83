"""A small TCP proxy on loopback that a test drives to cut, black-hole or slow a link.

``FaultyLink(target_port)`` listens on a free 127.0.0.1 port and forwards every accepted
connection to ``127.0.0.1:target_port``, one thread per direction. Modes:

- ``ok``: bytes pass at once;
- ``delay``: each chunk is held ``delay`` seconds before it is passed on (a slow link);
- ``blackhole``: connections stay open but nothing passes, in either direction (a
  partition in which packets vanish: the client only learns from its socket timeout);
  new connections are accepted and black-holed too;
- ``cut()``: every open connection is closed now (a reset), and new ones are refused
  while the mode is ``refuse``;
- ``hold_replies()``: requests pass, replies (server to client) are held, in order, until
  ``heal()``: a command has run on the server while its client still awaits the answer.
  ``held`` counts the replies held since (chunks, as read from the server): a test waits
  for it instead of guessing when the command it means to hold has run.

``heal()`` goes back to ``ok``; bytes held during ``blackhole`` are dropped, as a real
partition drops them.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import List, Set

from rlocks.server import free_port

__all__ = ["FaultyLink"]


class FaultyLink:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.mode = "ok"
        self.delay = 0.0
        self._lock = threading.Lock()
        self._sockets: Set[socket.socket] = set()
        self._threads: List[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self._closed = threading.Event()
        self._replies = threading.Event()  # cleared while replies are held
        self._replies.set()
        self.accepted = 0
        self.held = 0  # reply chunks held since the last hold_replies()
        self._start(self._accept_loop)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _start(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name="faulty-link")
        t.start()
        self._threads.append(t)

    # -- control -------------------------------------------------------------------------

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def slow(self, delay: float) -> None:
        self.delay = delay
        self.mode = "delay"

    def cut(self, refuse: bool = True) -> None:
        """Reset every open connection; with ``refuse``, refuse new ones until heal()."""
        self.mode = "refuse" if refuse else "ok"
        with self._lock:
            sockets, self._sockets = set(self._sockets), set()
        for s in sockets:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def hold_replies(self) -> None:
        self.held = 0
        self._replies.clear()
        self.mode = "hold"

    def heal(self) -> None:
        self.mode = "ok"
        self.delay = 0.0
        self._replies.set()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._listener.close()
        for t in self._threads:
            t.join(2)

    def __enter__(self) -> "FaultyLink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            self.accepted += 1
            with self._lock:
                self._sockets.update((client, upstream))
            self._start(self._pump, client, upstream)
            self._start(self._pump, upstream, client, True)

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool = False) -> None:
        try:
            source.settimeout(0.1)  # in the try: cut() may have closed it already
            while not self._closed.is_set():
                try:
                    chunk = source.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                if replies and not self._replies.is_set():
                    with self._lock:
                        self.held += 1
                while replies and not self._replies.wait(0.1):
                    if self._closed.is_set():
                        return
                mode = self.mode
                if mode == "blackhole":
                    continue  # the bytes vanish
                if mode == "delay":
                    time.sleep(self.delay)
                if self.mode in ("blackhole", "refuse"):
                    continue
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)
