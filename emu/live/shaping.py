"""Link rates, queue bounds and MTUs, applied in batches: one process per namespace.

Every interface that sends onto a fabric link gets the same three tc
objects Mininet's TCLink would give it, plus a bounded queue::

    qdisc  root handle 5: htb default 1
    class  5:1 htb rate <link rate>mbit burst 15k
    qdisc  parent 5:1 handle 10: pfifo limit <packets>

so each direction of a link is shaped once, at its sender.  On the ``linux``
data plane an OCS port holds no queue of its own (a circuit is light, not a
buffer): the shaping sits on the router or host end of the link, and what is
in flight when a circuit is torn is lost, as it would be.

TCLink configures one link at a time, a tc process per command, which took
85 s on a k=8 fat-tree; here each namespace gets one ``tc -batch`` and one
``ip -batch`` (entered with ``mnexec -a PID``), and the root namespace, where
Open vSwitch's ports live, one of each.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

from topologies.fabric import OCS, Fabric
from topologies.naming import interface, link_mbps

HTB_BURST = "15k"        # Mininet's TCLink burst, kept so rates behave as before
BATCH_TIMEOUT_S = 120.0


class BatchError(RuntimeError):
    """A batch of tc or ip commands failed; the message names the node and the error."""


def shaped_interfaces(fabric: Fabric, bw_factor: float, dataplane: str
                      ) -> Dict[str, List[Tuple[str, float]]]:
    """node -> [(interface, emulated Mbit/s)] of every interface that is shaped."""
    plan: Dict[str, List[Tuple[str, float]]] = defaultdict(list)
    for u, v, data in fabric.links():
        rate = link_mbps(data["gbps"], bw_factor)
        for node in (u, v):
            if dataplane == "linux" and fabric.kind(node) == OCS:
                continue
            plan[node].append((interface(fabric, node, data["ports"][node]), rate))
    return dict(plan)


def tc_lines(ifname: str, mbps: float, queue_packets: int) -> List[str]:
    """The tc batch lines that shape one interface (``replace``: idempotent)."""
    return [f"qdisc replace dev {ifname} root handle 5: htb default 1",
            f"class replace dev {ifname} parent 5: classid 5:1 htb rate {mbps:.6g}mbit "
            f"burst {HTB_BURST}",
            f"qdisc replace dev {ifname} parent 5:1 handle 10: pfifo limit {queue_packets}"]


def mtu_lines(interfaces: Iterable[str], mtu: int) -> List[str]:
    return [f"link set dev {name} mtu {mtu}" for name in interfaces]


def run_batch(tool: str, lines: List[str], pid: Optional[int], what: str) -> None:
    """Run ``tool -batch`` over ``lines`` in the namespace of ``pid`` (None: this one)."""
    if not lines:
        return
    with tempfile.NamedTemporaryFile("w", prefix=f"fe-{tool}-", suffix=".batch",
                                     delete=False) as stream:
        stream.write("\n".join(lines) + "\n")
        path = stream.name
    try:
        command = [tool, "-batch", path]
        if pid is not None:
            command = ["mnexec", "-a", str(pid)] + command
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=BATCH_TIMEOUT_S, check=False)
    finally:
        os.unlink(path)
    noise = [line for line in (done.stdout + done.stderr).splitlines()
             if line.strip() and "quantum of class" not in line]
    if done.returncode != 0 or noise:
        raise BatchError(f"{what}: {tool} -batch failed ({done.returncode}): "
                         f"{' | '.join(noise)[:500]}")
