"""Dark windows read from a capture on an OCS's ports (traffic/measure/darkwindow.py).

The probe frame must be one that nothing on the path takes for its own (a
valid IPv4/UDP datagram to the discard port, addressed to no router's MAC),
and the reader must find those frames in what ``tcpdump -i any`` writes:
pcap with Linux cooked v2 headers, which say on which interface a frame was
seen and whether it came in or went out.  The captures here are made up
byte by byte, so the reader is checked against the format, not against
itself.  Edges, windows and the schedule fit run on sightings and windows
built with known times, so every number asserted is one put in.
"""

import struct

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from topologies import registry
from topologies.naming import ROUTER_MAC
from traffic.measure import darkwindow
from traffic.measure.darkwindow import (CaptureFormatError, Edge, Sighting, Window,
                                        edges, fit_schedule, frame, read_sightings,
                                        window_between, windows)

SOURCE_MAC = bytes.fromhex("0a0000000007")
US = 1_000
IN_HOST, IN_OTHERHOST, OUTGOING = 0, 3, 4     # SLL2 packet types (1: broadcast)


# ------------------------------------------------------------------ the probe frame
def test_a_probe_frame_is_a_minimum_size_udp_datagram_to_the_discard_port():
    data = frame(SOURCE_MAC, seq=7, now_ns=123_456_789)
    assert len(data) == 60, "Ethernet's minimum without its FCS: the sender pads nothing"
    packet = Ether(data)
    assert packet.src == "0a:00:00:00:00:07"
    assert packet.type == 0x0800
    ip, udp = packet[IP], packet[UDP]
    assert (ip.version, ip.ihl, ip.proto, ip.len) == (4, 5, 17, 46)
    assert (ip.src, ip.dst) == ("192.0.2.1", "192.0.2.2"), "TEST-NET-1: nobody's addresses"
    assert (udp.sport, udp.dport, udp.len) == (9, 9, 26)
    magic, seq, sent = darkwindow.PAYLOAD.unpack(bytes(udp.payload)[:darkwindow.PAYLOAD.size])
    assert (magic, seq, sent) == (darkwindow.MAGIC, 7, 123_456_789)


def test_a_probe_frames_ip_checksum_is_the_one_scapy_computes():
    for seq in (0, 1, 0xFFFF, 0x12345, 2**32 + 5):
        ip = Ether(frame(SOURCE_MAC, seq, 1)).getlayer(IP)
        written = ip.chksum
        recomputed = ip.copy()
        del recomputed.chksum
        assert IP(bytes(recomputed)).chksum == written, f"seq {seq}"
        header = bytes(ip)[:20]
        assert sum(struct.unpack("!10H", header)) % 0xFFFF == 0, \
            "a valid header sums to all ones (one's complement)"


def test_sequence_numbers_wrap_at_32_bits_in_the_payload_and_16_in_the_ip_id():
    ip = Ether(frame(SOURCE_MAC, 2**32 + 0x10005, 1)).getlayer(IP)
    assert ip.id == 0x0005
    assert darkwindow.PAYLOAD.unpack(bytes(ip[UDP].payload)[:16])[1] == 0x10005


def test_a_probe_frame_is_addressed_to_no_router_and_no_host():
    """A ToR that a circuit delivers the frame to must drop it before IP: its
    destination is no router's MAC, no host's, and not a group address."""
    destination = Ether(frame(SOURCE_MAC, 1, 1)).dst
    assert destination != ROUTER_MAC.lower()
    assert not int(destination.split(":")[0], 16) & 1, "unicast: no switch floods it"
    fabric = registry.build("rotor,tors=4")
    macs = {fabric.graph.nodes[host]["mac"].lower() for host in fabric.hosts}
    assert destination not in macs


# ------------------------------------------------------------------ reading a capture
def pcap_file(path, records, linktype=darkwindow.LINKTYPE_LINUX_SLL2,
              magic=darkwindow.MAGIC_NANO, tail=b""):
    """A little-endian pcap file of (ts_ns, ifindex, pkttype, Ethernet frame)
    records written as ``tcpdump -i any`` writes them: a 20-byte SLL2 header
    (protocol, reserved, ifindex, hatype, pkttype, addrlen, address) in place
    of the frame's 14-byte Ethernet header; ``tail`` is appended raw."""
    scale = 1 if magic == darkwindow.MAGIC_NANO else 1000
    out = struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 262144, linktype)
    for ts_ns, ifindex, pkttype, ethernet in records:
        protocol = struct.unpack("!H", ethernet[12:14])[0]
        body = struct.pack("!HHIHBB8s", protocol, 0, ifindex, 1, pkttype, 6,
                           ethernet[6:12]) + ethernet[14:]
        out += struct.pack("<IIII", ts_ns // 10**9, ts_ns % 10**9 // scale, len(body),
                           len(body)) + body
    path.write_bytes(out + tail)
    return path


