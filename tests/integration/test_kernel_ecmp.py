"""The model's copy of the kernel's multipath choice (`traffic.model.kernel_ecmp`)
against this machine's kernel: first one router in a namespace, asked for
random five-tuples; then whole fabrics on the ``linux`` data plane, where the
model's path for a flow's ports must be the path the kernel routers report."""

from __future__ import annotations

import random
import subprocess
import uuid

import pytest

from emu.experiments.base import host_gbps
from emu.live.testbed import Testbed
from tests.integration.utils import assert_no_leftovers
from topologies import registry
from traffic import ports
from traffic.flows import Flow, FlowDag
from traffic.model.kernel_ecmp import KernelFlowKeys, hash_threshold, multipath_hashes
from traffic.model.network import ModelNetwork
from traffic.results import FlowResult
from traffic.scale import Scale

pytestmark = [pytest.mark.require_root,
              pytest.mark.skipif(not ports.MULTIPATH_SEED_SYSCTL.exists(),
                                 reason="this kernel has no settable multipath hash key")]


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def router():
    """A namespace with an input port and six output ports (veths into a
    second namespace), routing like a testbed's kernel routers."""
    tag = uuid.uuid4().hex[:6]
    ns, peer = f"mpr{tag}", f"mpo{tag}"
    _ip("netns", "add", ns)
    _ip("netns", "add", peer)
    try:
        for port in ["in"] + [str(i) for i in range(1, 7)]:
            _ip("link", "add", f"r{tag}{port}", "netns", ns, "type", "veth",
                "peer", "name", f"o{tag}{port}", "netns", peer)
            _ip("-n", ns, "link", "set", f"r{tag}{port}", "up")
            _ip("-n", peer, "link", "set", f"o{tag}{port}", "up")
        _ip("-n", ns, "addr", "add", "10.1.1.254/24", "dev", f"r{tag}in")
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1",
                        "net.ipv4.fib_multipath_hash_policy=3",
                        "net.ipv4.fib_multipath_hash_fields=0x37",
                        "net.ipv4.conf.all.rp_filter=0"], check=True)
        yield ns, tag
    finally:
        _ip("netns", "del", ns)
        _ip("netns", "del", peer)


@pytest.mark.parametrize("seed, width", [(12345, 3), (99, 4), (7, 2), (4242, 6),
                                         (3_000_000_000, 5)])
def test_the_model_picks_the_next_hop_the_kernel_picks(router, seed, width):
    ns, tag = router
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                    f"net.ipv4.fib_multipath_hash_seed={seed}"], check=True)
    hops = []
    for i in range(1, width + 1):
        hops += ["nexthop", "via", "100.64.0.1", "dev", f"r{tag}{i}", "onlink"]
    _ip("-n", ns, "route", "add", "10.2.0.0/16", *hops)
    rng = random.Random(seed)
    cases = [(f"10.1.1.{rng.randint(1, 250)}", f"10.2.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
              rng.randint(1, 65535), rng.randint(1, 65535)) for _ in range(40)]
    hashes = multipath_hashes(*zip(*cases), seed)
    for (src, dst, sport, dport), value in zip(cases, hashes):
        told = _ip("-n", ns, "route", "get", dst, "from", src, "iif", f"r{tag}in", "ipproto",
                   "tcp", "sport", str(sport), "dport", str(dport))
        port = int(told.split(f" dev r{tag}")[1].split()[0])
        assert port - 1 == hash_threshold(value, width), \
            f"{src}:{sport} -> {dst}:{dport}, seed {seed}: kernel {port - 1}"


def _modelled(fabric, flows: int = 48):
    """Random flows of ``fabric``, their kernel keys and modelled paths."""
    rng = random.Random(5)
    dag = FlowDag([Flow(f"f{i}", *rng.sample(fabric.hosts, 2), 1000) for i in range(flows)])
    hashes = KernelFlowKeys(fabric, 1).keys("i1/check/", dag)
    net = ModelNetwork(fabric, kernel_multipath=True)
    indptr, links = net.paths([f.src for f in dag.flows], [f.dst for f in dag.flows], hashes)
    return dag, net, [links[indptr[i]:indptr[i + 1]] for i in range(len(dag.flows))]


