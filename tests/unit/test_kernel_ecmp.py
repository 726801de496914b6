"""The kernel's multipath choice as the model computes it (`traffic.model.kernel_ecmp`).

The expected next hops were answered by this machine's kernel (6.18) in a
namespace (``ip route get ... iif IF ipproto tcp sport S dport D``, the
routers' policy 3 over fields 0x37, and policy 0, a forwarding host's);
`tests/integration/test_kernel_ecmp.py` asks it again on every run.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from emu.experiments.base import model_kernel_keys
from topologies import registry, routing
from topologies.fabric import EPS
from traffic.flows import Flow, FlowDag
from traffic.model.kernel_ecmp import (KernelFlowKeys, address_hashes, hash_threshold,
                                       multipath_hashes, siphash_words)
from traffic.model.network import ModelNetwork
from traffic.ports import MULTIPATH_SEED_SYSCTL, PortBook, multipath_hash_seed

KEY0 = int.from_bytes(bytes(range(8)), "little")
KEY1 = int.from_bytes(bytes(range(8, 16)), "little")


@pytest.mark.parametrize("length, expected", [(0, 0x726FDB47DD0E0E31),
                                              (8, 0x93F5F5799A932462),
                                              (16, 0x3F2ACC7F57C29BDB)])
def test_siphash_matches_the_reference_vectors(length, expected):
    """SipHash-2-4's published vectors: key 00..0f, message 00..(length-1)."""
    words = np.frombuffer(bytes(range(length)), dtype="<u8").astype(np.uint64)
    assert int(siphash_words(words, np.uint64(KEY0), np.uint64(KEY1))) == expected


# (hash key, next hops, src, dst, sport, dport) -> (hash, the kernel's pick)
ROUTER_CASES = [
    (12345, 3, "10.1.1.107", "10.2.5.210", 54081, 52616, 1063090890, 1),
    (99, 4, "10.1.1.104", "10.2.194.52", 39285, 11718, 86902810, 0),
    (7, 2, "10.1.1.83", "10.2.77.102", 42660, 3165, 607057263, 0),
    (4242, 6, "10.1.1.221", "10.2.212.34", 1865, 40409, 453843441, 1),
    (3_000_000_000, 5, "10.1.1.219", "10.2.197.213", 27236, 26428, 1723804945, 4),
]


@pytest.mark.parametrize("seed, width, src, dst, sport, dport, value, pick", ROUTER_CASES)
def test_a_routers_hash_and_pick_are_the_kernels(seed, width, src, dst, sport, dport,
                                                 value, pick):
    hashed = multipath_hashes([src], [dst], [sport], [dport], seed)[0]
    assert int(hashed) == value
    assert hash_threshold(hashed, width) == pick


@pytest.mark.parametrize("src, dst, value, pick", [
    ("10.1.1.119", "10.2.191.69", 96473401, 0),
    ("10.1.1.174", "10.2.3.87", 1772129669, 2),
    ("10.1.1.129", "10.2.237.230", 1264594456, 1)])
def test_a_forwarding_hosts_hash_is_the_kernels_over_the_addresses(src, dst, value, pick):
    hashed = address_hashes([src], [dst], 4242)[0]
    assert int(hashed) == value
    assert hash_threshold(hashed, 3) == pick


def test_both_directions_of_a_flow_hash_alike():
    """The kernel sorts addresses and ports before hashing (one hash per
    connection): the model must too, or data and acknowledgements part."""
    forward = multipath_hashes(["10.0.0.9"], ["10.0.0.2"], [5300], [20100], 77)
    backward = multipath_hashes(["10.0.0.2"], ["10.0.0.9"], [20100], [5300], 77)
    assert forward[0] == backward[0]
    other = multipath_hashes(["10.0.0.9"], ["10.0.0.2"], [5301], [20100], 77)
    assert other[0] != forward[0]


def test_hash_threshold_splits_the_31_bit_space_in_equal_parts():
    for width in (1, 2, 3, 4, 7):
        assert hash_threshold(np.uint64(0), width) == 0
        assert hash_threshold(np.uint64(2 ** 31 - 1), width) == width - 1
        picks = [hash_threshold(np.uint64(h), width)
                 for h in np.linspace(0, 2 ** 31 - 1, 7001).astype(np.uint64)]
        assert picks == sorted(picks)
        counts = np.bincount(picks, minlength=width)
        assert counts.max() - counts.min() <= 2


