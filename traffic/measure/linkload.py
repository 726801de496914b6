"""Per-link load from captures of every switch port, and the hottest links.

Mininet puts each host in its own network namespace.  On Open vSwitch it
leaves the switches in the root one, so every switch port (``fes1-eth3``:
the Mininet switch name, ``-eth``, the fabric port number) is visible there,
and a single ``tcpdump -i any -y LINUX_SLL2`` sees every packet at every
switch port.  On the kernel data plane every switch is a namespace of its
own: one such capture per switch, each with its own interface numbering,
merged by interface name (`analyse_parts`).
`emu.live.capture.FabricCapture` takes them.  The Linux cooked v2 header
(www.tcpdump.org/linktypes/LINKTYPE_LINUX_SLL2.html, 20 bytes) records for
each packet the interface index and the direction::

    0  protocol type (2)   2  reserved (2)   4  interface index (4)
    8  ARPHRD type (2)    10  packet type (1)  11  address length (1)
    12 link-layer address (8)

Packet type 4 is PACKET_OUTGOING; everything else is incoming (0 to us,
1 broadcast, 2 multicast, and 3 "other host", which is what a switch port
sees, since frames carry the next host's MAC, not the port's).

Counting every link traversal once:

* a packet crossing a switch-switch link u -> v is seen twice, outgoing on
  u's port and incoming on v's port: the outgoing copy counts (u -> v) and
  the incoming one is a duplicate, skipped;
* on a host-facing port only the switch end is in the root namespace:
  outgoing is switch -> host, incoming is host -> switch, both count.

`capture_filter` writes a BPF filter that drops the duplicates in the
kernel, halving what tcpdump has to write; the analysis skips them anyway,
so a capture taken with a plain ``tcp`` filter gives the same loads.

Bytes are Ethernet frames (header + payload, no preamble, gap or FCS), like
`traffic.measure.pcap`: the capture's wire length counts the 20-byte cooked header
in place of the 14-byte Ethernet header, so 6 bytes come off each frame of
an Ethernet (ARPHRD 1) interface.  That is also what the links' HTB shaper
counts, so utilisation compares like with like.

Link names are `traffic.kvflows.link_id` of the two ends (``"s1-s3"``) plus
the direction (``src``, ``dst``).  Parallel links (several fibres between
the same two nodes) share a name and are told apart by their ports.  On a
fabric with OCS the loads are per fibre (``o1-s1`` and ``o1-s2``), not per
logical circuit (``s1-s2``) as `emu.experiments.base.path_links` names it.

The packets are read with scapy's RawPcapReader and only the cooked header
is unpacked, as in `traffic.measure.pcap`.  The mapping from interface index to name
comes from the live system when the capture starts (`save_interface_map`,
`load_interface_map`), so a capture can be analysed later, elsewhere.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from scapy.error import Scapy_Exception
from scapy.utils import RawPcapReader

from topologies.fabric import HOST, Fabric
from topologies.naming import SWITCH_PREFIX, interface, link_mbps
from traffic.kvflows import link_id
from traffic.measure.pcap import LINKTYPE_LINUX_SLL2, _timestamp_and_linktype, check_bins

SLL2_HEADER = 20
ETHERNET_HEADER = 14
ARPHRD_ETHER = 1
PACKET_OUTGOING = 4
# Interface index, ARPHRD type and packet type, at offset 4 of the header.
_SLL2_FIELDS = struct.Struct("!IHB")
# Any Mininet switch port of this testbed (``fes3-eth1``, ``feo1-eth12``).
_SWITCH_PORT_NAME = re.compile(rf"^{SWITCH_PREFIX}[a-z]+\d+-eth\d+$")

MAP_FORMAT = 1
LINKS_CSV = "links.csv"
LINK_COLUMNS = ["link", "src", "dst", "src_port", "dst_port", "bytes", "packets",
                "mbps_mean", "mbps_peak_bin", "capacity_mbps", "utilisation",
                "peak_utilisation"]

RateFunction = Callable[[str, str, dict], Optional[float]]


# Interfaces ------------------------------------------------------------------

def interface_name(fabric: Fabric, node: str, port: int) -> str:
    """The root-namespace interface of a switch port, as Mininet names it."""
    if fabric.kind(node) == HOST:
        raise ValueError(f"{node} is a host: its interfaces live in its own "
                         "namespace, not in the root one")
    return interface(fabric, node, port)


@dataclass(frozen=True)
class SwitchPort:
    """A switch port seen in the root namespace, and the link behind it."""

    interface: str
    node: str
    port: int
    peer: str
    peer_port: int
    to_host: bool
    edge: dict = field(compare=False, hash=False, repr=False)


def switch_ports(fabric: Fabric) -> Dict[str, SwitchPort]:
    """Interface name -> port, for every switch port wired in the fabric."""
    ports = {}
    for u, v, data in fabric.graph.edges(data=True):
        for node, peer in ((u, v), (v, u)):
            if fabric.kind(node) == HOST:
                continue
            name = interface_name(fabric, node, data["ports"][node])
            ports[name] = SwitchPort(name, node, data["ports"][node], peer,
                                     data["ports"][peer], fabric.kind(peer) == HOST, data)
    return ports


def capture_filter(interfaces: Mapping[int, str], fabric: Fabric, base: str = "tcp",
                   nodes: Optional[Sequence[str]] = None) -> str:
    """A BPF filter for ``tcpdump -i any`` that keeps one copy per link traversal.

    Outgoing packets on every switch port, and incoming ones on host-facing
    ports only; nothing from the machine's other interfaces (management,
    loopback with the OpenFlow channel).  ``interfaces`` is index -> name
    of the namespace captured; ``nodes`` names the switches whose ports live
    there (default: every switch, as in the root namespace on Open vSwitch).
    The kernel evaluates the filter for every
    packet on every interface, so the shorter of "is host-facing" and "is
    not switch-to-switch" is used, and the other interfaces are excluded by
    listing them (a handful) rather than listing every fabric port.
    """
    ports = switch_ports(fabric)
    wanted = {name for name, port in ports.items() if nodes is None or port.node in nodes}
    missing = sorted(wanted - set(interfaces.values()))
    if missing:
        raise ValueError(f"{len(missing)} switch port(s) of the fabric are not "
                         f"interfaces of this namespace: {', '.join(missing[:5])}")
    others = sorted(i for i, name in interfaces.items() if name not in ports)
    to_host = sorted(i for i, name in interfaces.items()
                     if name in ports and ports[name].to_host)
    between = sorted(i for i, name in interfaces.items()
                     if name in ports and not ports[name].to_host)

    def any_of(indexes: Sequence[int]) -> str:
        return "(" + " or ".join(f"ifindex {i}" for i in indexes) + ")"

    if not between:
        incoming = "inbound"
    elif not to_host:
        incoming = None              # a spine: no host port, so no inbound copy to keep
    elif len(to_host) <= len(between):
        incoming = any_of(to_host)
    else:
        incoming = f"not {any_of(between)}"
    # `outbound or X` keeps the inbound packets that pass X: no "inbound and".
    keep = f"(outbound or {incoming})" if incoming else "(outbound)"
    parts = [f"({base})"] if base else []
    if others:
        parts.append(f"not {any_of(others)}")
    parts.append(keep)
    return " and ".join(parts)


def save_interface_map(path, interfaces: Mapping[int, str], **extra) -> Path:
    """Write index -> name (and ``extra`` facts about the capture) as JSON."""
    path = Path(path)
    document = {"format": MAP_FORMAT,
                "interfaces": {str(index): name for index, name in sorted(interfaces.items())}}
    document.update(extra)
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return path


def load_interface_map(path) -> Tuple[Dict[int, str], dict]:
    """(index -> name, the rest of the document) from `save_interface_map`'s file."""
    try:
        document = json.loads(Path(path).read_text())
        interfaces = {int(index): str(name)
                      for index, name in document.pop("interfaces").items()}
    except (ValueError, KeyError, AttributeError, TypeError) as error:
        raise ValueError(f"{path} is not an interface map ({error})") from None
    return interfaces, document


