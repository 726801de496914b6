"""Tests for traffic.measure.linkload on hand-built Linux cooked v2 captures."""

import base64
import csv
import struct

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from topologies import registry
from traffic.measure import linkload
from emu.live.capture import (CaptureError, FabricCapture, root_interfaces,
                             tcpdump_counts)
from traffic.kvflows import link_id

T0 = 1_700_000_000.0
OUT, OTHERHOST = 4, 3      # packet types of the cooked v2 header
IP_LEN = 1500                        # a full-size IPv4 packet
FRAME = IP_LEN + 14                  # the Ethernet frame the link carries
# Mbit/s of a 200 Gbit/s link with bw_factor 1e-3 (topologies.mininet_topo).
BW_FACTOR, LINK_MBPS = 1e-3, 200.0

# zcube,n=2,gpus_per_server=2: s1 has h1 on port 1, h3 on 2, s3 on 3, s4 on 4;
# s3 has h2 on 1, h6 on 2, s1 on 3, s2 on 4.
SPEC = "zcube,n=2,gpus_per_server=2"


@pytest.fixture
def fabric():
    return registry.build(SPEC)


@pytest.fixture
def interfaces(fabric):
    """Index -> name as the root namespace of the running fabric would show it."""
    table = {1: "lo", 2: "eth0", 3: "fes1", 4: "ovs-netdev"}
    for index, name in enumerate(sorted(linkload.switch_ports(fabric)), start=10):
        table[index] = name
    return table


def index_of(interfaces, name):
    return next(i for i, n in interfaces.items() if n == name)


