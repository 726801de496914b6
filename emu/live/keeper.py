"""The controller's keeper: notices when the controller process dies, and
starts a successor on the same control socket.

The switches keep forwarding while no controller runs (Open vSwitch bridges
are fail-secure; kernel routers and patch panels need nobody), so a run can
go on through a controller crash, if someone notices it and brings a new
one up before the next request::

    runner                         keeper thread                controller
    ------                         -------------                ----------
    bed.call("reconfigure", id) ----------------------------->  dies (kill -9)
      ChannelError                 process.wait() returns
      wait_settled() ...           restart(): --resume, attach   successor takes over
                                   (linux), every switch ready   the state file,
      retry, same id ------------------------------------------> resyncs the switches
                                                                 and carries it out once

``restart`` is the testbed's: it returns the new process once every switch
is confirmed again.  Each outage is recorded (`outages`): when the process
died and with what code, when its successor answered, when every switch was
resynchronised.  After ``MAX_RESTARTS`` the keeper gives up, and the run
fails as it would have without a keeper.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Callable, List, Optional

MAX_RESTARTS = 5
# How long a failed request waits for its controller to be found dead.
DEATH_GRACE_S = 3.0


class ControllerKeeper:
    """Watches one controller process at a time on a daemon thread."""

    def __init__(self, process: subprocess.Popen,
                 restart: Callable[[], subprocess.Popen],
                 log: Callable[[str], None] = print, max_restarts: int = MAX_RESTARTS):
        self.process = process
        self.restart = restart
        self.log = log
        self.max_restarts = max_restarts
        self.outages: List[dict] = []
        self.failed: Optional[str] = None     # why the keeper gave up
        self._stopping = threading.Event()
        self._settled = threading.Event()     # no restart under way
        self._settled.set()
        self._restarts = 0                    # successors started so far
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "ControllerKeeper":
        self._thread = threading.Thread(target=self._watch, name="controller-keeper",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """From now on a controller that exits is meant to (the run ends)."""
        self._stopping.set()

    @property
    def restarting(self) -> bool:
        return not self._settled.is_set()

    def wait_settled(self, timeout_s: float) -> bool:
        """Wait while a successor is being started; whether none is under way
        (it may have failed: see `failed`)."""
        return self._settled.wait(timeout_s)

    def wait_after_failure(self, timeout_s: float, grace_s: float = DEATH_GRACE_S) -> bool:
        """A request failed on the channel: if the process died, wait for its
        successor.  Returns whether a successor now runs in its place.

        The channel fails the moment the kernel closes the dead process's
        socket, a little before the process can be reaped, so its death is
        waited for up to ``grace_s``.  (``Popen.poll`` cannot tell: the
        keeper's thread holds the process's wait lock, and poll then says
        "running".)"""
        restarts = self._restarts
        deadline = time.monotonic() + grace_s
        while self._settled.is_set() and self._restarts == restarts \
                and time.monotonic() < deadline and self.failed is None:
            time.sleep(0.01)
        if not self.wait_settled(timeout_s):
            return False
        return self._restarts != restarts and self.failed is None

    def _watch(self) -> None:
        while not self._stopping.is_set():
            code = self.process.wait()
            if self._stopping.is_set():
                return
            self._settled.clear()
            died = time.time()
            outage = {"pid": self.process.pid, "exit_code": code, "died_at": died}
            self.log(f"the controller (pid {self.process.pid}) died with code {code}: "
                     "starting a successor")
            try:
                if len(self.outages) >= self.max_restarts:
                    raise RuntimeError(f"it died {len(self.outages) + 1} times in this run")
                process, answered = self.restart()
            except Exception as exc:   # the run then fails on its next request
                self.failed = f"no successor for the controller: {exc}"
                self.log(self.failed)
                outage["error"] = str(exc)
                self.outages.append(outage)
                self._settled.set()
                return
            resynced = time.time()
            outage.update(successor_pid=process.pid, answered_at=answered,
                          resynced_at=resynced, outage_s=round(resynced - died, 3),
                          resync_s=round(resynced - answered, 3))
            self.outages.append(outage)
            self.process = process
            self._restarts += 1
            self.log(f"controller pid {process.pid} took over: {outage['outage_s']:.2f} s "
                     f"without a controller, {outage['resync_s']:.2f} s to resync")
            self._settled.set()
