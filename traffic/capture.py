"""Packet captures with tcpdump, started and stopped around a measurement.

A capture runs inside a Mininet host's namespace (``host="h2"``, on its
interfaces) or in the root namespace on a switch port (``host=None``,
``interface="fes2-eth1"``).  Start returns once tcpdump reports it is
listening, so no packet of the measurement is missed.
"""

from __future__ import annotations

import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from emu import state
from emu.waiting import wait_until

SNAPLEN = 128
SAFE_FILTER = re.compile(r"^[A-Za-z0-9 .:=<>!&|()\[\]-]*$")
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class CaptureError(RuntimeError):
    """tcpdump could not start or was given an unsafe argument."""


@dataclass
class Capture:
    bed: object
    name: str
    interface: str
    host: Optional[str] = None
    bpf: str = "ip"
    path: Path = None
    _proc: Optional[subprocess.Popen] = None
    _stderr: List[str] = field(default_factory=list)

    def start(self, directory: Path, timeout_s: float = 10.0) -> "Capture":
        # Arguments go to tcpdump as a list, never through a shell; still,
        # refuse anything that is not a plain name or filter expression.
        if not SAFE_NAME.match(self.name) or not SAFE_NAME.match(self.interface):
            raise CaptureError(f"capture name/interface {self.name!r}/{self.interface!r} "
                               "may hold only letters, digits, '_', '.', '-'")
        if not SAFE_FILTER.match(self.bpf):
            raise CaptureError(f"capture filter {self.bpf!r} holds characters not allowed")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{self.name}.pcap"
        args = ["tcpdump", "-i", self.interface, "-w", str(self.path), "-U", "-n",
                "-s", str(SNAPLEN), "-B", "8192", "--time-stamp-precision=nano"] + self.bpf.split()
        kwargs = dict(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if self.host is None:
            self._proc = subprocess.Popen(args, start_new_session=True, **kwargs)
            state.record_pid(self._proc.pid, f"tcpdump {self.name}")
        else:
            self._proc = self.bed.popen(self.host, args, f"tcpdump {self.name}", **kwargs)
        threading.Thread(target=self._read_stderr, daemon=True).start()
        wait_until(lambda: self._listening() or self._proc.poll() is not None, timeout_s,
                   f"tcpdump on {self.interface} to listen")
        if self._proc.poll() is not None:
            raise CaptureError(f"tcpdump on {self.interface} exited: {' '.join(self._stderr)}")
        return self

    def _read_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr.append(line.strip())

    def _listening(self) -> bool:
        return any("listening on" in line for line in self._stderr)

    def stop(self) -> Path:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
        return self.path

    @property
    def summary(self) -> str:
        """tcpdump's closing counts ("N packets captured", "M dropped by kernel")."""
        return "; ".join(line for line in self._stderr if "packets" in line)
