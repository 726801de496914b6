"""Dark windows of an OCS, read from a capture taken on the OCS's own ports.

The instrument is a stream of minimum-size frames (`frame`: a UDP datagram
to the discard port carrying a magic word, a sequence number and the send
time) sent into OCS ports from the ToR side, bypassing the ToR's shaping
queue (``PACKET_QDISC_BYPASS``), so nothing but the sender's pace spaces
them.  Their destination MAC is no router's: the ToR a circuit delivers one
to takes it for another host's and drops it before IP looks at it, without
counting it as a receive drop (which the saturation check reads), as it
would count a frame of an unknown EtherType.
One capture in the OCS's namespace on every port (``tcpdump -i any``, Linux
cooked v2 headers: the interface index and whether the frame came in or
went out) then shows each frame arriving at its port and, if a circuit was
lit, leaving by the peer port.  A frame that came in and never went out met
a dark port.

Per ingress port the frames fall into runs of passed and dropped ones; a
change between two consecutive frames is an *edge*: the port went dark
(pass -> drop) or lit (drop -> pass) between the moments the OCS's program
decided on the two.  A frame's decision is bracketed: it comes after the
frame's arrival at the port (the capture's tap runs just before the tc
hook) and before it left by the peer port (a passed frame's outgoing
record) or, for a dropped one, before the sender's next frame arrived (the
kernel processes each frame inside the sender's own send call, one after
the other).  An interrupt between the tap and the program (this VM's timer
took up to 200 us) moves a decision far from the arrival; the bracket then
widens with it instead of misplacing the edge.  So an edge spans from the
arrival of the frame before it to the latest decision of the frame after
it; it is placed in the middle of that span, and the span is its
resolution (one to two probe periods when nothing stalls).  A dark window is a
dark edge followed by a lit edge; when the tear and the light fall on
different ports (a circuit moved to other ports), `window_between` pairs
the edges by time.  The times are the capture's own (nanoseconds of the
kernel's real-time clock), compared with the times the controller wrote
into the kernel (converted to the same clock).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ETHERTYPE = 0x0800                   # IPv4
UDP_PORT = 9                         # discard
MAGIC = 0x0C5B0B0E
PAYLOAD = struct.Struct("!IIQ")      # magic, sequence, send time (CLOCK_MONOTONIC ns)
MIN_FRAME = 60                       # Ethernet's minimum without its FCS
NOBODY = bytes.fromhex("020000000001")   # locally administered, no interface's
SOURCE_IP, DEST_IP = bytes([192, 0, 2, 1]), bytes([192, 0, 2, 2])   # TEST-NET-1
IP_UDP = 28                          # IPv4 header (20) + UDP header (8)

LINKTYPE_LINUX_SLL2 = 276
SLL2 = struct.Struct("!HHIHBB8s")    # protocol, reserved, ifindex, hatype, pkttype, addrlen
PACKET_OUTGOING = 4
PCAP_HEADER = struct.Struct("<IHHiIII")
PCAP_RECORD = struct.Struct("<IIII")
MAGIC_NANO, MAGIC_MICRO = 0xA1B23C4D, 0xA1B2C3D4


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def frame(source_mac: bytes, seq: int, now_ns: int) -> bytes:
    """One probe frame of the minimum size."""
    payload = PAYLOAD.pack(MAGIC, seq & 0xFFFFFFFF, now_ns)
    payload += b"\0" * (MIN_FRAME - 14 - IP_UDP - len(payload))
    udp = struct.pack("!HHHH", UDP_PORT, UDP_PORT, 8 + len(payload), 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, IP_UDP + len(payload), seq & 0xFFFF, 0, 1, 17,
                     0, SOURCE_IP, DEST_IP)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return NOBODY + source_mac + struct.pack("!H", ETHERTYPE) + ip + udp + payload


@dataclass(frozen=True)
class Sighting:
    """A probe frame seen at one interface of the OCS: in (arrived) or out (left)."""

    seq: int
    ifindex: int
    outgoing: bool
    ts_ns: int


class CaptureFormatError(ValueError):
    """The capture is not the OCS probe's kind (pcap, Linux cooked v2)."""


