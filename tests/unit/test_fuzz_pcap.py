"""Truncated and corrupt captures: every reader of `traffic.measure` (packet
records, iperf3 probes, the OCS probe's sightings, per-link load) returns what
it could read or raises a ValueError naming the file; never a struct.error,
EOFError or scapy's own exception from the middle of a file.

The captures start as the ones a run writes (pcap with micro- and nanosecond
times, pcapng, gzip, Ethernet and Linux cooked v2), then are cut short, have
bytes flipped or overwritten, or are replaced by noise."""

from __future__ import annotations

import gzip
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap, wrpcapng

from fuzzing import assert_clear, share
from test_darkwindow import pcap_file
from test_linkload import SPEC as LINKLOAD_SPEC, sll2_capture
from topologies import registry
from traffic.measure import darkwindow, linkload
from traffic.measure.darkwindow import CaptureFormatError, frame
from traffic.measure.pcap import MAX_BINS, packet_records, throughput_series
from traffic.measure.probes import PROBE_HEADER, probe_records

T0 = 1_700_000_000.0
SOURCE_MAC = bytes.fromhex("0a0000000007")


def ethernet_packets():
    packets = []
    for seq in range(6):
        probe = PROBE_HEADER.pack(int(T0) + seq, 1000 * seq, seq)
        packet = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=4000, dport=5001) \
            / (probe + b"p" * 20)
        packet.time = T0 + seq * 1e-3
        packets.append(packet)
        packet = Ether() / IP(src="10.0.0.2", dst="10.0.0.1", frag=seq % 2) \
            / TCP(sport=5201, dport=40000) / (b"t" * 40)
        packet.time = T0 + seq * 1e-3 + 5e-4
        packets.append(packet)
    return packets


def file_bytes(write) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "seed.pcap"
        write(path)
        return path.read_bytes()


def make_seeds() -> dict:
    """One capture of each kind a run writes, whole."""
    packets = ethernet_packets()
    micro = file_bytes(lambda path: wrpcap(str(path), packets))
    return {
        "pcap": micro,
        "pcap-nano": file_bytes(lambda path: wrpcap(str(path), packets, nano=True)),
        "pcapng": file_bytes(lambda path: wrpcapng(str(path), packets)),
        "pcap-gzip": gzip.compress(micro),
        "sll2-probe": file_bytes(lambda path: pcap_file(path, [
            (int(T0 * 1e9) + i * 10_000, 11 + i % 2, i % 2 * 4, frame(SOURCE_MAC, i, i))
            for i in range(8)])),
        "sll2-load": file_bytes(lambda path: sll2_capture(path, [
            (T0 + i * 0.01, 10 + i % 4, i % 2 * 4, 60 + i) for i in range(8)])),
    }


SEEDS = make_seeds()


@st.composite
def damage(draw, data: bytes) -> bytes:
    """``data`` cut short, with bytes flipped or overwritten, or grown with noise."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["cut", "flip", "overwrite", "insert", "header"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "cut":
            del data[at:]
        elif how == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "overwrite":
            data[at:at + 4] = draw(st.binary(min_size=1, max_size=4)
                                   | st.sampled_from([b"\xff\xff\xff\xff", b"\0\0\0\0",
                                                      b"\x7f\xff\xff\xff"]))
        elif how == "insert":
            data[at:at] = draw(st.binary(max_size=16))
        else:           # the field a reader trusts most: a record's length
            data[24 + 8:24 + 12] = struct.pack("<I", draw(st.sampled_from(
                [0, 1, 19, 65535, 2**31, 2**32 - 1])))
    return bytes(data)


captures = st.sampled_from(sorted(SEEDS)).flatmap(
    lambda kind: st.tuples(st.just(kind), damage(SEEDS[kind]))) \
    | st.tuples(st.just("noise"), st.binary(max_size=120))


def read_all(path, fabric, interfaces) -> dict:
    """Every reader on one file: what each read, or its refusal."""
    readers = {
        "packets": lambda: len(packet_records(path)),
        "probes": lambda: len(probe_records(path)),
        "sightings": lambda: len(darkwindow.read_sightings(path)),
        "load": lambda: len(linkload.analyse(path, interfaces, fabric).links),
    }
    outcome = {}
    for name, read in readers.items():
        try:
            outcome[name] = read()
        except (ValueError, CaptureFormatError) as exc:
            assert_clear(str(exc), str(path))
            outcome[name] = "refused"
    if outcome["packets"] != "refused":
        # What the experiments draw from the records (1 ms bins: ocs-reconfig's).
        try:
            outcome["series"] = len(throughput_series(packet_records(path), 1e-3))
        except ValueError as exc:
            assert_clear(str(exc), "a capture's time is corrupt")
            outcome["series"] = "refused"
    return outcome


@pytest.fixture(scope="module")
def fabric():
    return registry.build(LINKLOAD_SPEC)


@pytest.fixture(scope="module")
def interfaces(fabric):
    return {index: name for index, name in
            enumerate(sorted(linkload.switch_ports(fabric)), start=10)}


@share(2.0)
@given(captures)
def test_a_damaged_capture_is_read_as_far_as_it_goes_or_refused_naming_it(
        fabric, interfaces, tmp_path, capture):
    kind, content = capture
    path = tmp_path / f"{kind}.pcap"
    path.write_bytes(content)
    outcome = read_all(path, fabric, interfaces)
    for name, value in outcome.items():
        event(f"{name}: {'refused' if value == 'refused' else 'read'}")


# ------------------------------------------------------------ the bug it found
def test_a_corrupt_time_far_from_the_others_is_refused_not_binned(tmp_path, fabric,
                                                                  interfaces):
    """One record's seconds field overwritten asked for billions of bins: the
    per-link load and the throughput series filled the memory (the run was
    killed) before anything was refused."""
    path = sll2_capture(tmp_path / "links.pcap", [(T0, 10, 4, 60), (T0 + 0.5, 11, 4, 60),
                                                  (T0 + 2.5e9, 12, 4, 60)])
    with pytest.raises(ValueError, match=f"the packets of {path} span .* more than "
                                         f"{MAX_BINS:,}; a capture's time is corrupt"):
        linkload.analyse(path, interfaces, fabric, bin_s=1.0)
    assert linkload.analyse(path, interfaces, fabric, bin_s=None).links   # no series: fine
    with pytest.raises(ValueError, match="a capture's time is corrupt"):
        throughput_series(packet_records(path), 1.0)


def test_the_undamaged_seeds_read_whole(fabric, interfaces, tmp_path):
    """The damage is what the readers see, not a seed they could not read anyway."""
    expected = {"pcap": ("packets", 12), "pcap-nano": ("packets", 12), "pcapng": ("packets", 12),
                "pcap-gzip": ("packets", 12), "sll2-probe": ("sightings", 8),
                "sll2-load": ("packets", 8)}
    for kind, (reader, count) in expected.items():
        path = tmp_path / f"{kind}.pcap"
        path.write_bytes(SEEDS[kind])
        assert read_all(path, fabric, interfaces)[reader] == count, kind
    path = tmp_path / "pcap.pcap"
    path.write_bytes(SEEDS["pcap"])
    assert len(probe_records(path)) == 6