def other_udp() -> bytes:
    """An IPv4/UDP frame of the same size that is not a probe (no magic word)."""
    data = bytearray(frame(SOURCE_MAC, 3, 5))
    data[14 + 28:14 + 32] = b"\0\0\0\0"
    return bytes(data)


def arp() -> bytes:
    return b"\xff" * 6 + SOURCE_MAC + b"\x08\x06" + bytes(46)


def test_read_sightings_reads_seq_port_direction_and_nanosecond_times(tmp_path):
    t0 = 1_700_000_000 * 10**9 + 123_456_789
    path = pcap_file(tmp_path / "ocs.pcap", [
        (t0, 11, IN_OTHERHOST, frame(SOURCE_MAC, 1, 0)),
        (t0 + 700, 12, OUTGOING, frame(SOURCE_MAC, 1, 0)),
        (t0 + 10 * US, 13, IN_HOST, frame(SOURCE_MAC, 2, 0)),
        (t0 + 20 * US, 11, 1, frame(SOURCE_MAC, 3, 0)),          # broadcast: still incoming
    ])
    assert read_sightings(path) == [
        Sighting(1, 11, False, t0), Sighting(1, 12, True, t0 + 700),
        Sighting(2, 13, False, t0 + 10 * US), Sighting(3, 11, False, t0 + 20 * US)]


def test_read_sightings_takes_microsecond_captures_too(tmp_path):
    t0 = 1_700_000_000 * 10**9 + 123_456_000
    path = pcap_file(tmp_path / "us.pcap", [(t0, 11, IN_OTHERHOST, frame(SOURCE_MAC, 9, 0))],
                     magic=darkwindow.MAGIC_MICRO)
    assert read_sightings(path) == [Sighting(9, 11, False, t0)]


def test_read_sightings_skips_frames_that_are_not_probes(tmp_path):
    short_ip = frame(SOURCE_MAC, 4, 0)[:14 + 28 + 4]          # too short for the payload
    not_ipv4_header = bytearray(frame(SOURCE_MAC, 5, 0))
    not_ipv4_header[14] = 0x46                                  # options: not the probe's
    path = pcap_file(tmp_path / "mixed.pcap", [
        (1_000, 11, IN_OTHERHOST, arp()),
        (2_000, 11, IN_OTHERHOST, other_udp()),
        (3_000, 11, IN_OTHERHOST, short_ip),
        (4_000, 11, IN_OTHERHOST, bytes(not_ipv4_header)),
        (5_000, 11, IN_OTHERHOST, frame(SOURCE_MAC, 6, 0)),
    ])
    assert read_sightings(path) == [Sighting(6, 11, False, 5_000)]


def test_a_truncated_last_record_ends_the_reading_without_an_error(tmp_path):
    """tcpdump killed mid-write leaves half a record: what came before stands."""
    whole = [(1_000, 11, IN_OTHERHOST, frame(SOURCE_MAC, 1, 0)),
             (2_000, 12, OUTGOING, frame(SOURCE_MAC, 1, 0))]
    half_record = struct.pack("<IIII", 0, 3_000, 66, 66) + bytes(30)
    path = pcap_file(tmp_path / "cut.pcap", whole, tail=half_record)
    assert [s.seq for s in read_sightings(path)] == [1, 1]
    half_header = pcap_file(tmp_path / "cut2.pcap", whole, tail=bytes(9))
    assert len(read_sightings(half_header)) == 2


def test_a_capture_that_is_not_linux_cooked_v2_is_refused(tmp_path):
    ethernet = pcap_file(tmp_path / "eth.pcap", [], linktype=1)
    with pytest.raises(CaptureFormatError, match=r"link type 1, expected Linux cooked v2"):
        read_sightings(ethernet)
    big_endian = tmp_path / "be.pcap"
    big_endian.write_bytes(struct.pack(">IHHiIII", darkwindow.MAGIC_NANO, 2, 4, 0, 0, 65535, 276))
    with pytest.raises(CaptureFormatError, match="not a little-endian pcap"):
        read_sightings(big_endian)
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    with pytest.raises(CaptureFormatError, match="too short"):
        read_sightings(empty)


def test_what_read_sightings_finds_is_what_edges_reads(tmp_path):
    """The two halves meet: a capture's dropped frames make an edge."""
    records = []
    for seq in range(10):
        t = seq * 10 * US
        records.append((t, 11, IN_OTHERHOST, frame(SOURCE_MAC, seq, t)))
        if not 4 <= seq < 7:
            records.append((t + 500, 21, OUTGOING, frame(SOURCE_MAC, seq, t)))
    found = edges(read_sightings(pcap_file(tmp_path / "p.pcap", records)))
    # Dark: after 3 arrived (30 us), before 5 arrived (50 us, 4's send call was
    # over); lit: after 6 arrived (60 us), before 7 left (70.5 us).
    assert found == [Edge(11, False, 40 * US, 20 * US), Edge(11, True, 65_250, 10_500)]


