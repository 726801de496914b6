"""Measurements from tcpdump captures: per-packet records, throughput, gaps.

The captures are read with scapy's :class:`~scapy.utils.RawPcapReader`, which
hands over raw bytes plus the record header; the Ethernet/IPv4/TCP/UDP fields
needed here are unpacked directly rather than by dissecting every packet
into scapy layers, which measured 60 times slower (5 us against 330 us a
packet) and matters for a 10 kpps probe stream.  pcap (microsecond or nanosecond) and
pcapng files are both accepted, optionally gzip-compressed.

Timestamps are float epoch seconds, built as ``seconds + fraction`` from the
integer fields of the capture so that no precision is lost on the way.  A
float near the current epoch (~1.7e9 s) resolves 2**-22 s = 0.24 us, so
microsecond timestamps are kept exactly and nanosecond ones to within a
quarter of a microsecond, three orders of magnitude below the millisecond
blackouts measured here.

``length`` is the frame's length on the wire as the capture header records
it (``orig_len``: Ethernet header + payload, without preamble, inter-frame
gap or FCS), so a capture taken with a short snap length still counts full
packets.  Throughputs below are computed from it ("on the wire").

Link types understood: Ethernet (with 802.1Q/802.1ad tags), Linux cooked
capture v1/v2 (``tcpdump -i any``) and raw IP.
"""

from __future__ import annotations

import bisect
import math
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from scapy.error import Scapy_Exception
from scapy.utils import RawPcapReader

# Link-layer header types (www.tcpdump.org/linktypes.html).
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_RAW_BSD = 12      # DLT_RAW as some platforms number it
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_LINUX_SLL2 = 276

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_VLAN_TAGS = (0x8100, 0x88A8, 0x9100)

#: The most bins a time series may have (11.6 days of 1 s bins, 17 minutes of
#: 1 ms ones).  One corrupt timestamp years away from the others asked for
#: billions, and filled the memory before anything was refused.
MAX_BINS = 1_000_000

_PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp"}
_PROTO_NUMBERS = {"tcp": 6, "udp": 17}


@dataclass(slots=True)
class PacketRecord:
    """One IPv4 packet of a capture.

    ``ts`` is epoch seconds, ``length`` the frame length on the wire in bytes.
    ``sport``/``dport`` are None for protocols without ports and for
    non-first IP fragments; ``proto`` is "tcp", "udp", "icmp" or "ip<N>".
    Not frozen: a frozen dataclass's __init__ tripled the cost of reading a
    capture, and records are treated as read-only all the same.
    """

    ts: float
    length: int
    src: str
    dst: str
    sport: Optional[int]
    dport: Optional[int]
    proto: str
    payload: bytes = b""        # the first bytes of the TCP/UDP payload, when asked for


@dataclass(frozen=True)
class Gap:
    """A silent stretch of a packet stream, in epoch seconds.

    ``closed`` is False when the stream had not resumed by the end of the
    observation: ``end`` is then that end and ``duration_s`` a lower bound.
    """

    start: float
    end: float
    duration_s: float
    closed: bool = True


# Reading ---------------------------------------------------------------------

def _ip_offset(linktype: int, frame: bytes) -> Optional[int]:
    """Offset of the IPv4 header in ``frame``, or None if it is not IPv4."""
    if linktype == LINKTYPE_ETHERNET:
        if len(frame) < 14:
            return None
        offset = 12
        ethertype = (frame[offset] << 8) | frame[offset + 1]
        # Skip any number of VLAN tags (802.1Q, QinQ).
        while ethertype in _ETHERTYPE_VLAN_TAGS and len(frame) >= offset + 6:
            offset += 4
            ethertype = (frame[offset] << 8) | frame[offset + 1]
        return offset + 2 if ethertype == _ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_LINUX_SLL:
        if len(frame) < 16:
            return None
        ethertype = (frame[14] << 8) | frame[15]
        return 16 if ethertype == _ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_LINUX_SLL2:
        if len(frame) < 20:
            return None
        ethertype = (frame[0] << 8) | frame[1]
        return 20 if ethertype == _ETHERTYPE_IPV4 else None
    if linktype in (LINKTYPE_RAW, LINKTYPE_RAW_BSD, LINKTYPE_IPV4):
        return 0 if frame and frame[0] >> 4 == 4 else None
    raise ValueError(f"unsupported link type {linktype}; supported: Ethernet "
                     f"({LINKTYPE_ETHERNET}), Linux cooked v1/v2 "
                     f"({LINKTYPE_LINUX_SLL}/{LINKTYPE_LINUX_SLL2}), raw IP "
                     f"({LINKTYPE_RAW}, {LINKTYPE_RAW_BSD}, {LINKTYPE_IPV4})")


