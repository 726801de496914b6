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
from typing import Dict, List, Optional

from emu.live import state
from emu.live.waiting import wait_until

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


# Enough for the cooked header (20), IPv4 (20) and TCP with timestamps (32):
# link loads need only the first, flow attribution the rest, and every byte
# more is written once per packet per hop.
FABRIC_SNAPLEN = 80
SYS_CLASS_NET = Path("/sys/class/net")


def root_interfaces(sys_class_net: Path = SYS_CLASS_NET) -> Dict[int, str]:
    """Interface index -> name for every interface of this namespace."""
    interfaces = {}
    for entry in sorted(Path(sys_class_net).iterdir()):
        try:
            interfaces[int((entry / "ifindex").read_text())] = entry.name
        except (OSError, ValueError):
            continue  # gone between the listing and the read
    return interfaces


class FabricCapture(Capture):
    """Every switch port of a fabric in one capture, from the root namespace.

    Mininet leaves the switches, and so the switch end of every link, in
    the root namespace: one ``tcpdump -i any -y LINUX_SLL2`` there sees
    each packet at each hop, with the interface index and direction that
    `traffic.measure.linkload` turns into per-link loads.  Start it once the
    network is up: it records index -> name of this namespace's interfaces
    next to the capture (``<name>.ifmap.json``), refuses to start if a
    switch port of the fabric is missing, and by default filters in the
    kernel to one copy per link traversal (`linkload.capture_filter`).

    ``--immediate-mode`` because without it tcpdump (TPACKET_V3) hands over
    packets a ring block at a time, up to a second late, and loses the
    last block when it is terminated; no ``-U``, since a write per packet
    is the expensive part and tcpdump flushes its file when it exits.
    """

    def __init__(self, fabric, name: str = "fabric", bpf: Optional[str] = None,
                 base: str = "tcp", sys_class_net: Path = SYS_CLASS_NET):
        super().__init__(bed=None, name=name, interface="any", host=None, bpf=bpf or "")
        self.fabric = fabric
        self.base = base
        self.custom_bpf = bpf is not None
        self.sys_class_net = Path(sys_class_net)
        self.map_path: Optional[Path] = None
        self._reader: Optional[threading.Thread] = None

    def start(self, directory: Path, timeout_s: float = 10.0) -> "FabricCapture":
        # Imported here: capture.py serves hosts' captures without a fabric.
        from traffic.measure import linkload

        if not SAFE_NAME.match(self.name):
            raise CaptureError(f"capture name {self.name!r} may hold only letters, "
                               "digits, '_', '.', '-'")
        interfaces = root_interfaces(self.sys_class_net)
        if not self.custom_bpf:
            try:
                self.bpf = linkload.capture_filter(interfaces, self.fabric, self.base)
            except ValueError as error:
                raise CaptureError(f"{error}; start the fabric capture once the "
                                   "network is up") from None
        if not SAFE_FILTER.match(self.bpf):
            raise CaptureError(f"capture filter {self.bpf!r} holds characters not allowed")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{self.name}.pcap"
        self.map_path = directory / f"{self.name}.ifmap.json"
        linkload.save_interface_map(self.map_path, interfaces, pcap=self.path.name,
                                    bpf=self.bpf)
        args = ["tcpdump", "-i", "any", "-y", "LINUX_SLL2", "-w", str(self.path), "-n",
                "--immediate-mode", "-s", str(FABRIC_SNAPLEN), "-B", "32768",
                "--time-stamp-precision=nano", self.bpf]
        self._proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
        state.record_pid(self._proc.pid, f"tcpdump {self.name}")
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        wait_until(lambda: self._listening() or self._proc.poll() is not None, timeout_s,
                   "tcpdump on every switch port to listen")
        if self._proc.poll() is not None:
            raise CaptureError(f"tcpdump on every switch port exited: {' '.join(self._stderr)}")
        return self

    def stop(self) -> Path:
        """Stop tcpdump and add its packet counts to the interface map."""
        from traffic.measure import linkload

        was_running = self._proc is not None and self._proc.poll() is None
        super().stop()
        if self._reader is not None:
            # tcpdump prints its counts as it exits: let the reader catch up.
            self._reader.join(timeout=5)
        if was_running and self.map_path is not None:
            interfaces, extra = linkload.load_interface_map(self.map_path)
            extra.update(tcpdump_counts(self._stderr))
            extra.pop("format", None)
            linkload.save_interface_map(self.map_path, interfaces, **extra)
        return self.path


def tcpdump_counts(lines: List[str]) -> Dict[str, int]:
    """tcpdump's closing counts as numbers: captured, received_by_filter,
    dropped_by_kernel (each only if printed)."""
    counts = {}
    for line in lines:
        match = re.match(r"^(\d+) packets? (captured|received by filter|dropped by kernel)$",
                         line.strip())
        if match:
            counts[match.group(2).replace(" ", "_")] = int(match.group(1))
    return counts