# Reading ---------------------------------------------------------------------

@dataclass
class _Tally:
    """Packets and bytes seen on one interface in one direction."""

    packets: int = 0
    bytes: int = 0
    bins: Dict[int, int] = field(default_factory=lambda: defaultdict(int))


def _tally(pcap_path, start: Optional[float], end: Optional[float],
           bin_s: Optional[float], origin: Optional[float], shift_s: float = 0.0):
    """Per (ifindex, outgoing) tallies, the first and last timestamps kept,
    the number of packets outside [start, end) and the origin of the bins
    (``origin`` if given, else the first packet kept); every timestamp less
    ``shift_s`` (the capturing server's clock offset)."""
    tallies: Dict[Tuple[int, bool], _Tally] = {}
    first = last = None
    outside = 0
    if not os.path.exists(pcap_path):
        raise FileNotFoundError(f"capture file {pcap_path} does not exist")
    if os.path.getsize(pcap_path) == 0:
        # tcpdump stopped before it wrote its file header: nothing captured.
        return tallies, first, last, outside, origin
    try:
        reader = RawPcapReader(str(pcap_path))
    except Scapy_Exception as error:
        raise ValueError(f"{pcap_path} is not a pcap or pcapng capture: {error}") from None
    try:
        for frame, meta in reader:
            ts, linktype, wirelen = _timestamp_and_linktype(reader, meta)
            ts -= shift_s
            if linktype != LINKTYPE_LINUX_SLL2:
                raise ValueError(f"{pcap_path}: link type {linktype}, not Linux cooked v2 "
                                 f"({LINKTYPE_LINUX_SLL2}): per-link load needs the "
                                 "interface of every packet (tcpdump -i any -y LINUX_SLL2)")
            if len(frame) < SLL2_HEADER:
                raise ValueError(f"{pcap_path}: a record of {len(frame)} bytes is shorter "
                                 f"than the {SLL2_HEADER}-byte cooked header")
            if (start is not None and ts < start) or (end is not None and ts >= end):
                outside += 1
                continue
            ifindex, hatype, packet_type = _SLL2_FIELDS.unpack_from(frame, 4)
            length = wirelen - SLL2_HEADER
            if hatype == ARPHRD_ETHER:
                length += ETHERNET_HEADER
            key = (ifindex, packet_type == PACKET_OUTGOING)
            tally = tallies.get(key)
            if tally is None:
                tally = tallies[key] = _Tally()
            tally.packets += 1
            tally.bytes += length
            if bin_s is not None:
                if origin is None:
                    origin = ts
                # Floor, not int(): -i any may record a packet a few us before
                # the first one (per-CPU timestamps), giving bin -1.
                tally.bins[math.floor((ts - origin) / bin_s)] += length
            if first is None or ts < first:
                first = ts
            if last is None or ts > last:
                last = ts
    finally:
        reader.close()
    return tallies, first, last, outside, origin


