"""Packet captures with tcpdump, started and stopped around a measurement.

A capture runs inside a Mininet host's namespace (``host="h2"``, on its
interfaces) or in the root namespace on a switch port (``host=None``,
``interface="fes2-eth1"``).  Start returns once tcpdump reports it is
listening, so no packet of the measurement is missed.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from emu.live import state
from emu.live.waiting import wait_until
from topologies.naming import machine_name

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
    # -U: each packet written as it comes (a reader can follow the file); a
    # probe of 100,000 frames a second turns it off: a write per frame.
    flush_each: bool = True
    linktype: Optional[str] = None      # tcpdump -y (LINUX_SLL2 for -i any: interface and direction)
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
        # --immediate-mode: otherwise tcpdump (TPACKET_V3) hands packets over a
        # block at a time, up to a second late, and those of the last second
        # before stop() are lost with the block.
        args = ["tcpdump", "-i", self.interface, "-w", str(self.path)] + \
            (["-U"] if self.flush_each else []) + \
            (["-y", self.linktype] if self.linktype else []) + \
            ["-n", "--immediate-mode", "-s", str(SNAPLEN), "-B", "8192",
             "--time-stamp-precision=nano"] + self.bpf.split()
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


class _PortCapture:
    """One ``tcpdump -i any -y LINUX_SLL2`` over the switch ports of one namespace,
    with the namespace's interface index -> name map saved beside it."""

    def __init__(self, label: str, interfaces: Dict[int, str], bpf: str, path: Path,
                 map_path: Path):
        self.label, self.interfaces, self.bpf = label, interfaces, bpf
        self.path, self.map_path = path, map_path
        self.proc: Optional[subprocess.Popen] = None
        self.stderr: List[str] = []
        self.reader: Optional[threading.Thread] = None
        self.remote = None      # (cluster, server) where tcpdump runs on another server

    @property
    def args(self) -> List[str]:
        return ["tcpdump", "-i", "any", "-y", "LINUX_SLL2", "-w", str(self.path), "-n",
                "--immediate-mode", "-s", str(FABRIC_SNAPLEN), "-B", "32768",
                "--time-stamp-precision=nano", self.bpf]

    def started(self, proc: subprocess.Popen) -> None:
        from traffic.measure import linkload

        linkload.save_interface_map(self.map_path, self.interfaces, pcap=self.path.name,
                                    bpf=self.bpf)
        self.proc = proc
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line.strip())

    def listening(self) -> bool:
        return any("listening on" in line for line in self.stderr)

    def stop(self) -> None:
        """Stop tcpdump and add its packet counts to the interface map."""
        from traffic.measure import linkload

        if self.proc is None:
            return
        was_running = self.proc.poll() is None
        if was_running:
            if self.remote is not None:
                # Its input closed, the server stops it as Ctrl-C would, and it
                # prints its counts over ssh.
                self.proc.stdin.close()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
            if self.remote is not None:
                cluster, server = self.remote
                cluster.fetch(server, self.path)
        if self.reader is not None:
            # tcpdump prints its counts as it exits: let the reader catch up.
            self.reader.join(timeout=5)
        if was_running:
            interfaces, extra = linkload.load_interface_map(self.map_path)
            extra.update(tcpdump_counts(self.stderr))
            extra.pop("format", None)
            if self.remote is not None:
                cluster, server = self.remote
                extra["server"] = server
                extra["clock_offset_s"] = cluster.offset_s(server)
            linkload.save_interface_map(self.map_path, interfaces, **extra)


