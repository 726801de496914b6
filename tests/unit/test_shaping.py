"""Link shaping as batches: which interfaces are shaped, and the tc objects each gets."""

from __future__ import annotations

import pytest

from emu.live import shaping
from topologies import registry
from topologies.naming import interface


def nodes_of(fabric):
    """(namespace, fabric node, interfaces) as the testbed lists Mininet's nodes."""
    return [(index, node, [interface(fabric, node, port) for port in fabric.ports_of(node)])
            for index, node in enumerate(fabric.hosts + fabric.switches)]


@pytest.mark.parametrize("dataplane", ["ovs", "linux"])
def test_every_sending_end_is_shaped_once_and_ocs_ports_hold_no_queue_on_linux(dataplane):
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1,uplinks=2")
    batches = shaping.namespace_batches(nodes_of(fabric), fabric, bw_factor=1e-4,
                                        dataplane=dataplane, queue_packets=41, mtu=1500)
    roots = {line.split()[3]: namespace for namespace, batch in batches.items()
             for line in batch["tc"] if " root " in line}
    ocs_ports = {interface(fabric, "o1", port) for port in fabric.ports_of("o1")}
    expected = {interface(fabric, node, data["ports"][node])
                for u, v, data in fabric.links() for node in (u, v)}
    if dataplane == "linux":
        expected -= ocs_ports
    assert set(roots) == expected, "one HTB root per sending end"
    for namespace, batch in batches.items():
        assert len(batch["ip"]) == len(nodes_of(fabric)[namespace][2])
        assert all(line.endswith(" mtu 1500") for line in batch["ip"])
    gbps = next(data["gbps"] for u, v, data in fabric.links() if "h1" in (u, v))
    host_link = next(line for line in batches[0]["tc"] if "classid 5:1 " in line)
    assert f"rate {gbps * 1000 * 1e-4:g}mbit" in host_link, "emulated = real x bw_factor"


def test_a_link_holds_a_signalling_queue_and_a_data_queue_within_its_rate():
    lines = shaping.tc_lines("fes1-eth1", 10.0, 41)
    assert lines[0] == "qdisc replace dev fes1-eth1 root handle 5: htb default 20", \
        "unclassified packets (UDP probes, ICMP) join the data queue"
    signalling, data = (next(line for line in lines if f"classid {c} " in line)
                        for c in ("5:10", "5:20"))
    assert "rate 0.5mbit ceil 10mbit" in signalling and "prio 0" in signalling
    assert "rate 9.5mbit ceil 10mbit" in data and "prio 1" in data
    assert sum("pfifo limit 41" in line for line in lines) == 2
    filters = [line for line in lines if line.startswith("filter")]
    priorities = [f.split(" prio ")[1].split()[0] for f in filters]
    assert priorities == ["1"] * len(shaping.TCP_DATA_OFFSETS) + ["2", "3"], \
        "payload-less TCP first, then the data DSCP, then any other TCP"
    assert f"match ip tos {shaping.DATA_TOS:#04x} 0xfc flowid 5:20" in filters[-2]
    assert filters[-1].endswith("match ip protocol 6 0xff flowid 5:10")


# ------------------------------------------------------------ what the filters take
def u32_matches(line: str):
    """(offset, size in bytes, value, mask) of every key of a u32 filter line,
    read the way tc reads them (``ip protocol`` is byte 9, ``ip tos`` byte 1)."""
    words, keys = line.split(), []
    for i, word in enumerate(words):
        if word != "match":
            continue
        kind = words[i + 1]
        if kind == "ip":
            field, value, mask = words[i + 2:i + 5]
            keys.append(({"protocol": 9, "tos": 1}[field], 1, int(value, 0), int(mask, 0)))
        else:
            value, mask, at, offset = words[i + 2:i + 6]
            assert at == "at"
            keys.append((int(offset), {"u8": 1, "u16": 2}[kind], int(value, 0), int(mask, 0)))
    return keys


def classify(lines, packet: bytes) -> str:
    """The class a packet joins: the first filter, in priority order, whose keys
    all match; the HTB default (5:20) if none does."""
    filters = sorted((line for line in lines if line.startswith("filter")),
                     key=lambda line: int(line.split(" prio ")[1].split()[0]))
    for line in filters:
        if all(int.from_bytes(packet[off:off + size], "big") & mask == value & mask
               for off, size, value, mask in u32_matches(line)):
            return line.split("flowid ")[1].split()[0]
    return "5:20"