# ------------------------------------------------------------------ edges and windows
def probe_run(dark, ports=(11, 12), period_ns=10 * US, count=24, out_port=None):
    """Sightings of frames sent round ``ports`` every ``period_ns`` (seq n at
    n x period, into ports[n % len(ports)]); a frame whose seq is in
    ``dark[port]`` never goes out, the others leave 700 ns later by the other
    probed port (so an outgoing sighting shares an ifindex with arrivals)."""
    sightings = []
    for seq in range(count):
        port = ports[seq % len(ports)]
        t = seq * period_ns
        sightings.append(Sighting(seq, port, False, t))
        if seq not in dark.get(port, ()):
            out = out_port or ports[(seq + 1) % len(ports)]
            sightings.append(Sighting(seq, out, True, t + 700))
    return sightings


def test_an_edge_spans_from_the_frame_before_to_the_latest_decision_on_the_one_after():
    """A dropped frame was decided on before the sender's next frame arrived; a
    passed one before it left: the edge is the middle of that bracket."""
    # Port 11 gets even seqs, dark for 6..12; port 12 odd seqs, dark for 9..17.
    sightings = probe_run({11: range(6, 13), 12: range(9, 18)})
    assert edges(sightings) == [
        Edge(11, False, 55 * US, 30 * US),     # 4 arrived (40 us) .. 7 arrived (70 us)
        Edge(12, False, 85 * US, 30 * US),     # 7 arrived .. 10 arrived (100 us)
        Edge(11, True, 130_350, 20_700),       # 12 arrived (120 us) .. 14 left (140.7 us)
        Edge(12, True, 180_350, 20_700),       # 17 arrived .. 19 left
    ]


def test_outgoing_sightings_are_not_arrivals_and_arrival_order_is_by_time():
    shuffled = list(reversed(probe_run({11: range(6, 13)})))
    assert [(e.ifindex, e.lit, e.at_ns) for e in edges(shuffled)] == \
        [(11, False, 55 * US), (11, True, 130_350)]


def test_a_late_frame_widens_its_edges_resolution():
    sightings = [s for s in probe_run({11: range(6, 13)}) if s.seq != 4]
    (dark, lit) = edges(sightings)
    assert (dark.at_ns, dark.resolution_ns) == (45 * US, 50 * US), "2 (20 us) to 7 (70 us)"
    assert lit.resolution_ns == 20_700


def test_a_decision_held_up_after_its_frame_arrived_widens_the_bracket_not_the_window():
    """An interrupt between the capture's tap and the OCS's program: the frame
    arrived before the guard but was decided on (and left) 200 us later."""
    sightings = probe_run({11: range(6, 13)})
    late = [Sighting(s.seq, s.ifindex, s.outgoing, s.ts_ns + 200 * US)
            if s.outgoing and s.seq == 14 else s for s in sightings]
    (_, lit) = edges(late)
    assert lit.resolution_ns == 220_700 and lit.at_ns == 230_350, \
        "from 12's arrival (120 us) to 14's departure (340.7 us)"


def test_windows_pair_each_ports_dark_edge_with_its_next_lit_edge():
    found = edges(probe_run({11: range(6, 13), 12: range(9, 18)}))
    result = windows(found)
    assert [(w.start.ifindex, w.start.at_ns, w.end.at_ns) for w in result] == \
        [(11, 55 * US, 130_350), (12, 85 * US, 180_350)]
    assert [w.duration_ns for w in result] == [75_350, 95_350]
    assert all(w.resolution_ns == 30 * US for w in result)


def test_a_port_dark_from_the_start_or_to_the_end_makes_no_window():
    # 11 dark until seq 8 (its first edge lights it), 12 dark from seq 15 on.
    found = edges(probe_run({11: range(0, 8), 12: range(15, 24)}))
    assert [(e.ifindex, e.lit) for e in found] == [(11, True), (12, False)]
    assert windows(found) == []


def test_window_between_pairs_a_tear_on_one_port_with_a_light_on_another():
    """A circuit moved to other ports: the torn port goes dark for good and the
    newly lit one was dark until then; no single port has a window."""
    found = edges(probe_run({11: range(6, 24), 12: range(0, 13)}))
    assert windows(found) == []
    dark, lit = found                       # 11 dark at 55 us, 12 lit at 120.35 us
    assert (dark.ifindex, dark.lit, dark.at_ns) == (11, False, 55 * US)
    assert (lit.ifindex, lit.lit, lit.at_ns) == (12, True, 120_350)
    window = window_between(found, dark_at_ns=52 * US, lit_at_ns=117 * US, slack_ns=10 * US)
    assert window == Window(dark, lit)
    assert window.duration_ns == 65_350 and window.resolution_ns == 30 * US