def sll2_capture(path, packets, nano=True, arphrd=1, snaplen=80):
    """Write a pcap of (ts, ifindex, packet_type, ip_len) records, as tcpdump
    -i any -y LINUX_SLL2 -s snaplen writes them: wire length = 20 + IP length."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    per_second = 1_000_000_000 if nano else 1_000_000
    with open(path, "wb") as out:
        out.write(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, 276))
        for ts, ifindex, packet_type, ip_len in packets:
            header = struct.pack("!HHIHBB8s", 0x0800, 0, ifindex, arphrd, packet_type, 6,
                                 b"\x02\xfe\x00\x00\x00\x01")
            ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, ip_len, 0, 0, 64, 6, 0,
                             bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
            frame = (header + ip + bytes(ip_len - 20))[:snaplen]
            seconds = int(ts)
            fraction = round((ts - seconds) * per_second)
            out.write(struct.pack("<IIII", seconds, fraction, len(frame), 20 + ip_len))
            out.write(frame)
    return path


def traversal(interfaces, path, ts, ip_len=IP_LEN, with_duplicates=True):
    """The records one packet leaves along a path of switch ports.

    ``path`` is [(ingress interface or None, egress interface), ...] per
    switch, as the root namespace sees it: incoming then outgoing."""
    records = []
    for hop, (ingress, egress) in enumerate(path):
        # Past the first switch, the ingress is the far end of a switch link.
        if ingress is not None and (hop == 0 or with_duplicates):
            records.append((ts, index_of(interfaces, ingress), OTHERHOST, ip_len))
        records.append((ts, index_of(interfaces, egress), OUT, ip_len))
    return records


# h1 -> s1 -> s3 -> h2: in on fes1-eth1, out fes1-eth3, in fes3-eth3 (the
# duplicate), out fes3-eth1.
H1_TO_H2 = [("fes1-eth1", "fes1-eth3"), ("fes3-eth3", "fes3-eth1")]
# h2 -> s3 -> s1 -> h1, the ACKs.
H2_TO_H1 = [("fes3-eth1", "fes3-eth3"), ("fes1-eth3", "fes1-eth1")]
# h3 -> s1 -> s4 -> h4 (s4 port 1).
H3_TO_H4 = [("fes1-eth2", "fes1-eth4"), ("fes4-eth3", "fes4-eth1")]


def test_each_traversal_counts_once_in_its_direction(tmp_path, fabric, interfaces):
    packets = []
    for i in range(10):
        packets += traversal(interfaces, H1_TO_H2, T0 + 0.1 * i)
        packets += traversal(interfaces, H2_TO_H1, T0 + 0.1 * i + 0.01, ip_len=52)
    path = sll2_capture(tmp_path / "fabric.pcap", packets)

    loads = linkload.analyse(path, interfaces, fabric, bw_factor=BW_FACTOR,
                             start=T0, end=T0 + 1.0)

    assert loads.link("h1", "s1").bytes == 10 * FRAME
    assert loads.link("s1", "s3").bytes == 10 * FRAME
    assert loads.link("s3", "h2").bytes == 10 * FRAME
    assert loads.link("s3", "s1").bytes == 10 * (52 + 14)
    assert loads.link("h2", "s3").packets == 10
    assert loads.link("s1", "h1").packets == 10
    # Untouched links are there with nothing on them, not left out.
    assert loads.link("s1", "s4").bytes == 0
    assert len(loads.links) == 2 * fabric.graph.number_of_edges()
    # The incoming copies on s3 port 3 and s1 port 3: one per packet each way.
    assert loads.duplicates == 20
    assert loads.unknown == {} and loads.warnings() == []

    s1_s3 = loads.link("s1", "s3")
    assert (s1_s3.link, s1_s3.src_port, s1_s3.dst_port) == (link_id("s1", "s3"), 3, 3)
    assert s1_s3.mbps_mean == pytest.approx(10 * FRAME * 8 / 1e6)
    assert s1_s3.capacity_mbps == pytest.approx(LINK_MBPS)
    assert s1_s3.utilisation == pytest.approx(10 * FRAME * 8 / 1e6 / LINK_MBPS)


def test_a_capture_without_the_duplicates_gives_the_same_loads(tmp_path, fabric, interfaces):
    """What the kernel filter of capture_filter keeps is enough."""
    full, filtered = [], []
    for i in range(5):
        full += traversal(interfaces, H1_TO_H2, T0 + 0.1 * i)
        filtered += traversal(interfaces, H1_TO_H2, T0 + 0.1 * i, with_duplicates=False)
    assert len(filtered) == len(full) - 5
    a = linkload.analyse(sll2_capture(tmp_path / "a.pcap", full), interfaces, fabric)
    b = linkload.analyse(sll2_capture(tmp_path / "b.pcap", filtered), interfaces, fabric)
    assert [load.row() for load in a.links] == [load.row() for load in b.links]
    assert (a.duplicates, b.duplicates) == (5, 0)


def test_unknown_interfaces_are_reported_not_dropped_silently(tmp_path, fabric, interfaces):
    interfaces = dict(interfaces)
    interfaces[90] = "fes9-eth1"                 # a switch port this fabric does not have
    packets = traversal(interfaces, H1_TO_H2, T0)
    packets += [(T0 + 0.1, 77, OUT, 100), (T0 + 0.2, 77, OTHERHOST, 200),
                (T0 + 0.3, 90, OUT, 300), (T0 + 0.4, 2, OUT, 400)]
    path = sll2_capture(tmp_path / "fabric.pcap", packets)

    loads = linkload.analyse(path, interfaces, fabric)

    assert loads.unknown == {77: [2, 100 + 200 + 2 * 14]}
    assert loads.unmatched == {"fes9-eth1": [1, 314]}
    assert loads.other == {"eth0": [1, 414]}
    warnings = " ".join(loads.warnings())
    assert "2 packet(s) on interface index(es) 77" in warnings
    assert "fes9-eth1" in warnings
    assert sum(load.bytes for load in loads.links) == 3 * FRAME


def test_hottest_orders_by_utilisation_bytes_or_peak(tmp_path, fabric, interfaces):
    packets = []
    # h1 -> h2: 4 packets spread over two 0.5 s bins; h3 -> h4: 3 packets in one bin.
    for i in range(4):
        packets += traversal(interfaces, H1_TO_H2, T0 + 0.25 * i)
    for i in range(3):
        packets += traversal(interfaces, H3_TO_H4, T0 + 0.6 + 0.01 * i)
    path = sll2_capture(tmp_path / "fabric.pcap", packets)

    # Make s1 -> s3 a slower link, so it is the most utilised despite the bytes.
    def rate(u, v, data):
        return 10.0 if {u, v} == {"s1", "s3"} else 100.0

    loads = linkload.analyse(path, interfaces, fabric, rate_mbps=rate, bin_s=0.5,
                             start=T0, end=T0 + 1.0)

    by_use = [load.name for load in loads.hottest(2)]
    assert by_use == ["s1->s3", "h1->s1"]          # equal bytes below: name order
    by_bytes = [load.name for load in loads.hottest(3, by="bytes")]
    assert by_bytes == ["h1->s1", "s3->h2", "s1->s3"]   # ties: by link name
    by_peak = loads.hottest(1, by="peak")[0]
    assert by_peak.name == "h3->s1"
    assert by_peak.mbps_peak_bin == pytest.approx(3 * FRAME * 8 / 0.5 / 1e6)
    # Only links that carried something, never more than asked for.
    assert len(loads.hottest(100)) == 6
    with pytest.raises(ValueError, match="by must be"):
        loads.hottest(by="load")


def test_time_series_bins_and_window(tmp_path, fabric, interfaces):
    packets = []
    for at in (0.1, 0.2, 1.3, 3.9, 5.5):             # 5.5 s is past the window
        packets += traversal(interfaces, H1_TO_H2, T0 + at)
    path = sll2_capture(tmp_path / "fabric.pcap", packets)

    loads = linkload.analyse(path, interfaces, fabric, bw_factor=BW_FACTOR, bin_s=1.0,
                             start=T0, end=T0 + 5.0)

    mbit = FRAME * 8 / 1e6
    series = loads.link("s1", "s3").series
    assert series == pytest.approx([2 * mbit, mbit, 0.0, mbit, 0.0])
    assert loads.bin_start == pytest.approx(T0)
    assert loads.link("s1", "s3").mbps_peak_bin == pytest.approx(2 * mbit)
    assert loads.link("s1", "s3").mbps_mean == pytest.approx(4 * mbit / 5.0)
    assert loads.outside == 4                       # the 5.5 s packet at 4 ports
    assert loads.link("s1", "s4").series == [0.0] * 5

    # Without a window: first to last packet, no series if bin_s is None.
    loads = linkload.analyse(path, interfaces, fabric, bin_s=None)
    assert loads.duration_s == pytest.approx(5.4, abs=1e-6)
    assert loads.link("s1", "s3").series == []
    assert loads.link("s1", "s3").mbps_peak_bin is None
    assert loads.link("s1", "s3").utilisation is None


def test_parallel_links_are_told_apart_by_port(tmp_path):
    fabric = registry.build("hybrid")              # s1 reaches o1 on ports 3 and 4
    names = sorted(linkload.switch_ports(fabric))
    interfaces = {index: name for index, name in enumerate(names, start=10)}
    packets = [(T0, index_of(interfaces, "fes1-eth3"), OUT, IP_LEN),
               (T0 + 0.1, index_of(interfaces, "fes1-eth4"), OUT, IP_LEN),
               (T0 + 0.2, index_of(interfaces, "fes1-eth4"), OUT, IP_LEN)]
    loads = linkload.analyse(sll2_capture(tmp_path / "f.pcap", packets), interfaces, fabric)
    s1_o1 = [load for load in loads.links if load.src == "s1" and load.dst == "o1"]
    assert {(load.src_port, load.dst_port, load.bytes) for load in s1_o1} == \
        {(3, 1, FRAME), (4, 2, 2 * FRAME)}
    assert all(load.link == "o1-s1" for load in s1_o1)
    assert loads.link("s1", "o1").src_port == 4      # the busier of the two


def test_real_tcpdump_sample_on_loopback(tmp_path, fabric):
    """Eight packets of a 3000-byte TCP exchange on lo, captured with
    tcpdump 4.99.3 -i any -y LINUX_SLL2 -s 128 --time-stamp-precision=nano:
    loopback (ARPHRD 772) packets, all incoming (type 0), interface index 1."""
    path = tmp_path / "lo.pcap"
    path.write_bytes(base64.b64decode(LOOPBACK_SAMPLE))
    loads = linkload.analyse(path, {1: "fes1-eth1"}, fabric, bin_s=None)
    h1_s1 = loads.link("h1", "s1")
    # IP lengths 60 + 60 + 52 + 3052 + 4 x 52; no Ethernet header on lo.
    assert (h1_s1.packets, h1_s1.bytes) == (8, 3432)
    assert sum(load.bytes for load in loads.links) == 3432
    # First and last record 282,990 ns apart (nanosecond timestamps).
    assert loads.duration_s == pytest.approx(282.990e-6, abs=1e-6)


def test_refuses_captures_without_interfaces(tmp_path, fabric, interfaces):
    path = tmp_path / "ether.pcap"
    wrpcap(str(path), [Ether() / IP() / TCP()])
    with pytest.raises(ValueError, match="LINUX_SLL2"):
        linkload.analyse(path, interfaces, fabric)
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    loads = linkload.analyse(empty, interfaces, fabric, bin_s=1.0)
    assert loads.hottest() == [] and loads.duration_s == 0.0
    with pytest.raises(FileNotFoundError):
        linkload.analyse(tmp_path / "missing.pcap", interfaces, fabric)
    with pytest.raises(ValueError, match="not both"):
        linkload.analyse(empty, interfaces, fabric, bw_factor=1e-3, rate_mbps=lambda *a: 1.0)
    with pytest.raises(ValueError, match="bin_s"):
        linkload.analyse(empty, interfaces, fabric, bin_s=0)


def test_links_csv_has_every_directed_link_and_returns_the_hottest(tmp_path, fabric,
                                                                   interfaces):
    packets = []
    for i in range(3):
        packets += traversal(interfaces, H1_TO_H2, T0 + 0.1 * i)
    path = sll2_capture(tmp_path / "fabric.pcap", packets)
    loads = linkload.analyse(path, interfaces, fabric, bw_factor=BW_FACTOR,
                             start=T0, end=T0 + 1.0)

    top = linkload.write_links_csv(loads, tmp_path / "run", top=2)

    with open(tmp_path / "run" / "links.csv") as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == linkload.LINK_COLUMNS
    assert len(rows) == 2 * fabric.graph.number_of_edges()
    row = next(r for r in rows if (r["src"], r["dst"]) == ("s1", "s3"))
    assert row["link"] == "s1-s3" and int(row["bytes"]) == 3 * FRAME
    assert float(row["utilisation"]) == pytest.approx(3 * FRAME * 8 / 1e6 / LINK_MBPS,
                                                      abs=1e-4)
    assert [(r["src"], r["dst"]) for r in top] == [("h1", "s1"), ("s3", "h2")]  # by name
    assert loads.link("s1", "s3").describe().startswith("s1->s3 (s1 port 3): ")


def test_interface_map_round_trip_and_dropped_packets_warn(tmp_path, fabric, interfaces):
    map_path = linkload.save_interface_map(tmp_path / "fabric.ifmap.json", interfaces,
                                           dropped_by_kernel=12)
    read, extra = linkload.load_interface_map(map_path)
    assert read == interfaces and extra["dropped_by_kernel"] == 12
    path = sll2_capture(tmp_path / "fabric.pcap", traversal(interfaces, H1_TO_H2, T0))
    loads = linkload.analyse(path, map_path, fabric)
    assert loads.link("s1", "s3").bytes == FRAME
    assert any("lost 12 packet(s)" in note for note in loads.warnings())
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not an interface map"):
        linkload.load_interface_map(tmp_path / "bad.json")


def test_capture_filter_keeps_one_copy_per_traversal(fabric, interfaces):
    bpf = linkload.capture_filter(interfaces, fabric)
    # The machine's own interfaces are out; outgoing everywhere else, and
    # incoming only on the 8 host-facing ports (as short as the 8 others).
    assert bpf.startswith("(tcp) and not (ifindex 1 or ifindex 2 or ifindex 3 or ifindex 4)")
    host_facing = sorted(
        index_of(interfaces, linkload.interface_name(fabric, *fabric.host_port(host)))
        for host in fabric.hosts)
    assert bpf.endswith("(outbound or (" + " or ".join(f"ifindex {i}" for i in host_facing)
                        + "))")
    missing = {i: n for i, n in interfaces.items() if n != "fes3-eth4"}
    with pytest.raises(ValueError, match="fes3-eth4"):
        linkload.capture_filter(missing, fabric)
    with pytest.raises(ValueError, match="host"):
        linkload.interface_name(fabric, "h1", 1)


def test_capture_filter_prefers_the_shorter_list():
    fabric = registry.build("hybrid")              # 4 host-facing, 8 switch-switch ports
    interfaces = dict(enumerate(sorted(linkload.switch_ports(fabric)), start=1))
    bpf = linkload.capture_filter(interfaces, fabric)
    assert bpf.count("ifindex") == 4 and "not" not in bpf
    fabric = registry.build("fattree,k=4")         # 16 host-facing, 32 switch-switch
    interfaces = dict(enumerate(sorted(linkload.switch_ports(fabric)), start=1))
    assert linkload.capture_filter(interfaces, fabric).count("ifindex") == 16


def test_capture_filter_of_a_spine_keeps_only_outgoing_packets():
    # A switch with no host port (ROFT's spines, captured in their own
    # namespace on the linux data plane): every port leads to another switch,
    # so only outgoing packets are kept, and the filter must still parse: an
    # empty "()" list of host ports made tcpdump refuse it.
    fabric = registry.build("roft,gpus=16,radix=8,gpus_per_server=2")
    spine = next(s for s in fabric.eps_switches
                 if not any(fabric.kind(p) == "host" for p in fabric.graph[s]))
    names = sorted(n for n, port in linkload.switch_ports(fabric).items() if port.node == spine)
    interfaces = {1: "lo", **{i: n for i, n in enumerate(names, start=2)}}
    bpf = linkload.capture_filter(interfaces, fabric, nodes=[spine])
    assert bpf == "(tcp) and not (ifindex 1) and (outbound)"
    assert "()" not in bpf


def test_fabric_capture_refuses_a_network_that_is_not_up(tmp_path, fabric):
    sysfs = tmp_path / "net"
    for index, name in ((1, "lo"), (7, "fes1-eth1")):
        (sysfs / name).mkdir(parents=True)
        (sysfs / name / "ifindex").write_text(f"{index}\n")
    assert root_interfaces(sysfs) == {1: "lo", 7: "fes1-eth1"}
    with pytest.raises(CaptureError, match="network is up"):
        FabricCapture(fabric, sys_class_net=sysfs).start(tmp_path / "captures")
    with pytest.raises(CaptureError, match="letters"):
        FabricCapture(fabric, name="a b", sys_class_net=sysfs).start(tmp_path / "captures")


def test_tcpdump_counts_are_parsed():
    lines = ["tcpdump: listening on any, link-type LINUX_SLL2", "1 packet captured",
             "16 packets received by filter", "0 packets dropped by kernel"]
    assert tcpdump_counts(lines) == {"captured": 1, "received_by_filter": 16,
                                     "dropped_by_kernel": 0}


LOOPBACK_SAMPLE = """
TTyyoQIABAAAAAAAAAAAAIAAAAAUAQAAy1wCa3C7gS9QAAAAUAAAAAgAAAAAAAABAwQABgAAAAAA
AAAARQAAPAr1QABABjHFfwAAAX8AAAHKMLgT12v5sQAAAACgAqqq/jAAAAIE/9cEAggKoKFDKAAA
AAABAwMJy1wCa30Xgi9QAAAAUAAAAAgAAAAAAAABAwQABgAAAAAAAAAARQAAPAAAQABABjy6fwAA
AX8AAAG4E8owyKWF6tdr+bKgEqqq/jAAAAIE/9cEAggK+avr5aChQygBAwMJy1wCazxngi9IAAAA
SAAAAAgAAAAAAAABAwQABgAAAAAAAAAARQAANAr2QABABjHMfwAAAX8AAAHKMLgT12v5ssilheuA
EABW/igAAAEBCAqgoUMp+avr5ctcAmvjT4QvgAAAAAAMAAAIAAAAAAAAAQMEAAYAAAAAAAAAAEUA
C+wK90AAQAYmE38AAAF/AAAByjC4E9dr+bLIpYXrgBgAVgnhAAABAQgKoKFDKfmr6+V4eHh4eHh4
eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eMtcAmuccoQv
SAAAAEgAAAAIAAAAAAAAAQMEAAYAAAAAAAAAAEUAADRYt0AAQAbkCn8AAAF/AAABuBPKMMilhevX
bAVqgBAAgP4oAAABAQgK+avr5aChQynLXAJrbcCEL0gAAABIAAAACAAAAAAAAAEDBAAGAAAAAAAA
AABFAAA0CvhAAEAGMcp/AAABfwAAAcowuBPXbAVqyKWF64ARAFb+KAAAAQEICqChQyn5q+vly1wC
a/jAhS9IAAAASAAAAAgAAAAAAAABAwQABgAAAAAAAAAARQAANFi4QABABuQJfwAAAX8AAAG4E8ow
yKWF69dsBWuAEQCA/igAAAEBCAr5q+vloKFDKctcAmveDIYvSAAAAEgAAAAIAAAAAAAAAQMEAAYA
AAAAAAAAAEUAADQK+UAAQAYxyX8AAAF/AAAByjC4E9dsBWvIpYXsgBAAVv4oAAABAQgKoKFDKfmr
6+U=
"""


def test_one_capture_per_switch_namespace_gives_the_same_loads(tmp_path, fabric, interfaces):
    """The kernel data plane: each switch is a namespace with its own interface
    numbering; the per-namespace captures merge by interface name."""
    packets = traversal(interfaces, H1_TO_H2, T0) + traversal(interfaces, H3_TO_H4, T0 + 0.1)
    whole = linkload.analyse(sll2_capture(tmp_path / "all.pcap", packets), interfaces, fabric,
                             bw_factor=1e-3)
    by_name = {name: index for index, name in interfaces.items()}
    parts = []
    for switch in ("s1", "s3", "s4"):
        names = sorted(n for n in by_name if n.startswith(f"fe{switch}-"))
        local = {2 + i: name for i, name in enumerate(names)}      # renumbered per namespace
        local[1] = "lo"
        to_local = {by_name[name]: index for index, name in local.items() if name in by_name}
        mine = [(ts, to_local[ifindex], kind, length) for ts, ifindex, kind, length in packets
                if ifindex in to_local]
        path = sll2_capture(tmp_path / f"{switch}.pcap", mine)
        parts.append((path, linkload.save_interface_map(tmp_path / f"{switch}.json", local,
                                                        dropped_by_kernel=1)))
    merged = linkload.analyse_parts(parts, fabric, bw_factor=1e-3)
    assert [(l.src, l.dst, l.bytes, l.packets) for l in merged.links] == \
        [(l.src, l.dst, l.bytes, l.packets) for l in whole.links]
    assert merged.duplicates == whole.duplicates and merged.dropped_by_kernel == 3
    filters = linkload.capture_filter({i: n for n, i in by_name.items()
                                       if n.startswith("fes1-")}, fabric, nodes=["s1"])
    assert "outbound" in filters
    with pytest.raises(ValueError, match="not interfaces of this namespace"):
        linkload.capture_filter({1: "lo"}, fabric, nodes=["s1"])
    with pytest.raises(ValueError, match="no capture"):
        linkload.analyse_parts([], fabric)


def test_a_capture_from_another_server_is_put_on_the_runs_clock(tmp_path, fabric, interfaces):
    # Cluster mode: a server whose clock is 2 s ahead captured the same
    # traversals 2 s "later"; its interface map carries that offset.
    local = sll2_capture(tmp_path / "here.pcap", traversal(interfaces, H1_TO_H2, T0 + 0.1))
    remote = sll2_capture(tmp_path / "there.pcap",
                          traversal(interfaces, H1_TO_H2, T0 + 2.0 + 1.3))
    here = linkload.save_interface_map(tmp_path / "here.ifmap.json", interfaces)
    there = linkload.save_interface_map(tmp_path / "there.ifmap.json", interfaces,
                                        clock_offset_s=2.0)
    loads = linkload.analyse_parts([(local, here), (remote, there)], fabric,
                                   bw_factor=BW_FACTOR, bin_s=1.0, start=T0, end=T0 + 3.0)
    mbit = FRAME * 8 / 1e6
    assert loads.link("s1", "s3").series == pytest.approx([mbit, mbit, 0.0])
    assert loads.outside == 0
