"""The runner's control channel to the controller: JSON lines over a Unix socket.

The socket file is created with mode 0600 inside a 0700 directory, so only
root (the runner) can talk to the controller.  One request per line, one
reply per line: ``{"op": "status"}`` -> ``{"ok": true, ...}``; a failed
request answers ``{"ok": false, "error": "..."}`` and the channel stays up.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Callable, Optional

Handler = Callable[[dict], dict]


class ControlError(RuntimeError):
    """The controller refused a request or could not be reached."""


class ControlServer:
    def __init__(self, path: str, handler: Handler):
        self.path = path
        self.handler = handler
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()

    def start(self) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(4)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="control-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="control-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            for line in stream:
                try:
                    request = json.loads(line)
                    if not isinstance(request, dict) or "op" not in request:
                        raise ValueError("a request is a JSON object with an 'op'")
                    reply = {"ok": True, **self.handler(request)}
                except Exception as exc:  # the reply carries it; the channel lives on
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                stream.write(json.dumps(reply).encode() + b"\n")
                stream.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


class ControlClient:
    """One connection to the control channel; requests from several threads
    take turns on it (a request and its reply are never interleaved)."""

    def __init__(self, path: str, timeout: float = 30.0):
        self.path = path
        self.timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._stream = None
        self._lock = threading.Lock()

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            raise ControlError(f"controller not reachable at {self.path}: {exc}") from None
        self._sock, self._stream = sock, sock.makefile("rwb")

    def call(self, op: str, timeout: Optional[float] = None, **args) -> dict:
        with self._lock:
            return self._call(op, timeout, args)

    def _call(self, op: str, timeout: Optional[float], args: dict) -> dict:
        if self._sock is None:
            self._connect()
        self._sock.settimeout(timeout or self.timeout)
        try:
            self._stream.write(json.dumps({"op": op, **args}).encode() + b"\n")
            self._stream.flush()
            line = self._stream.readline()
        except OSError as exc:
            self.close()
            raise ControlError(f"control channel failed during {op!r}: {exc}") from None
        if not line:
            self.close()
            raise ControlError(f"controller closed the channel during {op!r}")
        try:
            reply = json.loads(line)
        except ValueError:
            self.close()
            raise ControlError(f"controller sent a reply that is not JSON during {op!r}: "
                               f"{line[:200]!r}") from None
        if not reply.pop("ok", False):
            raise ControlError(f"controller refused {op!r}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._stream.close()
            self._sock.close()
        self._sock = self._stream = None
