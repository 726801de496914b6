"""The controller's events as they happen: circuits going dark and lighting, links failing.

The controller process publishes what it does (`controllers.service`: each
step of a reconfiguration, each link change, each technology preset) and
streams it to any connection of its control channel that asked to ``watch``.
`ControllerWatch` is that connection on the runner's side: its own socket,
beside the request/reply `controllers.control.ControlClient`, read by a
thread that hands every event to ``on_event``::

    controller process                                  runner process
    ------------------                                  --------------
    FabricService --publish--> EventHub                 ControllerWatch
      reconfigure steps          | one bounded queue      | reader thread
      link changes, presets      | per watcher            v
                                 v                      on_event(event) --> feed, web view
    ControlServer  connection thread  ==== JSON lines ===>
                                      <=== {"op": "watch"} (once)

    watch = ControllerWatch(bed.socket_path, feed_event).start()
    ...                     # on_event({"kind": "circuit", "step": "dark", "t": ..., ...})
    watch.stop()

`start` returns once the controller answered: every event published after
that arrives.  ``on_event`` runs on the reader thread and should return
quickly (the controller drops a watcher's oldest events when it falls far
behind, and says so with a ``{"kind": "dropped", "count": n}`` event).  If
the controller closes the channel (it stopped), the thread ends and
``error`` says why.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from typing import Callable, Optional

from controllers.control import ControlError

LOG = logging.getLogger("emu.watch")
CONNECT_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 1.0

OnEvent = Callable[[dict], None]


class ControllerWatch:
    """One watch connection to the controller, read on a daemon thread."""

    def __init__(self, socket_path: str, on_event: OnEvent,
                 timeout_s: float = CONNECT_TIMEOUT_S):
        self.socket_path = socket_path
        self.on_event = on_event
        self.timeout_s = timeout_s
        self.error: Optional[str] = None      # why the stream ended, if not by `stop`
        self.received = 0
        self._sock: Optional[socket.socket] = None
        self._stream = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "ControllerWatch":
        """Connect, ask to watch and start reading; raises ControlError if the
        controller cannot be reached or refuses."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.socket_path)
            stream = sock.makefile("rwb")
            stream.write(json.dumps({"op": "watch"}).encode() + b"\n")
            stream.flush()
            line = stream.readline()
        except OSError as exc:
            sock.close()
            raise ControlError(f"cannot watch the controller at {self.socket_path}: "
                               f"{exc}") from None
        try:
            reply = json.loads(line) if line else {}
        except ValueError:
            reply = {"error": f"a reply that is not JSON: {line[:200]!r}"}
        if not (reply.get("ok") and reply.get("watching")):
            stream.close()
            sock.close()
            raise ControlError(f"controller refused 'watch': "
                               f"{reply.get('error') or 'it closed the channel'}")
        # From now on the thread waits for events as long as none come.
        sock.settimeout(None)
        self._sock, self._stream = sock, stream
        self._thread = threading.Thread(target=self._read, name="controller-watch",
                                        daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        try:
            for line in self._stream:
                try:
                    event = json.loads(line)
                except ValueError:
                    LOG.warning("controller watch: skipped a line that is not JSON: %r",
                                line[:200])
                    continue
                self.received += 1
                try:
                    self.on_event(event)
                except Exception:  # one event the caller could not take ends nothing
                    LOG.exception("controller watch: on_event failed for %s", event)
        except (OSError, ValueError) as exc:       # ValueError: the stream was closed
            if not self._stopping.is_set():
                self.error = f"the watch failed: {type(exc).__name__}: {exc}"
            return
        if not self._stopping.is_set():
            self.error = "the controller closed the channel"
            LOG.info("controller watch ended: %s", self.error)

    def stop(self) -> None:
        """Close the connection and wait (about a second at most) for the thread."""
        self._stopping.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)   # wakes the reader
            except OSError:
                pass                                    # the controller closed it first
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT_S)
        if self._stream is not None and not self.running:
            self._stream.close()
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> "ControllerWatch":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
