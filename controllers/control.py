"""The runner's control channel to the controller: JSON lines over a Unix socket.

The socket file is created with mode 0600 inside a 0700 directory, so only
root (the runner) can talk to the controller.  One request per line, one
reply per line: ``{"op": "status"}`` -> ``{"ok": true, ...}``; a failed
request answers ``{"ok": false, "error": "..."}`` and the channel stays up.

A handler may answer a request with a `Watch` instead of a dict (the service
does for ``{"op": "watch"}``): the server replies ``{"ok": true, "watching":
true}`` and from then on writes one JSON line per event on that connection,
until the client closes it or the server stops.  Such a connection carries
nothing else; what the client sends on it is ignored.  The server knows
nothing of what the events are: the `Watch` brings its own ``subscribe``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional, Set, Union

# subscribe(send) -> unsubscribe; ``send(event)`` may be called from any thread.
Subscribe = Callable[[Callable[[dict], None]], Callable[[], None]]


@dataclass(frozen=True)
class Watch:
    """A handler's answer that turns its connection into a stream of events."""

    subscribe: Subscribe
    reply: dict = field(default_factory=lambda: {"watching": True})


Handler = Callable[[dict], Union[dict, Watch]]


class ControlError(RuntimeError):
    """The controller refused a request or could not be reached."""


class ChannelError(ControlError):
    """The channel failed: no controller answered (it may have died), as
    opposed to a controller that answered with a refusal."""


class ControlServer:
    def __init__(self, path: str, handler: Handler):
        self.path = path
        self.handler = handler
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._watching: Set[socket.socket] = set()     # connections streaming events
        self._watching_lock = threading.Lock()

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
        with conn:
            stream = conn.makefile("rwb")
            try:
                self._answer(conn, stream)
            finally:
                try:
                    stream.close()
                except OSError:
                    pass    # a client gone with bytes still buffered for it

    def _answer(self, conn: socket.socket, stream) -> None:
        for line in stream:
            try:
                request = json.loads(line)
                if not isinstance(request, dict) or "op" not in request:
                    raise ValueError("a request is a JSON object with an 'op'")
                answer = self.handler(request)
                if isinstance(answer, Watch):
                    self._stream_events(conn, stream, answer)
                    return
                reply = {"ok": True, **answer}
            except Exception as exc:  # the reply carries it; the channel lives on
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            stream.write(json.dumps(reply).encode() + b"\n")
            stream.flush()

    def _stream_events(self, conn: socket.socket, stream, watch: Watch) -> None:
        """Reply to a watch, then write every event the subscription brings until
        the client closes the connection (or `stop` shuts it down)."""
        write_lock = threading.Lock()
        ended = threading.Event()

        def send(event: dict) -> None:
            if ended.is_set():
                raise ConnectionError("the watch ended")
            try:
                data = json.dumps(event).encode() + b"\n"
                with write_lock:
                    stream.write(data)
                    stream.flush()
            except Exception:
                # The client is gone, or the event could not be written: end the
                # connection, so that the client sees the end instead of silence.
                _shutdown(conn)
                raise

        with write_lock:
            # Subscribed before the reply is written, and the reply written before
            # any event (`send` waits for the lock): a client that has the reply
            # misses nothing from then on.  A refusal to subscribe is the
            # handler's error, replied as any other.
            unsubscribe = watch.subscribe(send)
            try:
                with self._watching_lock:
                    stopping = self._stop.is_set()
                    if not stopping:
                        self._watching.add(conn)
                if not stopping:
                    stream.write(json.dumps({"ok": True, **watch.reply}).encode() + b"\n")
                    stream.flush()
            except OSError:
                stopping = True     # the client left before its reply
        try:
            if not stopping:
                for _ in stream:    # the client only ever closes a watch
                    pass
        except OSError:
            pass                    # the client went away, or `stop` shut it down
        finally:
            unsubscribe()
            ended.set()
            # Wakes a write blocked on a client that stopped reading, before the
            # stream closes under it.
            _shutdown(conn)
            with self._watching_lock:
                self._watching.discard(conn)

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)
        with self._watching_lock:
            watching = list(self._watching)
        for conn in watching:       # their threads unsubscribe and close them
            _shutdown(conn)


def _shutdown(conn: socket.socket) -> None:
    """End a connection both ways; the thread reading or writing it returns."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass                        # closed already, or never connected


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
            raise ChannelError(f"controller not reachable at {self.path}: {exc}") from None
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
            raise ChannelError(f"control channel failed during {op!r}: {exc}") from None
        if not line:
            self.close()
            raise ChannelError(f"controller closed the channel during {op!r}")
        try:
            reply = json.loads(line)
        except ValueError:
            self.close()
            raise ControlError(f"controller sent a reply that is not JSON during {op!r}: "
                               f"{line[:200]!r}") from None
        if not reply.pop("ok", False):
            raise ControlError(f"controller refused {op!r}: {reply.get('error')}")
        return reply

    def drop_connection(self) -> None:
        """Close the connection between requests; the next one connects anew
        (to a controller that took over from the one this one reached)."""
        with self._lock:
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._stream.close()
            except OSError:
                pass        # a request still buffered for a controller that died
            self._sock.close()
        self._sock = self._stream = None
