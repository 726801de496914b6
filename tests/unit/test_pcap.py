"""Tests for traffic.measure.pcap on small captures written with scapy."""

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, CookedLinux, Dot1Q, Ether
from scapy.utils import wrpcap, wrpcapng

from traffic.measure.pcap import (Gap, PacketRecord, blackout_near, find_gaps,
                          packet_records, recovery_time, throughput_series)

T0 = 1_700_000_000.0  # an epoch time like the ones real captures carry
# Floats near T0 resolve 2**-22 s (0.24 us): compare times to within 1 us.
H1, H2, H3 = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def udp(src, dst, sport, dport, at, payload=100):
    packet = Ether() / IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) \
        / (b"x" * payload)
    packet.time = at
    return packet


def tcp(src, dst, sport, dport, at, payload=100):
    packet = Ether() / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport) \
        / (b"y" * payload)
    packet.time = at
    return packet


def record(at, length=1250):
    return PacketRecord(ts=at, length=length, src=H1, dst=H2, sport=1,
                        dport=2, proto="udp")


@pytest.fixture
def mixed_capture(tmp_path):
    path = tmp_path / "mixed.pcap"
    packets = [
        udp(H1, H2, 4000, 5001, T0 + 0.000001),
        tcp(H1, H2, 40000, 5201, T0 + 0.000002),
        udp(H3, H2, 4001, 5001, T0 + 0.000003),
        tcp(H2, H1, 5201, 40000, T0 + 0.000004),
        Ether() / ARP(),                      # not IPv4: skipped
        udp(H1, H3, 4000, 5002, T0 + 0.000006),
    ]
    packets[4].time = T0 + 0.000005
    wrpcap(str(path), packets)
    return path


def test_records_carry_fields_exact_timestamps_and_wire_length(mixed_capture):
    records = packet_records(mixed_capture)
    assert len(records) == 5
    first = records[0]
    assert first == PacketRecord(ts=first.ts, length=14 + 20 + 8 + 100,
                                 src=H1, dst=H2, sport=4000, dport=5001,
                                 proto="udp")
    assert first.ts == pytest.approx(T0 + 0.000001, abs=1e-7)
    gaps_us = [round((b.ts - a.ts) * 1e6) for a, b in zip(records, records[1:])]
    assert gaps_us == [1, 1, 1, 2]
    assert records[1].proto == "tcp" and records[1].length == 14 + 20 + 20 + 100


def test_filters_combine(mixed_capture):
    assert [r.proto for r in packet_records(mixed_capture, proto="tcp")] == ["tcp", "tcp"]
    assert len(packet_records(mixed_capture, proto="udp")) == 3
    assert [r.src for r in packet_records(mixed_capture, dst_ip=H2, proto="udp")] == [H1, H3]
    assert len(packet_records(mixed_capture, src_ip=H1)) == 3
    assert [r.dst for r in packet_records(mixed_capture, dport=5001)] == [H2, H2]
    assert [r.sport for r in packet_records(mixed_capture, sport=5201)] == [5201]
    only = packet_records(mixed_capture, src_ip=H1, dst_ip=H3, dport=5002, proto="udp")
    assert len(only) == 1 and only[0].dport == 5002
    assert packet_records(mixed_capture, src_ip="10.9.9.9") == []


def test_bad_filters_are_rejected_by_name(mixed_capture):
    with pytest.raises(ValueError, match="proto must be one of"):
        packet_records(mixed_capture, proto="icmp")
    with pytest.raises(ValueError, match="src_ip must be a dotted IPv4"):
        packet_records(mixed_capture, src_ip="10.1")
    with pytest.raises(ValueError, match="dport must be an integer port"):
        packet_records(mixed_capture, dport=70000)


def test_missing_empty_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pcap"):
        packet_records(tmp_path / "nope.pcap")
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    assert packet_records(empty) == []
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"this is not a capture at all")
    with pytest.raises(ValueError, match="junk.pcap is not a pcap"):
        packet_records(junk)


def test_nanosecond_pcap_keeps_sub_microsecond_precision(tmp_path):
    path = tmp_path / "nano.pcap"
    packets = [udp(H1, H2, 1, 2, T0), udp(H1, H2, 1, 2, T0)]
    wrpcap(str(path), packets, nano=True)
    # Rewrite the second record's nanosecond field by hand: 123456789 ns.
    data = bytearray(path.read_bytes())
    second_header = 24 + 16 + len(packets[0])
    data[second_header + 4:second_header + 8] = (123456789).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    records = packet_records(path)
    assert records[1].ts - records[0].ts == pytest.approx(0.123456789, abs=3e-7)