def read_sightings(path) -> List[Sighting]:
    """Every probe frame of a ``tcpdump -i any`` capture (pcap, nanosecond or
    microsecond timestamps, Linux cooked v2); other frames are skipped, and a
    truncated last record ends the reading."""
    with open(path, "rb") as stream:
        data = stream.read()
    if len(data) < PCAP_HEADER.size:
        raise CaptureFormatError(f"{path}: too short for a pcap file")
    magic, _, _, _, _, _, linktype = PCAP_HEADER.unpack_from(data, 0)
    if magic not in (MAGIC_NANO, MAGIC_MICRO):
        raise CaptureFormatError(f"{path}: not a little-endian pcap file (magic {magic:#x})")
    if linktype != LINKTYPE_LINUX_SLL2:
        raise CaptureFormatError(f"{path}: link type {linktype}, expected Linux cooked v2 "
                                 f"({LINKTYPE_LINUX_SLL2}: tcpdump -i any)")
    scale = 1 if magic == MAGIC_NANO else 1000
    found: List[Sighting] = []
    offset = PCAP_HEADER.size
    while offset + PCAP_RECORD.size <= len(data):
        sec, frac, caplen, _ = PCAP_RECORD.unpack_from(data, offset)
        offset += PCAP_RECORD.size
        record = data[offset:offset + caplen]
        offset += caplen
        if len(record) < caplen:
            break
        if len(record) < SLL2.size + IP_UDP + PAYLOAD.size:
            continue
        protocol, _, ifindex, _, pkttype, _, _ = SLL2.unpack_from(record, 0)
        if protocol != ETHERTYPE or record[SLL2.size:SLL2.size + 1] != b"\x45":
            continue
        magic_word, seq, _ = PAYLOAD.unpack_from(record, SLL2.size + IP_UDP)
        if magic_word != MAGIC:
            continue
        found.append(Sighting(seq, ifindex, pkttype == PACKET_OUTGOING,
                              sec * 1_000_000_000 + frac * scale))
    return found


@dataclass(frozen=True)
class Edge:
    """A port going dark (``lit`` False) or lit between two consecutive frames."""

    ifindex: int
    lit: bool
    at_ns: int                # the middle of the gap between the two frames
    resolution_ns: int        # that gap


@dataclass(frozen=True)
class Window:
    """A dark window: from a dark edge to the next lit edge."""

    start: Edge
    end: Edge

    @property
    def duration_ns(self) -> int:
        return self.end.at_ns - self.start.at_ns

    @property
    def resolution_ns(self) -> int:
        return max(self.start.resolution_ns, self.end.resolution_ns)


def port_runs(sightings: Iterable[Sighting]) -> Dict[int, List[Tuple[int, bool, int]]]:
    """Per ingress interface, its frames in arrival order: (arrival ns, passed,
    decided by ns: the latest moment the program can have decided on it)."""
    sightings = list(sightings)
    left = {}
    for s in sightings:
        if s.outgoing:
            left.setdefault(s.seq, s.ts_ns)
    arrived = sorted((s.seq, s.ts_ns, s.ifindex) for s in sightings if not s.outgoing)
    arrivals: Dict[int, List[Tuple[int, bool, int]]] = {}
    for index, (seq, ts, ifindex) in enumerate(arrived):
        if seq in left:
            decided_by = left[seq]
        elif index + 1 < len(arrived):
            decided_by = max(ts, arrived[index + 1][1])
        else:
            continue            # the last frame sent: its fate has no bound in time
        arrivals.setdefault(ifindex, []).append((ts, seq in left, decided_by))
    for frames in arrivals.values():
        frames.sort()
    return arrivals