def _timestamp_and_linktype(reader, meta) -> Tuple[float, int, int]:
    """(epoch seconds, link type, wire length) of one capture record."""
    if hasattr(meta, "tsresol"):
        # pcapng: a 64-bit count of units of 1/tsresol seconds.
        units = (meta.tshigh << 32) + meta.tslow
        seconds, fraction = divmod(units, meta.tsresol)
        return seconds + fraction / meta.tsresol, meta.linktype, meta.wirelen
    per_second = 1_000_000_000 if reader.nano else 1_000_000
    return meta.sec + meta.usec / per_second, reader.linktype, meta.wirelen


def _packed_ip(name: str, address: Optional[str]) -> Optional[bytes]:
    if address is None:
        return None
    try:
        # inet_pton, unlike inet_aton, accepts only the dotted-quad form.
        return socket.inet_pton(socket.AF_INET, address)
    except (OSError, TypeError):
        raise ValueError(f"{name} must be a dotted IPv4 address such as "
                         f"'10.0.0.1', got {address!r}") from None


def _check_port(name: str, port: Optional[int]) -> Optional[int]:
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{name} must be an integer port 0..65535, got {port!r}")
    return port


def iter_packet_records(pcap_path, *, proto: Optional[str] = None,
                        src_ip: Optional[str] = None,
                        dst_ip: Optional[str] = None,
                        dport: Optional[int] = None,
                        sport: Optional[int] = None,
                        payload: int = 0) -> Iterator[PacketRecord]:
    """Stream the IPv4 packets of a capture that match every given filter.

    Non-IPv4 frames and packets that fail a filter are skipped.  A port
    filter only matches TCP/UDP packets that carry that port.  ``payload``
    keeps up to that many bytes of a UDP (or TCP) payload in the record, as
    far as the capture's snap length kept them.
    """
    if proto is not None and proto not in _PROTO_NUMBERS:
        raise ValueError(f"proto must be one of {sorted(_PROTO_NUMBERS)} or "
                         f"None, got {proto!r}")
    want_proto = _PROTO_NUMBERS.get(proto) if proto else None
    want_src = _packed_ip("src_ip", src_ip)
    want_dst = _packed_ip("dst_ip", dst_ip)
    want_sport = _check_port("sport", sport)
    want_dport = _check_port("dport", dport)
    if not os.path.exists(pcap_path):
        raise FileNotFoundError(f"capture file {pcap_path} does not exist")
    if os.path.getsize(pcap_path) == 0:
        # tcpdump stopped before it wrote its file header: nothing captured.
        return
    try:
        reader = RawPcapReader(str(pcap_path))
    except Scapy_Exception as error:
        raise ValueError(f"{pcap_path} is not a pcap or pcapng capture: "
                         f"{error}") from None
    # A capture holds few distinct addresses: format each one once.
    address_text = {}
    try:
        for frame, meta in reader:
            ts, linktype, wirelen = _timestamp_and_linktype(reader, meta)
            try:
                offset = _ip_offset(linktype, frame)
            except ValueError as error:
                raise ValueError(f"{pcap_path}: {error}") from None
            if offset is None or len(frame) < offset + 20:
                continue
            ihl = (frame[offset] & 0x0F) * 4
            number = frame[offset + 9]
            if want_proto is not None and number != want_proto:
                continue
            src = frame[offset + 12:offset + 16]
            dst = frame[offset + 16:offset + 20]
            if want_src is not None and src != want_src:
                continue
            if want_dst is not None and dst != want_dst:
                continue
            ports = (None, None)
            fragment_offset = ((frame[offset + 6] & 0x1F) << 8) | frame[offset + 7]
            l4 = offset + ihl
            # Only the first fragment carries the TCP/UDP header.
            if number in (6, 17) and fragment_offset == 0 and len(frame) >= l4 + 4:
                ports = struct.unpack_from("!HH", frame, l4)
            if want_sport is not None and ports[0] != want_sport:
                continue
            if want_dport is not None and ports[1] != want_dport:
                continue
            src_text = address_text.get(src)
            if src_text is None:
                src_text = address_text[src] = socket.inet_ntoa(src)
            dst_text = address_text.get(dst)
            if dst_text is None:
                dst_text = address_text[dst] = socket.inet_ntoa(dst)
            head = b""
            if payload and ports[0] is not None:
                if number == 17:
                    start = l4 + 8                              # UDP header
                elif len(frame) > l4 + 12:
                    start = l4 + (frame[l4 + 12] >> 4) * 4      # TCP data offset
                else:
                    start = len(frame)
                head = bytes(frame[start:start + payload])
            yield PacketRecord(ts, wirelen, src_text, dst_text, ports[0],
                               ports[1], _PROTO_NAMES.get(number) or f"ip{number}", head)
    finally:
        reader.close()


