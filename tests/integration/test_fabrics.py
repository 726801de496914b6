"""Every fabric of the library, materialised in Mininet at emulated scale, on both data planes.

For each: all pairs reach each other, the forwarding state installed in the
data plane (OVS select groups, or the kernel's multipath routes) holds the
ECMP next hops the fabric computes, and a ping stream between two far-apart
hosts leaves only by ports on the computed shortest paths.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import networkx as nx
import pytest

from controllers.control import ControlClient
from emu.experiments.base import host_gbps
from emu.experiments.lab import connected_host_sets
from traffic.scale import Scale
from emu.live.replay import Replayer
from emu.live.testbed import Testbed
from emu.live.waiting import WaitTimeout, wait_until
from tests.integration.utils import assert_no_leftovers
from topologies import registry, routing
from topologies.fabric import EPS, HOST, OCS
from traffic.flows import Flow, FlowDag
from traffic.ports import multipath_hash_seed

pytestmark = pytest.mark.require_root

FABRICS = sorted(registry.names())
PINGS = 200


def installed_routes(bed, switch: str):
    """destination host -> output ports, as the data plane itself holds them: OVS's
    select and indirect groups (group id = host index), or the kernel's routes."""
    fabric = bed.fabric
    if bed.dataplane.kind == "ovs":
        out = bed.net.get("fe" + switch).cmd(
            f"ovs-ofctl --no-names -O OpenFlow13 dump-groups fe{switch}")
        by_index = {fabric.graph.nodes[h]["index"]: h for h in fabric.hosts}
        routes = {}
        for line in out.splitlines():
            match = re.search(r"group_id=(\d+),type=(?:select|indirect)(.*)", line)
            if match:
                routes[by_index[int(match.group(1))]] = tuple(sorted(
                    int(p) for p in re.findall(r"actions=output:(\d+)", match.group(2))))
        return routes
    pid = bed.net.get("fe" + switch).pid
    out = subprocess.run(["mnexec", "-a", str(pid), "ip", "-json", "route", "show"],
                         capture_output=True, text=True, check=True).stdout
    by_ip = {fabric.graph.nodes[h]["ip"]: h for h in fabric.hosts}
    routes = {}
    for route in json.loads(out):
        hops = route.get("nexthops") or ([route] if "dev" in route else [])
        routes[by_ip[route["dst"]]] = tuple(sorted(int(hop["dev"].rsplit("-eth", 1)[1])
                                                   for hop in hops))
    return routes


def port_tx(bed, switch: str, counter: str = "tx_packets"):
    """Packets (or ``counter``) sent per port of a switch, from the controller's counters."""
    return {port: values[counter] for port, values in bed.counters()[switch].items()}


def shortest_paths(fabric, src, dst):
    logical = routing.base_graph(fabric)
    transit = bool(fabric.params.get("transit_hosts"))
    allowed = logical if transit else logical.subgraph(
        n for n, d in logical.nodes(data=True) if d["kind"] != HOST or n in (src, dst))
    return logical, list(nx.all_shortest_paths(allowed, src, dst))


def expected_out_ports(fabric, src, dst):
    """(switch, port) pairs a packet src -> dst may leave by on a shortest path."""
    logical, paths = shortest_paths(fabric, src, dst)
    allowed = set()
    for path in paths:
        for u, v in zip(path, path[1:]):
            for data in logical[u][v].values():
                if fabric.kind(u) == EPS:
                    allowed.add((u, data["ports"][u]))
                if "ocs" in data:  # a circuit: the OCS sends it out of the far port
                    a, b = data["circuit"]
                    wired = fabric.ports_of(data["ocs"])
                    far = a if wired[a][0] == v and wired[a][1] == data["ports"][v] else b
                    allowed.add((data["ocs"], far))
    return allowed, paths


def far_apart_pair(fabric):
    logical = routing.base_graph(fabric)
    src = fabric.hosts[0]
    lengths = nx.single_source_shortest_path_length(logical, src)
    dst = max((h for h in fabric.hosts if h != src and h in lengths), key=lambda h: lengths[h])
    return src, dst