def edges(sightings: Iterable[Sighting]) -> List[Edge]:
    """Every change between passed and dropped, per ingress port, in time order."""
    found: List[Edge] = []
    for ifindex, frames in port_runs(sightings).items():
        for (t0, was, _), (_, now, decided_by) in zip(frames, frames[1:]):
            if was != now:
                found.append(Edge(ifindex, now, (t0 + decided_by) // 2, decided_by - t0))
    return sorted(found, key=lambda e: e.at_ns)


def windows(found: Sequence[Edge]) -> List[Window]:
    """Dark windows of each port: a dark edge and the port's next lit edge."""
    result: List[Window] = []
    open_at: Dict[int, Edge] = {}
    for edge in found:
        if not edge.lit:
            open_at[edge.ifindex] = edge
        elif edge.ifindex in open_at:
            result.append(Window(open_at.pop(edge.ifindex), edge))
    return sorted(result, key=lambda w: w.start.at_ns)


def window_between(found: Sequence[Edge], dark_at_ns: int, lit_at_ns: int,
                   slack_ns: int) -> Optional[Window]:
    """The dark window of a reconfiguration that the controller wrote for
    [dark_at, lit_at]: the dark edge nearest its start and the lit edge nearest
    its end, on any port (the tear and the light may be on different ports),
    each within ``slack_ns``; None if either is missing."""
    def nearest(lit: bool, at: int) -> Optional[Edge]:
        near = [e for e in found if e.lit == lit and abs(e.at_ns - at) <= slack_ns]
        return min(near, key=lambda e: abs(e.at_ns - at)) if near else None

    start, end = nearest(False, dark_at_ns), nearest(True, lit_at_ns)
    return Window(start, end) if start and end and end.at_ns > start.at_ns else None


@dataclass(frozen=True)
class ScheduleFit:
    """Guards measured against a cyclic schedule's expected ones."""

    guards: int                   # guards measured
    unresolved: int               # guards left out: a gap in the probe wider than half a guard
    period_ns: float              # slope of measured guard starts over their slot numbers
    drift: float                  # period measured / period asked - 1
    worst_boundary_ns: int        # largest |measured - expected| of any guard edge
    mean_boundary_ns: float
    mean_guard_error_ns: float    # guard length measured - asked, on average
    resolution_ns: int            # largest gap behind any edge used


def fit_schedule(found: Sequence[Window], epoch_ns: int, period_ns: int,
                 guard_ns: int) -> ScheduleFit:
    """Compare measured guards (dark windows) with slot k's guard
    [epoch + k*period, epoch + k*period + guard]; ``epoch_ns`` on the capture's
    clock.  The drift comes from a least-squares line through the measured
    starts, so one late edge does not make it.  A window whose probe gap is
    wider than half a guard is left out (counted as unresolved): the probe
    stalled there, and cannot say which guard it saw."""
    rows = []
    resolved = [w for w in found if w.resolution_ns <= guard_ns // 2]
    for window in resolved:
        k = round((window.start.at_ns - epoch_ns) / period_ns)
        expected = epoch_ns + k * period_ns
        rows.append((k, window, window.start.at_ns - expected,
                     window.end.at_ns - (expected + guard_ns)))
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} guard(s) measured: too few to fit a schedule")
    ks = [float(k) for k, _, _, _ in rows]
    starts = [float(w.start.at_ns) for _, w, _, _ in rows]
    mean_k, mean_t = sum(ks) / len(ks), sum(starts) / len(starts)
    spread = sum((k - mean_k) ** 2 for k in ks)
    slope = sum((k - mean_k) * (t - mean_t) for k, t in zip(ks, starts)) / spread \
        if spread else float(period_ns)
    errors = [abs(e) for _, _, a, b in rows for e in (a, b)]
    return ScheduleFit(
        guards=len(rows), unresolved=len(found) - len(resolved), period_ns=slope, drift=slope / period_ns - 1.0,
        worst_boundary_ns=max(errors), mean_boundary_ns=sum(errors) / len(errors),
        mean_guard_error_ns=sum(w.duration_ns - guard_ns for _, w, _, _ in rows) / len(rows),
        resolution_ns=max(w.resolution_ns for _, w, _, _ in rows))