def packet_records(pcap_path, *, proto: Optional[str] = None,
                   src_ip: Optional[str] = None, dst_ip: Optional[str] = None,
                   dport: Optional[int] = None,
                   sport: Optional[int] = None) -> List[PacketRecord]:
    """All matching IPv4 packets of a capture, in capture order.

    ``proto`` is "tcp", "udp" or None (any); the address and port filters
    compare exactly.  See :func:`iter_packet_records` to stream instead.
    """
    return list(iter_packet_records(pcap_path, proto=proto, src_ip=src_ip,
                                    dst_ip=dst_ip, dport=dport, sport=sport))


# Analysis --------------------------------------------------------------------

def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number of seconds "
                         f"(0 < {name} < inf), got {value!r}")
    return float(value)


def throughput_series(records: Iterable[PacketRecord], interval_s: float,
                      start: Optional[float] = None,
                      end: Optional[float] = None) -> List[Tuple[float, float]]:
    """Throughput in Mbit/s on the wire, in bins of ``interval_s`` seconds.

    Returns ``[(bin_start_epoch_s, mbps), ...]`` with empty bins as 0.0.  Bin
    ``i`` covers ``[start + i*interval_s, start + (i+1)*interval_s)``.
    ``start`` defaults to the first packet; without ``end`` the bins run up
    to and including the last packet, with ``end`` they stop before it and
    packets at or after ``end`` are ignored.  Every bin's rate is its bits
    over the full ``interval_s``, so a final bin cut short by ``end``
    under-reports: choose ``end - start`` as a multiple of ``interval_s``.
    """
    interval_s = _check_positive("interval_s", interval_s)
    points = sorted((record.ts, record.length) for record in records)
    if start is None:
        if not points:
            return []
        start = points[0][0]
    if end is None:
        if not points:
            return []
        bins = int((points[-1][0] - start) // interval_s) + 1
    else:
        if end < start:
            raise ValueError(f"end ({end}) must not be before start ({start})")
        bins = math.ceil((end - start) / interval_s)
    bins = max(bins, 0)
    check_bins(bins, interval_s, start, "the packets")
    totals = [0] * bins
    for ts, length in points:
        if ts < start or (end is not None and ts >= end):
            continue
        index = int((ts - start) // interval_s)
        if index < bins:
            totals[index] += length
    return [(start + index * interval_s, total * 8 / interval_s / 1e6)
            for index, total in enumerate(totals)]


def check_bins(bins: int, bin_s: float, start: float, what: str) -> None:
    """Refuse a series of more than `MAX_BINS` bins, saying what spans it."""
    if bins > MAX_BINS:
        raise ValueError(f"{what} span {bins * bin_s:.6g} s from {start:.6f}: {bins:,} bins "
                         f"of {bin_s:g} s, more than {MAX_BINS:,}; a capture's time is "
                         "corrupt, or the bins are too narrow")


def find_gaps(timestamps: Iterable[float], threshold_s: float,
              start: Optional[float] = None,
              end: Optional[float] = None) -> List[Gap]:
    """Silences between consecutive arrivals that last longer than ``threshold_s``.

    A gap runs from one arrival to the next (``duration_s = end - start``).
    With ``start``/``end``, only gaps that overlap ``[start, end]`` are
    returned; a gap that straddles a bound is returned whole, not clipped.
    A stream that never resumes has no closing arrival and so no gap here
    (see :func:`blackout_near` for that case).
    """
    threshold_s = float(threshold_s)
    if not math.isfinite(threshold_s) or threshold_s < 0:
        raise ValueError(f"threshold_s must be a finite number of seconds >= 0,"
                         f" got {threshold_s!r}")
    ordered = sorted(timestamps)
    gaps = []
    for previous, current in zip(ordered, ordered[1:]):
        if current - previous <= threshold_s:
            continue
        if start is not None and current < start:
            continue
        if end is not None and previous > end:
            break
        gaps.append(Gap(previous, current, current - previous))
    return gaps


def blackout_near(timestamps: Sequence[float], t_event: float, window_s: float,
                  nominal_interval_s: float, *, margin_s: float = 0.001,
                  observed_until: Optional[float] = None) -> Optional[Gap]:
    """The blackout a probe stream saw around an event (an OCS circuit change).

    ``timestamps`` are the arrivals of a constant-rate probe stream (period
    ``nominal_interval_s``) at its receiver.  Among the inter-arrival gaps
    that overlap ``[t_event - margin_s, t_event + window_s]``, the longest
    is taken.  The margin admits a dark period that began just before the
    event's timestamp was taken.

    Measured blackout = longest gap - one nominal interval, floored at 0:
    a stream of period P that loses nothing has gaps of P and so a blackout
    of 0, and a stream that loses k consecutive probes has a gap of
    (k+1)P and a blackout of kP.  The resolution is therefore one probe
    period.  The returned :class:`Gap` starts when the first missing probe
    was due (previous arrival + P) and ends at the first arrival after the
    silence, so that ``duration_s == end - start`` is the blackout.

    If the stream never resumed, ``observed_until`` (for example the end of
    the capture) closes the silence and the gap comes back with
    ``closed=False``.  Returns None when no pair of arrivals (and no open
    silence) overlaps the window, e.g. no probe arrived at all.
    """
    nominal_interval_s = _check_positive("nominal_interval_s", nominal_interval_s)
    window_s = _check_positive("window_s", window_s)
    ordered = sorted(timestamps)
    lo, hi = t_event - margin_s, t_event + window_s
    # Only gaps whose end is after `lo` can overlap; start one arrival earlier.
    first = max(bisect.bisect_right(ordered, lo) - 1, 0)
    best: Optional[Tuple[float, float, bool]] = None
    for index in range(first, len(ordered) - 1):
        previous, current = ordered[index], ordered[index + 1]
        if previous > hi:
            break
        if current < lo:
            continue
        if best is None or current - previous > best[1] - best[0]:
            best = (previous, current, True)
    if observed_until is not None and ordered:
        last = ordered[-1]
        if last <= hi and observed_until > last and observed_until >= lo:
            if best is None or observed_until - last > best[1] - best[0]:
                best = (last, observed_until, False)
    if best is None:
        return None
    previous, current, closed = best
    due = min(previous + nominal_interval_s, current)
    return Gap(start=due, end=current, duration_s=current - due, closed=closed)


def recovery_time(records: Iterable[PacketRecord], t_light: float,
                  baseline_mbps: float, interval_s: float,
                  fraction: float = 0.9) -> Optional[float]:
    """Seconds from a circuit lighting until the flow runs at ``fraction`` of baseline.

    The rate is measured over a sliding window of ``interval_s`` that starts
    at a packet arrival: the answer is ``t - t_light`` for the earliest
    arrival ``t >= t_light`` such that the packets in ``[t, t +
    interval_s)`` carry at least ``fraction x baseline_mbps``.  Starting the
    window at ``t`` (rather than ending it there) means a flow that is back
    at full rate the instant the circuit lights gives 0, not one window
    length.  Returns None if the rate never gets there in the records.
    Pass only the records of the flow(s) of interest.
    """
    interval_s = _check_positive("interval_s", interval_s)
    if isinstance(baseline_mbps, bool) or not isinstance(baseline_mbps, (int, float)) \
            or not math.isfinite(baseline_mbps) or baseline_mbps <= 0:
        raise ValueError(f"baseline_mbps must be a positive finite rate in "
                         f"Mbit/s, got {baseline_mbps!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    points = sorted((record.ts, record.length) for record in records
                    if record.ts >= t_light)
    target_bytes = fraction * baseline_mbps * 1e6 * interval_s / 8
    window_bytes = 0
    right = 0
    # Two pointers: the window [points[left].ts, +interval_s) only grows to
    # the right as `left` advances, so the whole scan is linear.
    for left, (ts, _) in enumerate(points):
        while right < len(points) and points[right][0] < ts + interval_s:
            window_bytes += points[right][1]
            right += 1
        if window_bytes >= target_bytes:
            return ts - t_light
        window_bytes -= points[left][1]
    return None
