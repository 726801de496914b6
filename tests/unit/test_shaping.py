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
    assert [f.split(" prio ")[1].split()[0] for f in filters] == ["1", "2", "3"], \
        "small TCP first, then the data DSCP, then any other TCP"
    assert "match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 5:10" in filters[0]
    assert f"match ip tos {shaping.DATA_TOS:#04x} 0xfc flowid 5:20" in filters[1]
    assert filters[2].endswith("match ip protocol 6 0xff flowid 5:10")


def test_small_means_an_ip_packet_under_128_bytes():
    mask = 0xff80
    assert all(length & mask == 0 for length in (40, 52, 127))
    assert all(length & mask for length in (128, 576, 1500))


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