# Analysis --------------------------------------------------------------------

@dataclass
class LinkLoad:
    """Load of one directed link over the capture window.

    ``series`` holds Mbit/s per bin (see `LinkLoads.bin_start`); the rates
    are frames' bits over the window (``mbps_mean``) or the bin
    (``mbps_peak_bin``).  ``capacity_mbps`` is the link's emulated rate,
    None when unknown, and then so are the utilisations.
    """

    link: str
    src: str
    dst: str
    src_port: int
    dst_port: int
    bytes: int
    packets: int
    mbps_mean: float
    mbps_peak_bin: Optional[float]
    capacity_mbps: Optional[float]
    series: List[float] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"{self.src}->{self.dst}"

    @property
    def utilisation(self) -> Optional[float]:
        return self.mbps_mean / self.capacity_mbps if self.capacity_mbps else None

    @property
    def peak_utilisation(self) -> Optional[float]:
        if not self.capacity_mbps or self.mbps_peak_bin is None:
            return None
        return self.mbps_peak_bin / self.capacity_mbps

    def row(self) -> Dict[str, object]:
        return {"link": self.link, "src": self.src, "dst": self.dst,
                "src_port": self.src_port, "dst_port": self.dst_port,
                "bytes": self.bytes, "packets": self.packets,
                "mbps_mean": _round(self.mbps_mean), "mbps_peak_bin": _round(self.mbps_peak_bin),
                "capacity_mbps": _round(self.capacity_mbps),
                "utilisation": _round(self.utilisation, 4),
                "peak_utilisation": _round(self.peak_utilisation, 4)}

    def describe(self) -> str:
        text = f"{self.name} ({self.src} port {self.src_port}): {self.mbps_mean:.2f} Mbit/s mean"
        if self.mbps_peak_bin is not None:
            text += f", {self.mbps_peak_bin:.2f} peak"
        if self.utilisation is not None:
            text += (f", {self.utilisation:.0%} of {self.capacity_mbps:g} Mbit/s"
                     f" (peak {self.peak_utilisation:.0%})")
        return text