@pytest.mark.parametrize("name", FABRICS)
def test_fabric_reachability_and_routes(name, tmp_path, dataplane):
    fabric = registry.build(name)
    scale = Scale.from_rates(host_gbps(fabric), 20)
    with Testbed(fabric, scale, tmp_path / "run", log=lambda m: None,
                 dataplane=dataplane) as bed:
        # Some fabrics are several networks on purpose (HPN's two planes):
        # every pair the fabric connects must reach, pair by pair.
        for component in connected_host_sets(fabric):
            loss = bed.net.ping([bed.net.get(h) for h in component], timeout=2)
            assert loss == 0, f"{name}: ping among {component[0]}..{component[-1]} lost {loss}%"

        table = routing.next_hops(routing.base_graph(fabric),
                                  transit_hosts=bool(fabric.params.get("transit_hosts")))
        for switch in fabric.eps_switches:
            routes = installed_routes(bed, switch)
            for host in fabric.hosts:
                assert routes.get(host, ()) == table[switch].get(host, ()), \
                    f"{name}: {switch} -> {host}: the {dataplane} data plane has " \
                    f"{routes.get(host)}, fabric computes {table[switch].get(host)}"

        src, dst = far_apart_pair(fabric)
        forward, paths = expected_out_ports(fabric, src, dst)
        backward, _ = expected_out_ports(fabric, dst, src)
        switches = fabric.eps_switches + fabric.ocs_switches
        before = {s: port_tx(bed, s) for s in switches}
        target = fabric.graph.nodes[dst]["ip"]
        out = bed.host(src).cmd(f"ping -c {PINGS} -i 0.005 -q {target}")
        received = int(re.search(r"(\d+) received", out).group(1)) if "received" in out else 0
        # A ping or two may drop on a loaded 2-core machine; the route check needs the rest.
        assert received >= PINGS * 0.95, f"{name}: {src} -> {dst}:\n{out}"
        after = {s: port_tx(bed, s) for s in switches}
        # The path the data plane says one flow takes is one of the computed ones
        # (the kernel's multipath hash; OVS's select groups cannot tell).
        told = bed.control.call("paths", flows=[[src, dst, 5201, 40000]])["paths"][0]
        if dataplane == "ovs" or len(fabric.graph.edges(src)) > 1:
            assert told is None, told
        else:
            # Computed paths are logical: a lit circuit is one edge, its OCS left out.
            logical = told and [n for n in told if fabric.kind(n) != OCS]
            assert logical in paths or told is None and fabric.params.get("transit_hosts"), \
                f"{name}: the kernel's path {told} is not among {paths}"
    busy = {(s, p) for s in switches for p, n in after[s].items()
            if n - before[s].get(p, 0) >= PINGS * 0.85}
    stray = busy - forward - backward
    assert not stray, f"{name}: traffic {src} <-> {dst} left by {sorted(stray)}, " \
                      f"off the computed paths {paths}"
    hops_on_paths = {(s, p) for s, p in forward if fabric.kind(s) in (EPS, OCS)}
    assert not hops_on_paths or busy & hops_on_paths, \
        f"{name}: no computed hop carried the pings {src} -> {dst}: {paths}"
    assert_no_leftovers()


def _busiest_port(bed, switch, flow, work_dir):
    """Replay ``flow`` alone; its result and the port of ``switch`` that sent most.

    Most bytes, not packets: a kernel router forwards a flow's data as GSO
    packets of up to 64 KB, each counted once, so the ACKs sent back to the
    source can outnumber the data packets on the way out."""
    before = port_tx(bed, switch, "tx_bytes")
    result = Replayer(bed, FlowDag([flow]), 20.0, work_dir).run()[0]
    after = port_tx(bed, switch, "tx_bytes")
    assert result.status == "ok", result
    return result, max(after, key=lambda port: after[port] - before.get(port, 0))


def _four_path_pair(fabric):
    # h11 sits on A_1 and h19 on A_2: four equal paths, one through each B switch.
    src, dst = "h11", "h19"
    assert len(shortest_paths(fabric, src, dst)[1]) == 4
    return src, dst, next(s for s in fabric.graph.neighbors(src))


