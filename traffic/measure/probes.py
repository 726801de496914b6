"""Probe streams in captures: each datagram's send time and sequence number.

A probe (iperf3's UDP test, or `emu.live.probe`) stamps every datagram with
when it left and its place in the stream.  Read from the receiver's capture,
that tells, per datagram, when it was sent, when it arrived and which ones
never did, so a blackout is the stretch of the sender's time whose probes were
lost (`sequence_blackout`), whatever queueing did to the arrivals around it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence


# iperf3 starts every UDP datagram with its send time (seconds, microseconds)
# and a packet count, in network byte order (32-bit count by default);
# `emu.live.probe` writes the same.
PROBE_HEADER = struct.Struct("!IIi")


@dataclass(slots=True)
class ProbeRecord:
    """One datagram of an iperf3 UDP probe: when it arrived, when it was sent,
    and its sequence number (seconds; the sender's clock is the receiver's:
    one machine)."""

    arrival: float
    sent: float
    seq: int


def probe_records(pcap_path, *, src_ip: Optional[str] = None,
                  dport: Optional[int] = None) -> List[ProbeRecord]:
    """The iperf3 UDP probe datagrams of a capture, with their send timestamps
    and sequence numbers, in arrival order; datagrams too short to carry the
    header are skipped."""
    # Imported here: the probe sender imports PROBE_HEADER, and not scapy with it.
    from traffic.measure.pcap import iter_packet_records

    records = []
    for packet in iter_packet_records(pcap_path, proto="udp", src_ip=src_ip, dport=dport,
                                      payload=PROBE_HEADER.size):
        if len(packet.payload) < PROBE_HEADER.size:
            continue
        seconds, micros, seq = PROBE_HEADER.unpack(packet.payload)
        records.append(ProbeRecord(packet.ts, seconds + micros / 1e6, seq))
    return records


@dataclass(frozen=True)
class SequenceGap:
    """Probes lost in a row: the send times around them and how many.

    ``duration_s`` is the stretch of the sender's time whose probes never
    arrived: the send time of the first probe after the loss, less that of
    the last one before it, less one probe period.  Unlike a gap between
    arrivals, it does not shrink or grow when queueing delay changes across
    the loss, and its resolution is one probe period.
    """

    before_sent: float
    after_sent: float
    lost: int
    duration_s: float


def sequence_blackout(records: Sequence[ProbeRecord], t_event: float, window_s: float,
                      period_s: float, margin_s: float = 0.001) -> Optional[SequenceGap]:
    """The longest run of lost probes that arrived around an event: among pairs of
    probes consecutive in sequence whose arrivals bracket any time of
    ``[t_event - margin_s, t_event + window_s]``, the one with the largest jump
    in sequence number.  None when no probe arrived on either side."""
    if period_s <= 0 or window_s <= 0:
        raise ValueError(f"period_s and window_s must be positive, got {period_s!r}, "
                         f"{window_s!r}")
    ordered = sorted(records, key=lambda r: r.seq)
    lo, hi = t_event - margin_s, t_event + window_s
    best = None
    for before, after in zip(ordered, ordered[1:]):
        if after.arrival < lo or before.arrival > hi:
            continue
        jump = after.seq - before.seq
        if best is None or jump > best[0]:
            best = (jump, before, after)
    if best is None:
        return None
    jump, before, after = best
    return SequenceGap(before.sent, after.sent, max(0, jump - 1),
                       max(0.0, after.sent - before.sent - period_s))
