"""The probe's datagrams and schedule: what the blackout and jitter measurements read."""

import struct

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from emu.live import probe
from traffic.measure.probes import probe_records


def test_a_datagram_carries_send_time_and_sequence_as_iperf3_does(tmp_path):
    data = probe.datagram(42, 5008.925695, 64)
    assert len(data) == 64
    assert struct.unpack("!IIi", data[:12]) == (5008, 925695, 42)
    packet = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=40000, dport=5301) / data
    packet.time = 1_700_000_000.5
    wrpcap(str(tmp_path / "p.pcap"), [packet])
    (record,) = probe_records(tmp_path / "p.pcap", dport=5301)
    assert record.seq == 42 and record.sent == pytest.approx(5008.925695, abs=1e-6)


class Clock:
    """A clock that sleep() moves; a wake-up can be made late."""

    def __init__(self):
        self.now = 100.0
        self.late = {}

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds + self.late.pop(round(self.now + seconds, 6), 0.0)


class Socket:
    def __init__(self):
        self.sent = []

    def sendto(self, data, address):
        self.sent.append((struct.unpack("!IIi", data[:12]), address))


def test_the_schedule_is_absolute_so_a_late_wake_up_shifts_nothing_after_it():
    clock, sock = Clock(), Socket()
    clock.late[round(100.0 + 3 * 0.0005, 6)] = 0.0004            # the 4th datagram wakes late
    count = probe.send("10.0.0.2", 5301, pps=2000, size=64, duration_s=0.005, clock=clock,
                       sleep=clock.sleep, sock=sock)
    assert count == 10 and [s[0][2] for s in sock.sent] == list(range(1, 11))
    sent = [seconds + micros / 1e6 for (seconds, micros, _), _ in sock.sent]
    assert sent[3] - sent[2] == pytest.approx(0.0009, abs=2e-6), "the late one left late"
    assert sent[4] - sent[3] == pytest.approx(0.0001, abs=2e-6), "the next one kept its time"
    assert sent[9] - sent[0] == pytest.approx(0.0045, abs=2e-6)
    assert all(address == ("10.0.0.2", 5301) for _, address in sock.sent)


def test_a_datagram_never_shrinks_below_its_header():
    assert len(probe.datagram(1, 1.0, 4)) == probe.HEADER.size


def test_a_wake_up_later_than_a_period_skips_the_missed_slots_instead_of_bursting():
    clock, sock = Clock(), Socket()
    clock.late[round(100.0 + 3 * 0.0005, 6)] = 0.0016     # the 4th wakes 3.2 periods late
    count = probe.send("10.0.0.2", 5301, pps=2000, size=64, duration_s=0.005, clock=clock,
                       sleep=clock.sleep, sock=sock)
    sent = [seconds + micros / 1e6 for (seconds, micros, _), _ in sock.sent]
    assert count == len(sent) == 7, "slots 5-7 were missed, not sent late"
    assert [s[0][2] for s in sock.sent] == list(range(1, 8)), "no sequence gap: nothing lost"
    assert sent[3] - 100.0 == pytest.approx(0.0031, abs=2e-6), "the late one left late"
    assert sent[4] - 100.0 == pytest.approx(0.0035, abs=2e-6), \
        "the next one left at its own slot on the grid, not right after the late one"
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert min(gaps) >= 0.0004 - 2e-6, f"no two datagrams back to back: {gaps}"