def test_pcapng_vlan_and_cooked_captures(tmp_path):
    ng = tmp_path / "capture.pcapng"
    wrpcapng(str(ng), [udp(H1, H2, 1, 2, T0 + 0.5)])
    [ng_record] = packet_records(ng)
    assert ng_record.ts == pytest.approx(T0 + 0.5, abs=1e-6)

    tagged = Ether() / Dot1Q(vlan=10) / IP(src=H1, dst=H2) / UDP(sport=7, dport=8)
    tagged.time = T0
    vlan = tmp_path / "vlan.pcap"
    wrpcap(str(vlan), [tagged])
    assert packet_records(vlan, dport=8)[0].src == H1

    cooked = CookedLinux(proto=0x0800) / IP(src=H3, dst=H1) / TCP(sport=9, dport=10)
    cooked.time = T0
    sll = tmp_path / "any.pcap"
    wrpcap(str(sll), [cooked])
    assert packet_records(sll)[0].src == H3


def test_throughput_series_bins_and_zero_fills():
    # 1250-byte frames are 10 kbit: 10 per 10 ms bin is 10 Mbit/s.
    records = [record(T0 + 0.0005 + 0.001 * i) for i in range(10)]      # bin 0
    records += [record(T0 + 0.0205 + 0.001 * i) for i in range(5)]      # bin 2
    series = throughput_series(records, 0.01, start=T0)
    assert [round(t - T0, 6) for t, _ in series] == [0.0, 0.01, 0.02]
    assert [mbps for _, mbps in series] == pytest.approx([10.0, 0.0, 5.0])


def test_throughput_series_respects_explicit_window():
    records = [record(T0 + 0.0005 + 0.001 * i) for i in range(40)]
    series = throughput_series(records, 0.01, start=T0 + 0.01, end=T0 + 0.03)
    assert len(series) == 2
    assert [mbps for _, mbps in series] == pytest.approx([10.0, 10.0])
    assert throughput_series([], 0.01) == []
    assert [m for _, m in throughput_series([], 0.01, start=T0, end=T0 + 0.02)] == [0.0, 0.0]
    with pytest.raises(ValueError, match="interval_s must be a positive"):
        throughput_series(records, 0)


def test_find_gaps_exact_and_windowed():
    arrivals = [T0, T0 + 0.001, T0 + 0.002, T0 + 0.012, T0 + 0.013, T0 + 0.050]
    gaps = find_gaps(arrivals, threshold_s=0.005)
    assert [(round(g.start - T0, 6), round(g.end - T0, 6)) for g in gaps] == \
        [(0.002, 0.012), (0.013, 0.05)]
    assert [g.duration_s for g in gaps] == pytest.approx([0.010, 0.037], abs=1e-6)
    # Unsorted input is fine; a window keeps gaps overlapping it, whole.
    windowed = find_gaps(list(reversed(arrivals)), 0.005, start=T0 + 0.02, end=T0 + 0.03)
    assert len(windowed) == 1 and windowed[0].start == pytest.approx(T0 + 0.013)
    assert find_gaps(arrivals, 0.005, end=T0 + 0.0015) == []


def probe_stream(period_s, start, stop, dark=None):
    """Arrival times of a periodic probe, minus those inside `dark`."""
    arrivals, index = [], 0
    while start + index * period_s < stop:
        at = start + index * period_s
        if dark is None or not dark[0] <= at < dark[1]:
            arrivals.append(at)
        index += 1
    return arrivals


def test_blackout_of_lossless_stream_is_zero():
    arrivals = probe_stream(0.0001, T0, T0 + 0.2)
    gap = blackout_near(arrivals, T0 + 0.1, window_s=0.05, nominal_interval_s=0.0001)
    assert gap is not None and gap.duration_s == pytest.approx(0, abs=1e-6)


def test_blackout_is_gap_minus_one_probe_period():
    period = 0.0001
    # Probes due in [t_event + 2 ms, t_event + 12 ms) are lost: 100 probes.
    t_event = T0 + 0.1
    arrivals = probe_stream(period, T0, T0 + 0.3,
                            dark=(t_event + 0.002 - period / 2, t_event + 0.012 - period / 2))
    gap = blackout_near(arrivals, t_event, window_s=0.05, nominal_interval_s=period)
    assert gap.closed
    assert gap.duration_s == pytest.approx(0.010, abs=1e-6)
    assert gap.duration_s == pytest.approx(gap.end - gap.start)
    assert gap.start == pytest.approx(t_event + 0.002, abs=1e-6)
    # A longer silence outside the window is not picked up.
    late = [a for a in arrivals if not T0 + 0.2 < a < T0 + 0.25]
    assert blackout_near(late, t_event, 0.05, period).duration_s == pytest.approx(0.010, abs=1e-6)