def _round(value: Optional[float], digits: int = 3) -> Optional[float]:
    return None if value is None else round(value, digits)


@dataclass
class LinkLoads:
    """Every directed link's load, and what the capture held besides.

    ``unknown`` counts packets of interface indexes the map does not hold
    (an interface made after the capture started), ``unmatched`` those of
    interfaces named like a switch port that the fabric does not wire
    (another fabric's map?), ``other`` those of the machine's other
    interfaces; each as index or name -> [packets, bytes].  ``duplicates`` is the
    number of incoming copies on switch-switch ports that were skipped.
    """

    links: List[LinkLoad]
    start: Optional[float]
    end: Optional[float]
    bin_s: Optional[float]
    bin_start: Optional[float]
    unknown: Dict[int, List[int]] = field(default_factory=dict)
    unmatched: Dict[str, List[int]] = field(default_factory=dict)
    other: Dict[str, List[int]] = field(default_factory=dict)
    duplicates: int = 0
    outside: int = 0
    dropped_by_kernel: Optional[int] = None

    @property
    def duration_s(self) -> float:
        if self.start is None or self.end is None:
            return 0.0
        return max(self.end - self.start, 0.0)

    def link(self, src: str, dst: str) -> LinkLoad:
        """The load from src to dst (the busier one if they have parallel links)."""
        found = [load for load in self.links if load.src == src and load.dst == dst]
        if not found:
            raise KeyError(f"no link {src}->{dst} in the fabric")
        return max(found, key=lambda load: load.bytes)

    def hottest(self, n: int = 5, by: str = "utilisation") -> List[LinkLoad]:
        """The ``n`` busiest directed links that carried anything, busiest first.

        ``by`` is "utilisation" (mean rate over the link's emulated rate,
        falling back to bytes for links of unknown rate, which then come
        last), "bytes" or "peak" (the busiest bin's rate).
        """
        if by == "utilisation":
            def key(load):
                return (load.utilisation is not None, load.utilisation or 0.0, load.bytes)
        elif by == "bytes":
            def key(load):
                return (load.bytes,)
        elif by == "peak":
            def key(load):
                return (load.mbps_peak_bin or 0.0, load.bytes)
        else:
            raise ValueError(f"by must be 'utilisation', 'bytes' or 'peak', got {by!r}")
        busy = [load for load in self.links if load.bytes > 0]
        # Ties broken by name, so that the list does not depend on dict order.
        busy.sort(key=lambda load: (load.link, load.src, load.src_port))
        busy.sort(key=key, reverse=True)
        return busy[:n]

    def warnings(self) -> List[str]:
        """What makes these loads incomplete, one sentence each."""
        notes = []
        if self.unknown:
            packets = sum(count for count, _ in self.unknown.values())
            notes.append(f"{packets} packet(s) on interface index(es) "
                         f"{', '.join(map(str, sorted(self.unknown)))} that the interface "
                         "map does not hold: not counted on any link")
        if self.unmatched:
            notes.append(f"packets on {', '.join(sorted(self.unmatched))}, named like switch "
                         "ports that this fabric does not wire: not counted on any link")
        if self.dropped_by_kernel:
            notes.append(f"tcpdump lost {self.dropped_by_kernel} packet(s) (dropped by "
                         "kernel): link loads are under-counted")
        return notes