def test_window_between_takes_the_nearest_edges_within_the_slack_only():
    found = edges(probe_run({11: range(6, 13), 12: range(9, 18)}))
    near = window_between(found, dark_at_ns=78 * US, lit_at_ns=176 * US, slack_ns=40 * US)
    assert (near.start.ifindex, near.end.ifindex) == (12, 12), "the nearest of each kind"
    assert window_between(found, dark_at_ns=20 * US, lit_at_ns=130 * US, slack_ns=10 * US) \
        is None, "no dark edge within 10 us of 20 us"
    lit_first = edges(probe_run({11: range(0, 8), 12: range(15, 24)}))   # 11 lit at 70 us,
    assert window_between(lit_first, dark_at_ns=140 * US, lit_at_ns=70 * US,  # 12 dark at 140
                          slack_ns=5 * US) is None, "a lit edge before the dark one is no window"


# ------------------------------------------------------------------ fitting a schedule
EPOCH, PERIOD, GUARD = 5_000_000_000, 200 * US, 20 * US


def guard_window(k, offset_ns=0, length_ns=GUARD, resolution_ns=2 * US, port=11,
                 period_ns=PERIOD):
    start = EPOCH + k * period_ns + offset_ns
    return Window(Edge(port, False, start, resolution_ns),
                  Edge(port, True, start + length_ns, resolution_ns))


def test_fit_of_guards_exactly_on_the_schedule_has_no_drift_and_no_error():
    fit = fit_schedule([guard_window(k) for k in range(10)], EPOCH, PERIOD, GUARD)
    assert (fit.guards, fit.unresolved) == (10, 0)
    assert fit.period_ns == pytest.approx(PERIOD)
    assert fit.drift == pytest.approx(0.0, abs=1e-12)
    assert (fit.worst_boundary_ns, fit.mean_boundary_ns, fit.mean_guard_error_ns) == (0, 0, 0)
    assert fit.resolution_ns == 2 * US


def test_fit_reports_a_constant_offset_as_boundary_error_not_as_drift():
    found = [guard_window(k, offset_ns=3 * US) for k in (0, 1, 2, 5, 9)]   # slots skipped
    fit = fit_schedule(found, EPOCH, PERIOD, GUARD)
    assert fit.guards == 5
    assert fit.drift == pytest.approx(0.0, abs=1e-12)
    assert fit.worst_boundary_ns == 3 * US and fit.mean_boundary_ns == pytest.approx(3 * US)
    assert fit.mean_guard_error_ns == 0, "both edges moved: the guard is as long as asked"


def test_fit_measures_a_clock_running_fast_as_drift_and_a_long_guard_as_guard_error():
    stretched = PERIOD * (1 + 1e-4)
    found = [guard_window(k, length_ns=GUARD + 1_000, period_ns=stretched) for k in range(8)]
    fit = fit_schedule(found, EPOCH, PERIOD, GUARD)
    assert fit.drift == pytest.approx(1e-4, rel=1e-3)
    assert fit.period_ns == pytest.approx(stretched, rel=1e-9)
    assert fit.mean_guard_error_ns == pytest.approx(1_000)
    assert fit.worst_boundary_ns == pytest.approx(7 * (stretched - PERIOD) + 1_000, abs=1)


def test_fit_leaves_out_guards_seen_through_a_gap_wider_than_half_a_guard():
    found = [guard_window(k) for k in range(4)]
    found.append(guard_window(6, offset_ns=50 * US, resolution_ns=GUARD // 2 + 1))
    fit = fit_schedule(found, EPOCH, PERIOD, GUARD)
    assert (fit.guards, fit.unresolved) == (4, 1)
    assert fit.worst_boundary_ns == 0, "the stalled guard's 50 us error is not counted"
    at_half = fit_schedule(found[:4] + [guard_window(7, resolution_ns=GUARD // 2)],
                           EPOCH, PERIOD, GUARD)
    assert (at_half.guards, at_half.unresolved) == (5, 0), "half a guard exactly still counts"


def test_fit_needs_two_resolved_guards():
    with pytest.raises(ValueError, match="0 guard"):
        fit_schedule([], EPOCH, PERIOD, GUARD)
    with pytest.raises(ValueError, match="1 guard"):
        fit_schedule([guard_window(0), guard_window(1, resolution_ns=GUARD)],
                     EPOCH, PERIOD, GUARD)