def test_bad_keys_are_refused():
    with pytest.raises(ValueError, match="1..2"):
        multipath_hashes(["10.0.0.1"], ["10.0.0.2"], [1], [2], 0)
    with pytest.raises(ValueError, match="seed 0"):
        KernelFlowKeys(registry.build("fattree,k=4"), 0)


def test_flow_keys_take_ports_as_a_replayer_does():
    """Server port on the source, client port on the destination, drawn by
    the port key, from one book in plan order; routers' hash low, hosts' high."""
    fabric = registry.build("fattree,k=4")
    dag = FlowDag([Flow("a", "h1", "h5", 10), Flow("b", "h5", "h1", 10, after=("a",)),
                   Flow("c", "h2", "h16", 10)])
    keys = KernelFlowKeys(fabric, 3).keys("i2/train-dp/", dag)
    book = PortBook(3)
    ip = {h: fabric.graph.nodes[h]["ip"] for h in fabric.hosts}
    taken = {f.id: (book.server(f.src, "i2/train-dp/" + f.id),
                    book.client(f.dst, "i2/train-dp/" + f.id))
             for f in dag.topological_order()}
    flows = dag.flows
    routers = multipath_hashes([ip[f.src] for f in flows], [ip[f.dst] for f in flows],
                               [taken[f.id][0] for f in flows], [taken[f.id][1] for f in flows],
                               multipath_hash_seed(3))
    hosts = address_hashes([ip[f.src] for f in flows], [ip[f.dst] for f in flows],
                           multipath_hash_seed(3))
    assert list(keys & np.uint64(0xFFFFFFFF)) == list(routers)
    assert list(keys >> np.uint64(32)) == list(hosts)


@pytest.mark.parametrize("spec", ["fattree,k=4", "fattree-os,gpus=16,radix=8,gpus_per_server=2",
                                  "roft,gpus=16,radix=8,gpus_per_server=2"])
def test_each_router_picks_from_its_installed_route_in_port_order(spec):
    """At every switch of a modelled path, the port taken is the hash's pick
    among the ports the controller installs for the destination, sorted as
    the kernel route lists them (`topologies.routing.next_hops`)."""
    fabric = registry.build(spec)
    table = routing.next_hops(routing.base_graph(fabric))
    net = ModelNetwork(fabric, kernel_multipath=True)
    rng = random.Random(2)
    pairs = [rng.sample(fabric.hosts, 2) for _ in range(200)]
    keys = np.array([rng.getrandbits(31) | (rng.getrandbits(31) << 32) for _ in pairs],
                    dtype=np.uint64)
    indptr, links = net.paths([s for s, _ in pairs], [d for _, d in pairs], keys)
    spread = 0
    for i, (_, dst) in enumerate(pairs):
        for link in links[indptr[i]:indptr[i + 1]]:
            node = net.names[net.link_src[link]]
            if fabric.kind(node) != EPS:
                continue
            installed = table[node][dst]
            spread += len(installed) > 1
            expected = installed[hash_threshold(keys[i] & np.uint64(0xFFFFFFFF), len(installed))]
            assert net.link_port[link] == expected, f"{node} toward {dst}"
    assert spread > 100, "the paths should cross switches with several equal next hops"


def _ctx(**testbed):
    return SimpleNamespace(scenario=SimpleNamespace(config={"testbed": testbed}))


@pytest.mark.skipif(not MULTIPATH_SEED_SYSCTL.exists(),
                    reason="this kernel has no settable multipath hash key")
def test_a_model_run_takes_the_kernels_paths_only_where_the_emulator_fixes_them():
    fabric = registry.build("fattree,k=4")
    keys = model_kernel_keys(_ctx(ecmp_seed=1, dataplane="linux"), fabric)
    assert isinstance(keys, KernelFlowKeys)
    assert keys.key == multipath_hash_seed(1)
    assert model_kernel_keys(_ctx(ecmp_seed=0, dataplane="linux"), fabric) is None
    assert model_kernel_keys(_ctx(ecmp_seed=1, dataplane="ovs"), fabric) is None