def _rate_function(bw_factor: Optional[float],
                   rate_mbps: Optional[RateFunction]) -> Optional[RateFunction]:
    if bw_factor is not None and rate_mbps is not None:
        raise ValueError("give bw_factor or rate_mbps, not both")
    if bw_factor is not None:
        if isinstance(bw_factor, bool) or not isinstance(bw_factor, (int, float)) \
                or not math.isfinite(bw_factor) or bw_factor <= 0:
            raise ValueError(f"bw_factor must be a positive finite number, got {bw_factor!r}")
        return lambda u, v, data: link_mbps(data["gbps"], bw_factor)
    return rate_mbps


def analyse(pcap_path, interfaces: Union[Mapping[int, str], str, Path], fabric: Fabric, *,
            bw_factor: Optional[float] = None, rate_mbps: Optional[RateFunction] = None,
            bin_s: Optional[float] = 1.0, start: Optional[float] = None,
            end: Optional[float] = None) -> LinkLoads:
    """Per directed link bytes, mean and peak-bin Mbit/s and utilisation.

    ``interfaces`` is index -> name, or the path of the JSON map written by
    `save_interface_map` (its ``dropped_by_kernel``, if any, is carried
    over).  A link's emulated rate is its ``gbps`` x ``bw_factor`` (as
    `topologies.mininet_topo` shapes it) or ``rate_mbps(u, v, edge_data)``
    in Mbit/s; with neither, utilisations are None.  ``start``/``end``
    (epoch s) bound the window, packets outside it are ignored; by default
    it runs from the first packet to the last.  The mean rate is over the
    whole window, so a link busy for half of it shows half its busy rate.
    ``bin_s`` is the width of the time series' bins (None: no series); the
    peak bin is the busiest one, a last bin cut short by ``end`` counts as
    full, as in `traffic.measure.pcap.throughput_series`.
    """
    return analyse_parts([(pcap_path, interfaces)], fabric, bw_factor=bw_factor,
                         rate_mbps=rate_mbps, bin_s=bin_s, start=start, end=end)


