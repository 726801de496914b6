"""Open vSwitch and kernel capability detection and set-up.

The kernel datapath is used where the openvswitch module exists; otherwise
the userspace (netdev) datapath, which needs checksum/TSO/GSO offload off on
host interfaces or TCP stalls.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from emu.live.waiting import WaitTimeout, wait_until

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
VSWITCHD_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
KERNEL, USERSPACE = "system", "netdev"


class PlatformError(RuntimeError):
    """This machine lacks something the testbed needs; the message says what."""


@dataclass(frozen=True)
class OvsInfo:
    datapath: str          # "system" (kernel module) or "netdev" (userspace)
    version: str
    vswitchd_pid: Optional[int]

    @property
    def mininet_datapath(self) -> str:
        return "kernel" if self.datapath == KERNEL else "user"


def _run(args, check=True, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=timeout)


def kernel_datapath_available() -> bool:
    if os.path.isdir("/sys/module/openvswitch"):
        return True
    if shutil.which("modprobe") is None:
        return False
    return _run(["modprobe", "-q", "openvswitch"], check=False).returncode == 0 \
        and os.path.isdir("/sys/module/openvswitch")


def netem_available() -> bool:
    """Try netem on the loopback of a throwaway network namespace."""
    if shutil.which("unshare") is None or shutil.which("tc") is None:
        return False
    probe = _run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                  "delay", "1ms"], check=False)
    return probe.returncode == 0


def ovs_running() -> bool:
    if shutil.which("ovs-vsctl") is None:
        return False
    return _run(["ovs-vsctl", "--timeout=3", "show"], check=False).returncode == 0


def vswitchd_pid() -> Optional[int]:
    try:
        with open(VSWITCHD_PIDFILE) as stream:
            return int(stream.read().strip())
    except (OSError, ValueError):
        return None


def ensure_ovs(timeout_s: float = 30.0) -> OvsInfo:
    """Start ovsdb-server and ovs-vswitchd if needed; pick the datapath."""
    if shutil.which("ovs-vsctl") is None:
        raise PlatformError("Open vSwitch is not installed: run `sudo make test` or "
                            "`sudo ./bootstrap.sh` first")
    if not ovs_running():
        if not os.path.exists(OVS_CTL):
            raise PlatformError(f"{OVS_CTL} not found; cannot start Open vSwitch")
        _run([OVS_CTL, "start", "--system-id=random"], check=False, timeout=timeout_s)
        try:
            wait_until(ovs_running, timeout_s, "Open vSwitch to start", interval_s=0.2)
        except WaitTimeout:
            raise PlatformError("Open vSwitch did not start: see "
                                "/var/log/openvswitch/ovs-vswitchd.log") from None
    version = _run(["ovs-vsctl", "--version"]).stdout.split("\n")[0].split()[-1]
    datapath = KERNEL if kernel_datapath_available() else USERSPACE
    return OvsInfo(datapath=datapath, version=version, vswitchd_pid=vswitchd_pid())


# How long a bridge waits at most between attempts to reach a controller that
# went away (Open vSwitch's default is 8 s): a controller restarted after a
# crash is back in a second or two, and every bridge should find it then.
RECONNECT_MAX_BACKOFF_MS = 1000


def set_controller(bridges, target: str) -> None:
    """Point every bridge at the controller in one ovs-vsctl transaction."""
    args = ["ovs-vsctl", "--timeout=30"]
    for number, bridge in enumerate(bridges):
        args += ["--", f"--id=@c{number}", "create", "Controller", f"target=\"{target}\"",
                 f"max_backoff={RECONNECT_MAX_BACKOFF_MS}",
                 "--", "set", "Bridge", bridge, f"controller=@c{number}"]
    _run(args)


def disable_offloads_cmd(interface: str) -> str:
    return f"ethtool -K {interface} tx off tso off gso off"
