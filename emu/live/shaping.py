"""Link rates, queue bounds and MTUs, applied in batches: one process per namespace.

Every interface that sends onto a fabric link gets Mininet TCLink's HTB
class at the link's rate, split into two bounded queues::

    qdisc  root handle 5: htb default 20
    class  5:1  htb rate <link rate>mbit burst 15k                (the link)
    class  5:10 htb rate 5% ceil <link rate> prio 0   -> pfifo    (signalling)
    class  5:20 htb rate 95% ceil <link rate> prio 1  -> pfifo    (data)
    filters: TCP with no payload (acknowledgements, handshakes)    -> 5:10
             DSCP CS1 (every replayed flow's data stream)           -> 5:20
             other TCP (iperf3's control connections)               -> 5:10
             everything else (UDP probes, ICMP)                     -> 5:20

so each direction of a link is shaped once, at its sender, and the data
queue is what a flow meets.  The first class keeps the emulator's own
signalling out of that queue: the workloads are transfers on connections that
already exist, with acknowledgements that cost the fabric next to nothing,
while each replayed flow is an iperf3 test whose set-up and result exchange
would otherwise wait behind up to QUEUE_MS of another flow's data, and whose
acknowledgements would couple it to flows it shares no data link with (up to
0.2 s per flow on a ring all-reduce at 10 Mbit/s).  Both classes share the
link's rate.  A data stream's segment goes to the data queue however small
it is: a short segment that fills a bounded window (37 bytes, say) used to
count as signalling, overtook the segments queued before it, and the
receiver saw the flow out of order (spurious fast retransmissions, on every
multi-hop KV flow of pd-failure).  On the ``linux``
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
SIGNALLING_SHARE = 0.05  # the rate the signalling class is sure of; it borrows the rest
DATA_TOS = 0x20          # DSCP CS1, set on every replayed flow's data stream
IP_HEADER_BYTES = 20     # the shaped traffic's IPv4 headers carry no options
TCP_DATA_OFFSETS = range(5, 16)   # a TCP header's length in 32-bit words
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
    """The tc batch lines that shape one interface, once: the qdiscs and
    classes are replaced, but the first filters are added (u32 keeps several
    at one priority only by handle)."""
    signalling = mbps * SIGNALLING_SHARE
    dev, rate = f"dev {ifname}", f"{mbps:.6g}mbit"
    classes = f"ceil {rate} burst {HTB_BURST} cburst {HTB_BURST} quantum 1514"
    return [
        f"qdisc replace {dev} root handle 5: htb default 20",
        f"class replace {dev} parent 5: classid 5:1 htb rate {rate} burst {HTB_BURST}",
        f"class replace {dev} parent 5:1 classid 5:10 htb rate {signalling:.6g}mbit "
        f"{classes} prio 0",
        f"class replace {dev} parent 5:1 classid 5:20 htb rate {mbps - signalling:.6g}mbit "
        f"{classes} prio 1",
        f"qdisc replace {dev} parent 5:10 handle 10: pfifo limit {queue_packets}",
        f"qdisc replace {dev} parent 5:20 handle 20: pfifo limit {queue_packets}",
        *(f"filter add {dev} parent 5: protocol ip prio 1 u32 {matches} flowid 5:10"
          for matches in control_segment_matches()),
        f"filter replace {dev} parent 5: protocol ip prio 2 u32 "
        f"match ip tos {DATA_TOS:#04x} 0xfc flowid 5:20",
        f"filter replace {dev} parent 5: protocol ip prio 3 u32 match ip protocol 6 0xff "
        f"flowid 5:10"]


def control_segment_matches() -> List[str]:
    """u32 matches, one list entry per TCP header length, that together take
    exactly the TCP segments with no payload: IPv4 without options (header
    byte 0x45), and an IP total length equal to the two headers, the TCP
    one's length being the data offset in the top four bits of its byte 12
    (packet byte 32).  u32 cannot subtract, hence one filter per offset."""
    return [f"match u8 0x45 0xff at 0 match ip protocol 6 0xff "
            f"match u16 {IP_HEADER_BYTES + 4 * words:#06x} 0xffff at 2 "
            f"match u8 {words << 4:#04x} 0xf0 at {IP_HEADER_BYTES + 12}"
            for words in TCP_DATA_OFFSETS]


def mtu_lines(interfaces: Iterable[str], mtu: int) -> List[str]:
    return [f"link set dev {name} mtu {mtu}" for name in interfaces]


def namespace_batches(nodes: Iterable[Tuple[Optional[int], str, List[str]]], fabric: Fabric,
                      bw_factor: float, dataplane: str, queue_packets: int, mtu: int
                      ) -> Dict[Optional[int], Dict[str, List[str]]]:
    """The ip and tc batch lines of every namespace (None: the root one, where
    Open vSwitch's ports live), from ``nodes`` as (namespace pid or None, fabric
    node, its interfaces): every interface's MTU, and the shaping of every
    interface that sends onto a link (`shaped_interfaces`)."""
    plan = shaped_interfaces(fabric, bw_factor, dataplane)
    batches: Dict[Optional[int], Dict[str, List[str]]] = {}
    for pid, fabric_node, interfaces in nodes:
        batch = batches.setdefault(pid, {"ip": [], "tc": []})
        batch["ip"] += mtu_lines(interfaces, mtu)
        for ifname, mbps in plan.get(fabric_node, []):
            batch["tc"] += tc_lines(ifname, mbps, queue_packets)
    return batches


def apply(batches: Dict[Optional[int], Dict[str, List[str]]]) -> None:
    """One ``ip -batch`` and one ``tc -batch`` per namespace, MTUs first."""
    for pid, batch in batches.items():
        where = "the root namespace" if pid is None else f"namespace of pid {pid}"
        run_batch("ip", batch["ip"], pid, f"set MTUs in {where}")
        run_batch("tc", batch["tc"], pid, f"shape links in {where}")


def run_batch(tool: str, lines: List[str], pid: Optional[int], what: str) -> None:
    """Run ``tool -batch`` over ``lines`` in the namespace of ``pid`` (None: this one)."""
    run_batches(tool, {pid: lines}, what)


def _namespace_command(pid: Optional[int], command: List[str]) -> List[str]:
    """``command`` run in the namespace of ``pid`` (None: this one)."""
    return command if pid is None else ["mnexec", "-a", str(pid)] + command


def run_batches(tool: str, batches: Dict[Optional[int], List[str]], what: str) -> None:
    """Run one ``tool -batch`` per namespace (pid, or None for this one), all at
    once: each reads its own file, so the changes land within a process start
    of each other, as when a switch loses every link together, rather than
    one namespace after another."""
    started, paths = [], []
    try:
        for pid, lines in batches.items():
            if not lines:
                continue
            with tempfile.NamedTemporaryFile("w", prefix=f"fe-{tool}-", suffix=".batch",
                                             delete=False) as stream:
                stream.write("\n".join(lines) + "\n")
            paths.append(stream.name)
            where = "the root namespace" if pid is None else f"the namespace of pid {pid}"
            process = subprocess.Popen(_namespace_command(pid, [tool, "-batch", stream.name]),
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
            started.append((process, where))
        failures = []
        for process, where in started:
            try:
                output, _ = process.communicate(timeout=BATCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                failures.append(f"{where}: no answer in {BATCH_TIMEOUT_S:.0f} s")
                continue
            noise = [line for line in output.splitlines()
                     if line.strip() and "quantum of class" not in line]
            if process.returncode != 0 or noise:
                failures.append(f"{where}: {tool} -batch failed ({process.returncode}): "
                                f"{' | '.join(noise)[:500]}")
    finally:
        for process, _ in started:
            if process.poll() is None:
                process.kill()
                process.wait()
        for path in paths:
            os.unlink(path)
    if failures:
        raise BatchError(f"{what}: " + "; ".join(failures))