def test_each_tcp_flow_takes_the_path_the_kernel_reports_for_its_ports(tmp_path):
    """Kernel routers hash a forwarded flow's five-tuple, so the path reported
    for a flow (and its shared links, and the fidelity check) is the one its
    packets took; a hash carried from the sending socket would pick at random.
    The routers hash with the key drawn from the ECMP seed."""
    fabric = registry.build("zcube,n=4,gpus_per_server=2")
    scale = Scale.from_rates(host_gbps(fabric), 20.0, tdf=1.0)
    src, dst, first_hop = _four_path_pair(fabric)
    with Testbed(fabric, scale, tmp_path / "run", log=lambda m: None,
                 dataplane="linux", ecmp_seed=3) as bed:
        key = bed.net.get("fe" + first_hop).cmd(
            "sysctl -n net.ipv4.fib_multipath_hash_seed").strip()
        assert key == str(multipath_hash_seed(3)) == str(bed.describe()["multipath_hash_seed"])
        seen = set()
        for number in range(8):
            result, busiest = _busiest_port(bed, first_hop, Flow(f"f{number}", src, dst, 300_000),
                                            tmp_path / f"flow{number}")
            paths, ports = bed.flow_paths([result])
            path, told_ports = paths[0], ports[0]
            hop = path.index(first_hop)
            assert told_ports[hop] == busiest, \
                f"flow {result.sport}->{result.dport}: told {path}, sent out of port {busiest}"
            seen.add(path[hop + 1])
        assert len(seen) > 1, "eight flows should not all hash onto one of four paths"
    assert_no_leftovers()


def test_a_seed_sends_a_flow_down_the_same_path_every_time(tmp_path, dataplane):
    """With one ECMP seed a flow has the same ports, hence leaves by the same
    port of a switch with four equal paths, in every replay, on both data
    planes (Open vSwitch's select groups hash with a fixed key)."""
    fabric = registry.build("zcube,n=4,gpus_per_server=2")
    scale = Scale.from_rates(host_gbps(fabric), 20.0, tdf=1.0)
    src, dst, first_hop = _four_path_pair(fabric)
    with Testbed(fabric, scale, tmp_path / "run", log=lambda m: None,
                 dataplane=dataplane, ecmp_seed=3) as bed:
        taken = {}
        for number in range(6):
            name = f"f{number % 3}"      # f0, f1, f2, then each once more
            result, busiest = _busiest_port(bed, first_hop, Flow(name, src, dst, 300_000),
                                            tmp_path / f"flow{number}")
            taken.setdefault(name, []).append((result.sport, result.dport, busiest))
        for name, (first, again) in taken.items():
            assert first == again, f"{dataplane}: {name} took {first}, then {again}"
    assert_no_leftovers()


def test_the_kernel_controller_reroutes_without_opening_anything_new(tmp_path):
    """A failure is rerouted on the link-event thread and counters are read on
    a control connection's thread; pyroute2 opens a netlink socket (and an
    event loop) per calling thread unless every call goes through one
    thread, so the first failure would open one per namespace, late."""
    fabric = registry.build("roft,gpus=16,radix=8,gpus_per_server=2")
    scale = Scale.from_rates(host_gbps(fabric), 20.0, tdf=1.0)
    leaf = next(n for n in fabric.graph.neighbors("h1"))
    with Testbed(fabric, scale, tmp_path / "run", log=lambda m: None,
                 dataplane="linux") as bed:
        def descriptors():
            return len(os.listdir(f"/proc/{bed.controller.pid}/fd"))

        opened = descriptors()
        bed.fail_switch(leaf)
        down = installed_routes(bed, next(s for s in fabric.eps_switches if s != leaf))
        bed.fail_switch(leaf, up=True)
        other = ControlClient(bed.socket_path)
        try:
            assert other.call("counters")["switches"]
        finally:
            other.close()
        # The control connection just closed is closed on the controller's
        # side once its reader sees the end of stream: wait for that, briefly.
        try:
            wait_until(lambda: descriptors() == opened, 5.0, "the controller's descriptors")
        except WaitTimeout:
            raise AssertionError(f"the controller opened descriptors to reroute or to serve a "
                                 f"connection: {opened} before, {descriptors()} after") from None
        assert down.get("h1", ()) == (), f"h1 is behind the failed {leaf}: {down.get('h1')}"
    assert_no_leftovers()
