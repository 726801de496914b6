"""Where packets were lost while a testbed ran: the fabric's queues, or the emulator.

A drop at an emulated link's queue (the HTB + pfifo every sending interface
has, `emu.live.shaping`) is congestion: fabric behaviour, reported as it is.
Drops anywhere else mean the machine, not the fabric, ran short:

* **veth drops**: a veth hands every packet to the receiving CPU's backlog
  queue; when softirq processing cannot keep up, the backlog overflows and
  the veth counts the drop, before any emulated queue saw the packet;
* **softnet drops and time squeezes** (``/proc/net/softnet_stat``): the same
  backlog overflowing, and softirq running out of its budget with packets
  still waiting, machine-wide;
* **ovs-vswitchd's hidden drops**: Open vSwitch's userspace datapath sends
  every port's packets through one socket; when its buffer is full it logs
  "Resource temporarily unavailable" and the packet is gone, while qdisc and
  port counters show nothing.  The count of those log lines is a lower bound.

A link taken down on purpose (a failure, `emu.live.testbed.Testbed.set_links`)
loses what its queue and its veth pair held at that moment, as a real link
does: those drops are counted apart (``failed_link_drops``), as the failure's
own loss, not the machine's.

`read` takes a snapshot of the counters; `delta` gives what one testbed's
lifetime added, which `emu.fidelity.assess` turns into warnings.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Collection, Iterable, Optional

SOFTNET_STAT = Path("/proc/net/softnet_stat")
VSWITCHD_LOG = Path("/var/log/openvswitch/ovs-vswitchd.log")
HIDDEN_DROP = "Resource temporarily unavailable"


@dataclass(frozen=True)
class Counters:
    queue_drops: int = 0          # at the emulated links' queues: congestion
    veth_drops: int = 0           # before any queue: the receiving backlog was full
    softnet_drops: int = 0        # machine-wide backlog overflows
    time_squeezes: int = 0        # softirq out of budget with packets waiting
    vswitchd_hidden: int = 0      # ovs-vswitchd's "Resource temporarily unavailable"
    vswitchd_log_bytes: int = 0   # where the log ended when read
    failed_link_drops: int = 0    # veth drops on links taken down: the failure's own loss

    def to_dict(self) -> dict:
        result = asdict(self)
        result.pop("vswitchd_log_bytes")
        return result


def _json_of(command, pid: Optional[int]) -> list:
    if pid is not None:
        command = ["mnexec", "-a", str(pid)] + command
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        return []          # the namespace is gone: nothing left to count
    try:
        return json.loads(done.stdout or "[]")
    except ValueError:
        return []


def namespace_drops(pid: Optional[int], failed: Collection[str] = ()) -> tuple:
    """(queue drops, veth drops, veth drops on the ``failed`` interfaces) of one
    network namespace (``None``: this one)."""
    queue = sum(int(q.get("drops", 0)) for q in _json_of(["tc", "-s", "-json", "qdisc", "show"],
                                                          pid) if q.get("root"))
    veth = on_failed = 0
    for link in _json_of(["ip", "-s", "-json", "link", "show"], pid):
        if link.get("ifname") == "lo" or "link" not in link and "link_netnsid" not in link:
            continue
        stats = link.get("stats64") or {}
        dropped = int(stats.get("rx", {}).get("dropped", 0)) + \
            int(stats.get("tx", {}).get("dropped", 0))
        if link.get("ifname") in failed:
            on_failed += dropped
        else:
            veth += dropped
    return queue, veth, on_failed


def softnet(path: Path = SOFTNET_STAT) -> tuple:
    """(dropped, time_squeeze) summed over the CPUs (the file's 2nd and 3rd columns, hex)."""
    dropped = squeezed = 0
    try:
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3:
                dropped += int(fields[1], 16)
                squeezed += int(fields[2], 16)
    except OSError:
        pass
    return dropped, squeezed


def vswitchd_hidden_drops(since: int, path: Path = VSWITCHD_LOG) -> tuple:
    """(lines saying a packet could not be sent, the log's size) after byte ``since``."""
    try:
        size = path.stat().st_size
        if size < since:
            since = 0                  # the log was rotated
        with open(path, "rb") as stream:
            stream.seek(since)
            text = stream.read().decode(errors="replace")
    except OSError:
        return 0, since
    return text.count(HIDDEN_DROP), size


def log_size(path: Path = VSWITCHD_LOG) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read(namespaces: Iterable[Optional[int]], ovs: bool, log_since: int = 0,
         softnet_path: Path = SOFTNET_STAT, vswitchd_log: Path = VSWITCHD_LOG,
         failed: Collection[str] = ()) -> Counters:
    """A snapshot of every counter, over the given namespaces (pids; None: the
    root); veth drops on the ``failed`` interfaces (of links taken down) apart."""
    queue = veth = on_failed = 0
    for pid in namespaces:
        q, v, f = namespace_drops(pid, failed)
        queue, veth, on_failed = queue + q, veth + v, on_failed + f
    dropped, squeezed = softnet(softnet_path)
    hidden, size = vswitchd_hidden_drops(log_since, vswitchd_log) if ovs else (0, 0)
    return Counters(queue, veth, dropped, squeezed, hidden, size, on_failed)


def delta(before: Counters, after: Counters) -> Counters:
    """What happened between two snapshots (the hidden drops are counted since
    ``before`` already: `read` was given its log position)."""
    return Counters(queue_drops=max(0, after.queue_drops - before.queue_drops),
                    veth_drops=max(0, after.veth_drops - before.veth_drops),
                    softnet_drops=max(0, after.softnet_drops - before.softnet_drops),
                    time_squeezes=max(0, after.time_squeezes - before.time_squeezes),
                    vswitchd_hidden=after.vswitchd_hidden,
                    failed_link_drops=max(0, after.failed_link_drops - before.failed_link_drops),
                    vswitchd_log_bytes=after.vswitchd_log_bytes)