@pytest.mark.parametrize("spec", ["fattree,k=4", "fattree-os,gpus=16,radix=8,gpus_per_server=2",
                                  "roft,gpus=16,radix=8,gpus_per_server=2",
                                  "zcube,n=4,gpus_per_server=2", "rfabric,pods=2,train_pods=1"])
def test_a_flows_modelled_path_is_the_one_the_kernel_routers_report(spec, tmp_path):
    """Ports taken as the replayers take them, hashed as the kernel hashes,
    picked in each route's port order: the same nodes, hop by hop."""
    fabric = registry.build(spec)
    dag, net, paths = _modelled(fabric)
    # The same ports again from a book of the same seed, as the data's
    # (source, destination) ports: the server on the flow's source sends.
    book = ports.PortBook(1)
    results = [FlowResult(f.id, f.src, f.dst, 1000, None, "", status="ok",
                          sport=book.server(f.src, "i1/check/" + f.id),
                          dport=book.client(f.dst, "i1/check/" + f.id)) for f in dag.flows]
    scale = Scale.from_rates(host_gbps(fabric), 20.0, tdf=1.0)
    with Testbed(fabric, scale, tmp_path / "run", log=lambda m: None,
                 dataplane="linux", ecmp_seed=1) as bed:
        told, _ = bed.flow_paths(results)
    differ = []
    for i, flow in enumerate(dag.flows):
        hops = paths[i]
        modelled = [net.names[net.link_src[hops[0]]]] + [net.names[net.link_dst[l]] for l in hops]
        if told[i] != modelled:
            differ.append(f"{flow.src}->{flow.dst}: kernel {told[i]}, model {modelled}")
    assert not differ, "\n".join(differ[:5])
    assert_no_leftovers()


def test_forwarding_gpus_send_a_flow_where_the_model_does(tmp_path):
    """SiP-OCS: the GPUs route (kernel policy 0, the addresses alone), and each
    one on a modelled path, the sender included, sends the flow out of the
    port the model says."""
    fabric = registry.build("sip-ocs,gpus=16")
    dag, net, paths = _modelled(fabric)
    scale = Scale.from_rates(host_gbps(fabric), 20.0, tdf=1.0)
    differ, asked = [], 0
    book = ports.PortBook(1)
    with Testbed(fabric, scale, tmp_path / "run", log=lambda m: None,
                 dataplane="linux", ecmp_seed=1) as bed:
        for flow, hops in zip(dag.flows, paths):
            sport = book.server(flow.src, "i1/check/" + flow.id)
            dport = book.client(flow.dst, "i1/check/" + flow.id)
            src_ip, dst_ip = (fabric.graph.nodes[h]["ip"] for h in (flow.src, flow.dst))
            came_in = None
            for link in hops:
                node = net.names[net.link_src[link]]
                if node in fabric.hosts and node != flow.dst:
                    where = ["iif", f"{node}-eth{came_in}"] if came_in is not None else []
                    told = bed.host(node).cmd(
                        f"ip route get {dst_ip} from {src_ip} {' '.join(where)} ipproto tcp "
                        f"sport {sport} dport {dport}")
                    port = int(told.split(f" dev {node}-eth")[1].split()[0])
                    asked += 1
                    if port != net.link_port[link]:
                        differ.append(f"{flow.src}->{flow.dst} at {node}: kernel port {port}, "
                                      f"model {net.link_port[link]}")
                if net.link_dst[link] >= 0 and net.names[net.link_dst[link]] in fabric.hosts:
                    came_in = _port_into(fabric, net, link)
    assert asked >= len(dag.flows)
    assert not differ, "\n".join(differ[:5])
    assert_no_leftovers()


def _port_into(fabric, net, link: int) -> int:
    """The port by which ``link`` enters the node it leads to."""
    a, b = net.names[net.link_src[link]], net.names[net.link_dst[link]]
    return next(data["ports"][b] for _, _, data in fabric.graph.edges(a, data=True)
                if b in data["ports"] and data["ports"][a] == net.link_port[link])