def analyse_parts(parts: Sequence[Tuple[object, Union[Mapping[int, str], str, Path]]],
                  fabric: Fabric, *, bw_factor: Optional[float] = None,
                  rate_mbps: Optional[RateFunction] = None, bin_s: Optional[float] = 1.0,
                  start: Optional[float] = None, end: Optional[float] = None) -> LinkLoads:
    """`analyse` over several captures, each with its own interface map: one per
    network namespace where the switches live in namespaces (the kernel data
    plane).  Interface names are unique across namespaces, so the captures
    merge by name; a packet crossing a switch-switch link is still counted
    once, outgoing at its sender."""
    if bin_s is not None and (isinstance(bin_s, bool) or not isinstance(bin_s, (int, float))
                              or not math.isfinite(bin_s) or bin_s <= 0):
        raise ValueError(f"bin_s must be a positive number of seconds or None, got {bin_s!r}")
    if start is not None and end is not None and end < start:
        raise ValueError(f"end ({end}) must not be before start ({start})")
    if not parts:
        raise ValueError("no capture to analyse")
    rate = _rate_function(bw_factor, rate_mbps)
    ports = switch_ports(fabric)
    dropped = None
    tallies: Dict[Tuple[str, bool], _Tally] = {}
    unknown: List[Tuple[int, _Tally]] = []
    first = last = None
    outside = 0
    origin = start
    for pcap_path, interfaces in parts:
        extra = {}
        if not isinstance(interfaces, Mapping):
            interfaces, extra = load_interface_map(interfaces)
        if extra.get("dropped_by_kernel") is not None:
            dropped = (dropped or 0) + extra["dropped_by_kernel"]
        # A capture made on another server of a cluster run carries that
        # server's clock offset: its times are put on the run's clock.
        shift_s = float(extra.get("clock_offset_s") or 0.0)
        part, part_first, part_last, part_outside, origin = _tally(pcap_path, start, end,
                                                                   bin_s, origin, shift_s)
        outside += part_outside
        if part_first is not None:
            first = part_first if first is None else min(first, part_first)
            last = part_last if last is None else max(last, part_last)
        for (ifindex, outgoing), tally in part.items():
            name = interfaces.get(ifindex)
            if name is None:
                unknown.append((ifindex, tally))
                continue
            merged = tallies.setdefault((name, outgoing), _Tally())
            merged.packets += tally.packets
            merged.bytes += tally.bytes
            for index, length in tally.bins.items():
                merged.bins[index] += length
    window_start = start if start is not None else first
    window_end = end if end is not None else last

    # The per-interface tallies become per-directed-link ones.
    per_link: Dict[Tuple[str, int], List[_Tally]] = defaultdict(list)
    result = LinkLoads(links=[], start=window_start, end=window_end, bin_s=bin_s,
                       bin_start=None, outside=outside, dropped_by_kernel=dropped)
    for ifindex, tally in unknown:
        _add(result.unknown, ifindex, tally)
    for (name, outgoing), tally in sorted(tallies.items()):
        port = ports.get(name)
        if port is None:
            if _SWITCH_PORT_NAME.match(name):
                _add(result.unmatched, name, tally)
            else:
                _add(result.other, name, tally)
            continue
        if outgoing:
            per_link[(port.node, port.port)].append(tally)        # node -> peer
        elif port.to_host:
            per_link[(port.peer, port.peer_port)].append(tally)   # host -> node
        else:
            result.duplicates += tally.packets                    # counted at the peer

    bins = sorted({index for tally in tallies.values() for index in tally.bins})
    low, high = (bins[0], bins[-1]) if bins else (0, -1)
    if bin_s is not None and origin is not None:
        result.bin_start = origin + low * bin_s
        if end is not None:
            # A window given up front keeps its empty bins at the end too.
            high = max(high, math.ceil((end - origin) / bin_s) - 1)
        check_bins(high - low + 1, bin_s, result.bin_start,
                   "the packets of " + ", ".join(str(path) for path, _ in parts))
    duration = result.duration_s
    for u, v, data in fabric.graph.edges(data=True):
        for src, dst in ((u, v), (v, u)):
            if fabric.kind(src) == HOST and fabric.kind(dst) == HOST:
                continue  # both ends namespaced: invisible from the root
            found = per_link.get((src, data["ports"][src]), [])
            total = sum(t.bytes for t in found)
            series = []
            if bin_s is not None:
                series = [sum(t.bins.get(i, 0) for t in found) * 8 / bin_s / 1e6
                          for i in range(low, high + 1)]
            capacity = rate(src, dst, data) if rate is not None else None
            result.links.append(LinkLoad(
                link=link_id(src, dst), src=src, dst=dst, src_port=data["ports"][src],
                dst_port=data["ports"][dst], bytes=total,
                packets=sum(t.packets for t in found),
                mbps_mean=total * 8 / duration / 1e6 if duration > 0 else 0.0,
                mbps_peak_bin=max(series, default=0.0) if bin_s is not None else None,
                capacity_mbps=capacity, series=series))
    result.links.sort(key=lambda load: (load.link, load.src, load.src_port))
    return result


def _add(table: dict, key, tally: _Tally) -> None:
    counts = table.setdefault(key, [0, 0])
    counts[0] += tally.packets
    counts[1] += tally.bytes


# Output ----------------------------------------------------------------------

def write_links_csv(loads: LinkLoads, folder, top: int = 5,
                    by: str = "utilisation") -> List[Dict[str, object]]:
    """Write ``links.csv`` (one row per directed link) into ``folder``.

    Returns the rows of the ``top`` hottest links (`LinkLoads.hottest`),
    busiest first, for a report or ``result.json``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LINKS_CSV, "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=LINK_COLUMNS)
        writer.writeheader()
        for load in loads.links:
            writer.writerow(load.row())
    return [load.row() for load in loads.hottest(top, by=by)]