def namespace_interfaces(pid: int) -> Dict[int, str]:
    """Interface index -> name in the network namespace of ``pid`` (iproute2's JSON)."""
    done = subprocess.run(["mnexec", "-a", str(pid), "ip", "-json", "link", "show"],
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise CaptureError(f"cannot list the interfaces of namespace {pid}: {done.stderr}")
    return {link["ifindex"]: link["ifname"] for link in json.loads(done.stdout or "[]")}


class FabricCapture:
    """Every switch port of a fabric, captured where the switches live.

    On Open vSwitch, Mininet leaves the switches, and so the switch end of
    every link, in the root namespace: one ``tcpdump -i any -y LINUX_SLL2``
    there sees each packet at each hop, with the interface index and
    direction that `traffic.measure.linkload` turns into per-link loads.  On
    the kernel data plane (``bed`` given, its data plane ``linux``) every
    switch is a namespace of its own: one such tcpdump runs in each.  Start
    it once the network is up: it records index -> name of each namespace's
    interfaces next to its capture (``<name>[-<switch>].ifmap.json``),
    refuses to start if a switch port of the fabric is missing, and by
    default filters in the kernel to one copy per link traversal
    (`linkload.capture_filter`).  ``parts`` lists (pcap, map) pairs for
    `linkload.analyse_parts`.

    ``--immediate-mode`` because without it tcpdump (TPACKET_V3) hands over
    packets a ring block at a time, up to a second late, and loses the
    last block when it is terminated; no ``-U``, since a write per packet
    is the expensive part and tcpdump flushes its file when it exits.
    """

    def __init__(self, fabric, name: str = "fabric", bpf: Optional[str] = None,
                 base: str = "tcp", sys_class_net: Path = SYS_CLASS_NET, bed=None):
        self.fabric = fabric
        self.name = name
        self.bpf = bpf
        self.base = base
        self.sys_class_net = Path(sys_class_net)
        self.bed = bed
        self.captures: List[_PortCapture] = []

    @property
    def namespaced(self) -> bool:
        plane = getattr(self.bed, "dataplane", None)
        return plane is not None and plane.kind == "linux"

    @property
    def parts(self) -> List[tuple]:
        return [(c.path, c.map_path) for c in self.captures]

    @property
    def path(self) -> Optional[Path]:
        """The capture file (the first one, where there is one per namespace)."""
        return self.captures[0].path if self.captures else None

    @property
    def map_path(self) -> Optional[Path]:
        return self.captures[0].map_path if self.captures else None

    def _filter(self, interfaces: Dict[int, str], nodes=None) -> str:
        from traffic.measure import linkload

        if self.bpf is not None:
            bpf = self.bpf
        else:
            try:
                bpf = linkload.capture_filter(interfaces, self.fabric, self.base, nodes=nodes)
            except ValueError as error:
                raise CaptureError(f"{error}; start the fabric capture once the "
                                   "network is up") from None
        if not SAFE_FILTER.match(bpf):
            raise CaptureError(f"capture filter {bpf!r} holds characters not allowed")
        return bpf

    def start(self, directory: Path, timeout_s: float = 10.0) -> "FabricCapture":
        if not SAFE_NAME.match(self.name):
            raise CaptureError(f"capture name {self.name!r} may hold only letters, "
                               "digits, '_', '.', '-'")
        directory.mkdir(parents=True, exist_ok=True)
        try:
            if self.namespaced:
                for switch in self.fabric.switches:
                    node = self.bed.net.get(machine_name(self.fabric, switch))
                    interfaces = namespace_interfaces(node.pid)
                    capture = _PortCapture(switch, interfaces,
                                           self._filter(interfaces, nodes=[switch]),
                                           directory / f"{self.name}-{switch}.pcap",
                                           directory / f"{self.name}-{switch}.ifmap.json")
                    self.captures.append(capture)
                    capture.started(self.bed.popen(
                        machine_name(self.fabric, switch), capture.args,
                        f"tcpdump {self.name} {switch}", stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE, text=True))
            else:
                self._start_in_root_namespaces(directory)
            wait_until(lambda: all(c.listening() or c.proc.poll() is not None
                                   for c in self.captures), timeout_s,
                       "tcpdump on every switch port to listen")
            dead = [c for c in self.captures if c.proc.poll() is not None]
            if dead:
                raise CaptureError(f"tcpdump on the ports of {dead[0].label} exited: "
                                   f"{' '.join(dead[0].stderr)}")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_in_root_namespaces(self, directory: Path) -> None:
        """One tcpdump in the root namespace of this machine, over every switch
        port; in a cluster run, one in each server's, over the ports of the
        switches there.  Another server's writes its capture there, fetched
        when it stops, its times on that server's clock (the offset goes into
        its interface map; `linkload` corrects them)."""
        cluster = getattr(self.bed, "cluster", None)
        groups = self.bed.switches_by_server() if cluster is not None else {None: None}
        for server, switches in groups.items():
            suffix = "" if server is None else f"-{server}"
            if server is None:
                interfaces = root_interfaces(self.sys_class_net)
            else:
                interfaces = cluster.root_interfaces(server)
            capture = _PortCapture(server or "root", interfaces,
                                   self._filter(interfaces, nodes=switches),
                                   directory / f"{self.name}{suffix}.pcap",
                                   directory / f"{self.name}{suffix}.ifmap.json")
            self.captures.append(capture)
            if server is None:
                proc = subprocess.Popen(capture.args, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
                state.record_pid(proc.pid, f"tcpdump {self.name}")
            else:
                cluster.agents[server].call("mkdir", path=str(directory))
                capture.remote = (cluster, server)
                proc = cluster.popen_until_input_ends(server, capture.args,
                                                      f"tcpdump {self.name} on {server}")
            capture.started(proc)

    def stop(self) -> Optional[Path]:
        """Stop every tcpdump and add its packet counts to its interface map."""
        for capture in self.captures:
            capture.stop()
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