def test_blackout_that_never_ends_is_open():
    arrivals = probe_stream(0.001, T0, T0 + 0.1)
    assert blackout_near(arrivals, T0 + 0.2, 0.05, 0.001) is None
    gap = blackout_near(arrivals, T0 + 0.095, 0.05, 0.001, observed_until=T0 + 0.5)
    assert not gap.closed and gap.end == T0 + 0.5
    assert blackout_near([], T0, 0.05, 0.001) is None


def test_recovery_time_is_zero_when_back_at_full_rate_at_once():
    t_light = T0 + 1.0
    # 1000 frames/s of 10 kbit each: 10 Mbit/s from 50 ms after lighting.
    records = [record(t_light + 0.05 + 0.001 * i) for i in range(100)]
    assert recovery_time(records, t_light, baseline_mbps=10, interval_s=0.01) == \
        pytest.approx(0.05)


def test_recovery_time_follows_a_ramp():
    t_light = T0 + 1.0
    ramp_end = t_light + 0.1
    slow = [record(ramp_end - 0.002 * k) for k in range(1, 46)]            # 5 Mbit/s
    fast = [record(ramp_end + 0.0005 + 0.001 * i) for i in range(100)]     # 10 Mbit/s
    before = [record(t_light - 0.001 * k) for k in range(1, 50)]           # ignored
    recovered = recovery_time(before + slow + fast, t_light, 10, 0.01, fraction=0.85)
    # The window starting at the last slow packet holds it and 8 fast ones.
    assert recovered == pytest.approx(0.1 - 0.002, abs=1e-6)
    assert recovery_time(slow, t_light, 10, 0.01) is None
    with pytest.raises(ValueError, match="fraction"):
        recovery_time(slow, t_light, 10, 0.01, fraction=1.5)
    with pytest.raises(ValueError, match="baseline_mbps"):
        recovery_time(slow, t_light, 0, 0.01)


def test_gap_is_a_plain_dataclass():
    assert Gap(1.0, 2.0, 1.0) == Gap(start=1.0, end=2.0, duration_s=1.0, closed=True)


def iperf3_datagram(seq, sent, arrival, src=H1, dport=5301):
    """An iperf3 UDP probe datagram: send time (s, us) and count, then padding."""
    import struct
    header = struct.pack("!IIi", int(sent), round((sent - int(sent)) * 1e6), seq)
    packet = Ether() / IP(src=src, dst=H2) / UDP(sport=4000, dport=dport) / (header + b"p" * 52)
    packet.time = arrival
    return packet


def test_probe_records_carry_send_time_and_sequence(tmp_path):
    from traffic.measure.probes import probe_records
    path = tmp_path / "probe.pcap"
    wrpcap(str(path), [iperf3_datagram(1, T0 + 0.25, T0 + 0.2501),
                       tcp(H1, H2, 40000, 5301, T0 + 0.3),
                       iperf3_datagram(2, T0 + 0.5, T0 + 0.5003, dport=9)])
    (probe,) = probe_records(path, dport=5301)
    assert probe.seq == 1 and probe.sent == pytest.approx(T0 + 0.25, abs=1e-6)
    assert probe.arrival == pytest.approx(T0 + 0.2501, abs=1e-6)
    assert [r.seq for r in probe_records(path)] == [1, 2], "no port filter: every datagram"


def test_sequence_blackout_is_the_senders_lost_stretch_whatever_the_queueing():
    from traffic.measure.probes import ProbeRecord, sequence_blackout
    period = 0.0001
    records = []
    for seq in range(1, 2001):
        sent = T0 + seq * period
        if T0 + 0.1 <= sent < T0 + 0.11:
            continue                                  # 10 ms dark: 100 probes lost
        # Queueing shrinks across the loss (a queue drained into the dark):
        # arrival gaps alone would read the blackout 5 ms short.
        delay = 0.006 if sent < T0 + 0.1 else 0.001
        records.append(ProbeRecord(sent + delay, sent, seq))
    gap = sequence_blackout(records, T0 + 0.1, window_s=0.05, period_s=period)
    assert gap.lost == 100
    assert gap.duration_s == pytest.approx(0.010, abs=2e-6)
    arrivals = blackout_near([r.arrival for r in records], T0 + 0.1, window_s=0.05,
                             nominal_interval_s=period)
    assert arrivals.duration_s == pytest.approx(0.005, abs=2e-6), \
        "the arrival gap is what the sequence numbers correct"
    assert sequence_blackout(records, T0 + 5.0, window_s=0.05, period_s=period) is None
    lossless = sequence_blackout(records, T0 + 0.15, window_s=0.01, period_s=period)
    assert lossless.lost == 0 and lossless.duration_s == pytest.approx(0.0, abs=1e-9)
