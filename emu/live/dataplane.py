"""Which data plane forwards the emulated packets, and why; which TCP sends them.

Two data planes, one controller (`controllers`):

* ``ovs``: Open vSwitch bridges programmed over OpenFlow 1.3.  Where the
  openvswitch kernel module exists, OVS forwards in the kernel (its
  ``system`` datapath) on every core.  Elsewhere it can only run its
  userspace (``netdev``) datapath: one thread forwards every packet, and it
  saturates long before the emulated links do.  Still right for OpenFlow
  lessons.
* ``linux``: every packet switch is a kernel router in its own namespace
  and every OCS a tc patch panel, programmed over netlink; forwarding runs
  in softirq on every core.

``auto`` picks OVS with its kernel datapath where the module exists, and
``linux`` where OVS could only run in userspace.  `choose` says which and
why, and refuses what cannot work (``ovs`` where Open vSwitch is not
installed) before anything is created.

The TCP congestion control of every flow is a choice too: the machine's
default (BBR on Debian 12's kernel here) would otherwise leak into every
namespace.  `check_congestion` refuses an algorithm this kernel lacks
(``dctcp`` needs tcp_dctcp, and ECN marking a RED or fq_codel queue).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from emu.live import ovs

AUTO, OVS, LINUX = "auto", "ovs", "linux"
CHOICES = (AUTO, OVS, LINUX)
CONGESTION_CONTROLS = ("cubic", "bbr", "reno", "dctcp")
AVAILABLE_CC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


class DataplaneError(RuntimeError):
    """The data plane or congestion control asked for cannot run on this machine."""


@dataclass(frozen=True)
class Choice:
    dataplane: str         # "ovs" or "linux"
    asked: str             # what the scenario asked for
    reason: str

    def describe(self) -> str:
        return f"data plane {self.dataplane} ({'auto: ' if self.asked == AUTO else ''}" \
               f"{self.reason})"


def ovs_installed() -> bool:
    return shutil.which("ovs-vsctl") is not None and shutil.which("ovs-vswitchd") is not None


def cluster_choice(asked: str, installed: Optional[bool] = None) -> Choice:
    """The data plane of a run across several servers (`emu.live.cluster`).

    Open vSwitch only: Mininet Cluster Edition builds remote switches as OVS
    bridges, and the ``linux`` plane's controller programs every router
    through its namespace on the controller's own machine, which another
    server's namespaces are out of reach of.  So ``auto`` means ``ovs``
    here and ``linux`` is refused before anything is created.
    """
    if asked not in CHOICES:
        raise DataplaneError(f"dataplane {asked!r}; allowed: {', '.join(CHOICES)}")
    if asked == LINUX:
        raise DataplaneError("dataplane 'linux' does not run across servers: its controller "
                             "programs the kernel routers through their namespaces on its own "
                             "machine; use 'ovs' or 'auto' with testbed.servers")
    installed = ovs_installed() if installed is None else installed
    if not installed:
        raise DataplaneError("testbed.servers: a cluster run needs Open vSwitch on every "
                             "server (run ./bootstrap.sh)")
    return Choice(OVS, asked, "several servers: Mininet Cluster Edition's Open vSwitch "
                  "bridges on each, one controller over OpenFlow"
                  + ("" if asked == OVS else " (auto: linux cannot span servers)"))


def choose(asked: str, kernel_datapath: Optional[bool] = None,
           installed: Optional[bool] = None) -> Choice:
    """The data plane for ``asked`` on this machine (the probes are injectable)."""
    if asked not in CHOICES:
        raise DataplaneError(f"dataplane {asked!r}; allowed: {', '.join(CHOICES)}")
    installed = ovs_installed() if installed is None else installed
    if asked == LINUX:
        return Choice(LINUX, asked, "kernel routers and tc patch panels, asked for")
    if asked == OVS and not installed:
        raise DataplaneError("dataplane 'ovs': Open vSwitch is not installed on this machine "
                             "(run ./bootstrap.sh), or use dataplane 'linux' or 'auto'")
    kernel = (ovs.kernel_datapath_available() if installed else False) \
        if kernel_datapath is None else kernel_datapath
    if asked == OVS:
        return Choice(OVS, asked, "Open vSwitch kernel datapath, asked for" if kernel else
                      "Open vSwitch userspace datapath, asked for: no openvswitch kernel "
                      "module here, so one thread forwards every packet")
    if installed and kernel:
        return Choice(OVS, asked, "the openvswitch kernel module is here: Open vSwitch "
                      "forwards in the kernel on every core")
    return Choice(LINUX, asked, "no openvswitch kernel module here: Open vSwitch could only "
                  "run its one-thread userspace datapath, so the kernel routes instead")


def available_congestion_controls(path: Path = AVAILABLE_CC) -> tuple:
    try:
        return tuple(path.read_text().split())
    except OSError:
        return ()


def check_congestion(name: str, path: Path = AVAILABLE_CC, load: bool = True) -> str:
    """``name`` if this kernel has it (loading its module if need be), else refuse."""
    if name not in CONGESTION_CONTROLS:
        raise DataplaneError(f"congestion control {name!r}; allowed: "
                             f"{', '.join(CONGESTION_CONTROLS)}")
    if name not in available_congestion_controls(path) and load and shutil.which("modprobe"):
        subprocess.run(["modprobe", "-q", f"tcp_{name}"], capture_output=True, check=False,
                       timeout=30)
    available = available_congestion_controls(path)
    if name not in available:
        extra = (" (and ECN marking needs a RED or fq_codel queue, also missing here)"
                 if name == "dctcp" else "")
        raise DataplaneError(f"congestion control {name!r} is not in this kernel{extra}; "
                             f"it has: {', '.join(available) or 'none listed'}")
    return name


@dataclass
class DataPlane:
    """The data plane a testbed runs (`emu.live.dataplane`) and what it found."""

    choice: Choice
    netem: bool
    ovs: Optional[ovs.OvsInfo] = None     # Open vSwitch's version and datapath, on ovs

    @property
    def kind(self) -> str:
        return self.choice.dataplane

    @property
    def datapath(self) -> Optional[str]:
        """Open vSwitch's datapath (``system`` kernel or ``netdev`` userspace), on ovs."""
        return self.ovs.datapath if self.ovs else None

    @property
    def processes(self) -> tuple:
        """Processes whose CPU tells whether the data plane kept up (the kernel's
        forwarding shows as softirq time instead)."""
        return ("ovs-vswitchd",) if self.kind == OVS else ()

    def describe(self) -> str:
        if self.ovs:
            return f"Open vSwitch {self.ovs.version}, {self.ovs.datapath} datapath"
        return "Linux kernel routers and tc patch panels"

    def dump_commands(self, switch: str, pid: int, interfaces: List[str]) -> List[List[str]]:
        """Commands that print one switch's forwarding state: flow and group tables
        (OVS), or routes, rules, neighbours and ingress filters in its namespace."""
        if self.kind == OVS:
            return [["ovs-ofctl", "-O", "OpenFlow13", what, switch]
                    for what in ("dump-flows", "dump-groups")]
        prefix = ["mnexec", "-a", str(pid)]
        return [prefix + ["ip", "route"], prefix + ["ip", "rule"], prefix + ["ip", "neigh"]] + \
            [prefix + ["tc", "-s", "filter", "show", "dev", name, "ingress"]
             for name in interfaces]
