"""Time an OCS's dark windows on its own ports: the raw probe and its capture.

`PanelProbe` starts one ``tcpdump -i any`` in the OCS's namespace (every
port, in and out, Linux cooked v2), then the probe's sender
(`emu.live.rawprobe`) in the namespace of the ToR behind the probed OCS
ports, and `finish` returns the edges and windows the capture shows
(`traffic.measure.darkwindow`), with the interface names of the OCS so the
report can say which port went dark::

    ToR namespace                 OCS namespace (tcpdump -i any)
    rawprobe --dev up1 --dev up2 ====> port a --(BPF: lit? redirect)--> port b
                                       in: every frame     out: the passed ones

While it runs, the kernel stamps a received frame when it is processed
rather than when it was queued (``net.core.netdev_tstamp_prequeue`` = 0,
put back at `stop`): the capture's tap then sees each frame just before the
OCS's tc program decides on it, so an arrival time is the program's time.
With the default, a frame queued before a guard but processed after it
(dropped) carried the earlier time: edges up to 90 us early.

Only the ``linux`` data plane has a namespace per OCS.  The probe is a
sensing instrument: its frames skip the ToR's shaping, so they
take nothing from the links' emulated rates.  A ToR a circuit delivers
them to drops them unseen (they are addressed to no MAC of its).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from emu.live.capture import Capture, namespace_interfaces
from emu.live.waiting import wait_until
from topologies.fabric import OCS
from topologies.naming import interface, machine_name
from traffic.measure import darkwindow

DEFAULT_PPS = 100_000
PREQUEUE = Path("/proc/sys/net/core/netdev_tstamp_prequeue")
FILTER = f"udp dst port {darkwindow.UDP_PORT} and dst host 192.0.2.2"


class PanelProbeError(RuntimeError):
    """The probe could not start (not the linux data plane, a wrong port...)."""


class PanelProbe:
    def __init__(self, bed, ocs: str, ports: Sequence[int], duration_s: float,
                 pps: float = DEFAULT_PPS, name: Optional[str] = None):
        fabric = bed.fabric
        if getattr(bed.dataplane, "kind", None) != "linux":
            raise PanelProbeError("the OCS probe needs the linux data plane (an OCS namespace)")
        if ocs not in fabric.ocs_switches:
            raise PanelProbeError(f"{ocs!r} is not an OCS of {fabric.name}")
        tors = {fabric.peer(ocs, port)[0] for port in ports}
        if len(tors) != 1 or fabric.kind(next(iter(tors))) == OCS:
            raise PanelProbeError(f"{ocs} ports {list(ports)}: the probe sends from one "
                                  f"ToR, these lead to {sorted(tors)}")
        self.bed, self.ocs, self.ports = bed, ocs, list(ports)
        self.tor = next(iter(tors))
        self.devices = [interface(fabric, self.tor, fabric.peer(ocs, port)[1])
                        for port in ports]
        self.duration_s, self.pps = duration_s, pps
        self.name = name or f"{ocs}-probe"
        self.capture: Optional[Capture] = None
        self.sender: Optional[subprocess.Popen] = None
        self.output: List[str] = []
        self.interfaces: Dict[int, str] = {}
        self._prequeue: Optional[str] = None

    def start(self, directory: Path) -> "PanelProbe":
        try:
            return self._start(directory)
        except BaseException:
            self.stop()      # the sysctl back, the capture and sender gone
            raise

    def _start(self, directory: Path) -> "PanelProbe":
        node = self.bed.host(machine_name(self.bed.fabric, self.ocs))
        self.interfaces = namespace_interfaces(node.pid)
        if PREQUEUE.exists():
            self._prequeue = PREQUEUE.read_text().strip()
            PREQUEUE.write_text("0")
        self.capture = Capture(self.bed, self.name, "any",
                               host=machine_name(self.bed.fabric, self.ocs),
                               bpf=FILTER, flush_each=False,
                               linktype="LINUX_SLL2").start(Path(directory))
        args = [sys.executable, "-m", "emu.live.rawprobe", "--pps", repr(self.pps),
                "--duration", repr(self.duration_s)]
        for dev in self.devices:
            args += ["--dev", dev]
        self.sender = self.bed.popen(machine_name(self.bed.fabric, self.tor), args,
                                     f"rawprobe {self.name}", stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        wait_until(lambda: any(line.startswith("rawprobe ready") for line in self.output)
                   or self.sender.poll() is not None, 10.0, "the OCS probe's sender")
        if self.sender.poll() is not None and self.sender.returncode:
            raise PanelProbeError(f"the probe's sender failed: {' '.join(self.output)}")
        return self

    def _read(self) -> None:
        for line in self.sender.stdout:
            self.output.append(line.strip())

    def finish(self, timeout_s: Optional[float] = None) -> List[darkwindow.Edge]:
        """Wait for the sender to end, stop the capture, and read its edges."""
        try:
            self.sender.wait(timeout=timeout_s or self.duration_s + 30)
        finally:
            self.stop()
        return darkwindow.edges(darkwindow.read_sightings(self.capture.path))

    def port_name(self, ifindex: int) -> str:
        return self.interfaces.get(ifindex, str(ifindex))

    def stop(self) -> None:
        if self.sender is not None and self.sender.poll() is None:
            self.sender.kill()
            self.sender.wait(timeout=5)
        if self.capture is not None:
            self.capture.stop()
        if self._prequeue is not None:
            PREQUEUE.write_text(self._prequeue)
            self._prequeue = None
