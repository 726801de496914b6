"""Which NIC port carries a GPU's traffic after a ToR failure, per fabric."""

import pytest

from topologies import registry
from topologies.fabric import FabricError
from traffic import failover


def attrs(fabric, host):
    return fabric.graph.nodes[host]


def test_zcube_gpu_moves_to_its_other_layer_port():
    fabric = registry.build("zcube,n=4,gpus_per_server=2")
    a0 = failover.host_switch(fabric, fabric.hosts[0])
    moved = failover.failover_map(fabric, [a0])
    assert len(moved) == 4, "A_0 serves the four GPUs (0, j)"
    for host, new in moved.items():
        assert new is not None and new != host
        assert attrs(fabric, new)["gpu"] == attrs(fabric, host)["gpu"]
        assert failover.host_switch(fabric, new) != a0


def test_hpn_gpu_moves_to_the_other_plane():
    fabric = registry.build("hpn,gpus=16,gpus_per_server=2,radix=8")
    tor = failover.tor_switches(fabric)[0]
    moved = failover.failover_map(fabric, [tor])
    assert len(moved) == 8
    for host, new in moved.items():
        assert attrs(fabric, new)["gpu"] == attrs(fabric, host)["gpu"]
        assert attrs(fabric, new)["nic_port"] != attrs(fabric, host)["nic_port"]


def test_roft_gpu_borrows_a_server_mate_nic_over_nvlink():
    fabric = registry.build("roft,gpus=16,radix=8,gpus_per_server=2")
    leaf = failover.tor_switches(fabric)[0]
    moved = failover.failover_map(fabric, [leaf])
    assert len(moved) == 4
    for host, new in moved.items():
        assert attrs(fabric, new)["server"] == attrs(fabric, host)["server"]
        assert attrs(fabric, new)["gpu"] != attrs(fabric, host)["gpu"]
        assert attrs(fabric, new)["rail"] != attrs(fabric, host)["rail"]
    assert failover.failover_host(fabric, "h16", [leaf]) == "h16" or \
        failover.host_switch(fabric, "h16") == leaf


def test_cut_off_gpu_maps_to_none_and_unknown_switches_are_refused():
    fabric = registry.build("roft,gpus=16,radix=8,gpus_per_server=2")
    leaves = failover.tor_switches(fabric)
    assert set(failover.failover_map(fabric, leaves).values()) == {None}
    with pytest.raises(FabricError, match="not switches"):
        failover.failover_map(fabric, ["s99"])
    with pytest.raises(FabricError, match="not a host"):
        failover.failover_host(fabric, leaves[0], [])


def test_busiest_tor_counts_both_ends():
    fabric = registry.build("zcube,n=2,gpus_per_server=2")
    h = fabric.hosts
    s = {host: failover.host_switch(fabric, host) for host in h}
    flows = [(h[0], h[-1], 100), (h[0], h[1], 100), (h[2], h[3], 150)]
    counts = {}
    for src, dst, size in flows:
        counts[s[src]] = counts.get(s[src], 0) + size
        counts[s[dst]] = counts.get(s[dst], 0) + size
    assert failover.busiest_tor(fabric, flows) == max(sorted(counts), key=counts.get)