def tcp_packet(payload: int, option_words: int = 3, tos: int = 0) -> bytes:
    """An IPv4 packet without options carrying a TCP header of ``5 + option_words``
    words (3: timestamps, as Linux sends) and ``payload`` bytes."""
    words = 5 + option_words
    total = 20 + 4 * words + payload
    ip = bytes([0x45, tos]) + total.to_bytes(2, "big") + bytes(5) + bytes([6]) + bytes(10)
    tcp = bytes(12) + bytes([words << 4, 0x10]) + bytes(4 * words - 14)
    return ip + tcp + bytes(payload)


@pytest.mark.parametrize("option_words", range(0, 11))
def test_every_payload_less_segment_rides_the_signalling_class(option_words):
    lines = shaping.tc_lines("h1-eth0", 10.0, 41)
    for tos in (0, shaping.DATA_TOS):     # a data stream's own acknowledgements too
        assert classify(lines, tcp_packet(0, option_words, tos)) == "5:10", \
            f"a bare TCP header of {5 + option_words} words, tos {tos:#x}"


@pytest.mark.parametrize("payload", [1, 37, 75, 76, 1448])
def test_a_data_streams_segment_joins_its_data_queue_however_small(payload):
    """A bounded window often ends on a short segment (37 bytes on iperf3's
    data stream, after its cookie): sent ahead of the full ones queued before
    it, the receiver would see the flow out of order."""
    lines = shaping.tc_lines("h1-eth0", 10.0, 41)
    assert classify(lines, tcp_packet(payload, tos=shaping.DATA_TOS)) == "5:20"
    assert classify(lines, tcp_packet(payload, tos=0)) == "5:10", \
        "other TCP (iperf3's control connections) is signalling"


def test_what_is_not_tcp_joins_the_data_queue():
    lines = shaping.tc_lines("h1-eth0", 10.0, 41)
    udp = bytearray(tcp_packet(0))
    udp[9] = 17
    assert classify(lines, bytes(udp)) == "5:20"


def _fake_tool(tmp_path, monkeypatch):
    """A stand-in for ``ip``: logs when it has read its lines, the lines, and its
    end; a line 'fail' fails."""
    tool = tmp_path / "bin" / "fake-ip"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n"
                    "[ \"$1\" = -batch ] && [ -f \"$2\" ] || exit 9\n"
                    "lines=$(cat \"$2\")\n"
                    "log=$(mktemp -p " + str(tmp_path) + " run.XXXXXX)\n"
                    "date +%s.%N > \"$log\"\n"
                    "sleep 0.3\n"
                    "printf '%s\\n' \"$lines\" >> \"$log\"\n"
                    "date +%s.%N >> \"$log\"\n"
                    "case \"$lines\" in *fail*) echo 'Error: it failed' >&2; exit 1;; esac\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{__import__('os').environ['PATH']}")
    return tool.name


def test_batches_of_several_namespaces_run_at_once(tmp_path, monkeypatch):
    tool = _fake_tool(tmp_path, monkeypatch)
    monkeypatch.setattr(shaping, "_namespace_command", lambda pid, command: command)
    shaping.run_batches(tool, {1: ["link set dev a down"], 2: ["link set dev b down",
                                                               "link set dev c down"],
                               3: []}, "take links down")
    runs = [path.read_text().split("\n") for path in sorted(tmp_path.glob("run.*"))]
    assert len(runs) == 2, "one process per namespace with lines, none for an empty one"
    assert sorted(run[1:-2] for run in runs) == [["link set dev a down"],
                                                 ["link set dev b down", "link set dev c down"]]
    starts = [float(run[0]) for run in runs]
    ends = [float(run[-2]) for run in runs]
    assert max(starts) < min(ends), "the namespaces' batches overlap in time"


def test_a_failed_batch_names_what_and_where(tmp_path, monkeypatch):
    tool = _fake_tool(tmp_path, monkeypatch)
    with pytest.raises(shaping.BatchError,
                       match=r"take links down: the root namespace: fake-ip -batch failed "
                             r"\(1\): Error: it failed"):
        shaping.run_batches(tool, {None: ["fail"]}, "take links down")
