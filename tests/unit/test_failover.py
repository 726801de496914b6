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


def test_hpn_flow_ends_move_together_into_one_plane():
    """A flow with one end behind the failed ToR: that end takes its GPU's port
    in the other plane, and the other end follows to its own port there (the
    planes never meet); ends both behind it, or on one network, move alone."""
    fabric = registry.build("hpn,gpus=64,gpus_per_server=2,radix=8")
    nodes = fabric.graph.nodes
    port = {(nodes[h]["gpu"], nodes[h]["nic_port"]): h for h in fabric.hosts}
    assert failover.networks(fabric)[port[0, 0]] != failover.networks(fabric)[port[0, 1]]
    tor = failover.host_switch(fabric, port[0, 0])      # plane 0, rail 0, segment 0
    moves = failover.failover_map(fabric, [tor])
    ends = failover.FlowEnds(fabric, moves)
    assert ends(port[0, 0], port[62, 0]) == (port[0, 1], port[62, 1]), "the D follows"
    assert ends(port[62, 0], port[0, 0]) == (port[62, 1], port[0, 1]), "the P follows"
    assert ends(port[0, 0], port[2, 0]) == (port[0, 1], port[2, 1]), "both behind the ToR"
    assert ends(port[0, 1], port[62, 1]) == (port[0, 1], port[62, 1]), "plane 1: untouched"
    assert ends(port[0, 0], port[62, 0]) == (moves[port[0, 0]], port[62, 1])
    cut = failover.FlowEnds(fabric, dict(moves, **{port[0, 0]: None}))
    assert cut(port[0, 0], port[62, 0]) == (None, port[62, 0]), "a cut-off end stays cut off"


def test_zcube_flow_keeps_its_pairing_of_ports_and_takes_the_other_path():
    """ZCube pairs a GPU's port 0 with its peer's port 1 (one A-B link).  When
    the A switch fails, the moved end takes port 1 and the other end port 0:
    ZCube's other path, not port 1 to port 1 across three switches."""
    fabric = registry.build("zcube,n=4,gpus_per_server=2")
    assert len(set(failover.networks(fabric).values())) == 1
    nodes = fabric.graph.nodes
    port = {(nodes[h]["gpu"], nodes[h]["nic_port"]): h for h in fabric.hosts}
    a0 = failover.host_switch(fabric, port[0, 0])
    moves = failover.failover_map(fabric, [a0])
    ends = failover.FlowEnds(fabric, moves)
    switch = {h: failover.host_switch(fabric, h) for h in fabric.hosts}
    assert moves[port[0, 0]] == port[0, 1]
    b0 = switch[port[0, 1]]
    # A peer whose port 1 hangs off another B switch than GPU 0's port 1.
    peer = next(g for g in range(16) if port[g, 0] not in moves and switch[port[g, 1]] != b0)
    assert ends(port[0, 0], port[peer, 1]) == (port[0, 1], port[peer, 0]), "the other path"
    assert ends(port[peer, 1], port[0, 0]) == (port[peer, 0], port[0, 1]), "either way"
    assert ends(port[0, 0], port[peer, 0]) == (port[0, 1], port[peer, 0]), \
        "port 0 is one link from the B switch: it stays"
    near = next(g for g in range(16) if port[g, 0] not in moves and switch[port[g, 1]] == b0)
    assert ends(port[0, 0], port[near, 1]) == (port[0, 1], port[near, 1]), "on that B switch"
    # The other end's port 0 behind the failed switch too: nothing nearer, it stays.
    behind = next(g for g in range(1, 16) if port[g, 0] in moves
                  and switch[port[g, 1]] != b0)
    assert ends(port[behind, 1], port[0, 0]) == (port[behind, 1], port[0, 1])


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


def test_flow_ends_say_which_flows_move_and_which_stay():
    """What a failure does to a flow, asked by the testbed's event, its standby
    and the model alike: untouched, moved, cut off or now on one NIC."""
    fabric = registry.build("hpn,gpus=64,gpus_per_server=2,radix=8")
    nodes = fabric.graph.nodes
    port = {(nodes[h]["gpu"], nodes[h]["nic_port"]): h for h in fabric.hosts}
    tor = failover.host_switch(fabric, port[0, 0])
    moves = failover.failover_map(fabric, [tor])
    ends = failover.FlowEnds(fabric, moves)
    assert not ends.touches(port[0, 1], port[62, 1])
    assert ends.resend(port[0, 1], port[62, 1]) is None, "plane 1: it stays"
    assert not ends.cut_off(port[0, 1], port[62, 1])
    assert ends.touches(port[0, 0], port[62, 0])
    assert ends.resend(port[0, 0], port[62, 0]) == (port[0, 1], port[62, 1])
    assert not ends.cut_off(port[0, 0], port[62, 0])
    # GPU 0's other port also gone: its flows are cut off, and stay.
    cut = failover.FlowEnds(fabric, dict(moves, **{port[0, 0]: None}))
    assert cut.cut_off(port[0, 0], port[62, 0]) and cut.resend(port[0, 0], port[62, 0]) is None
    # A flow between a GPU's two ports: once one fails over onto the other,
    # both ends are one NIC.
    same = failover.FlowEnds(fabric, {port[0, 0]: port[0, 1]})
    assert same(port[0, 0], port[0, 1]) == (port[0, 1], port[0, 1])
    assert same.resend(port[0, 0], port[0, 1]) is None
    assert not same.cut_off(port[0, 0], port[0, 1])
