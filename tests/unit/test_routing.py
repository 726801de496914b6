"""Shortest-path ECMP next hops on small hand-built graphs."""

import pytest

from topologies import routing
from topologies.fabric import Fabric


def line():
    """h1 - s1 - s2 - h2"""
    fabric = Fabric("line")
    s1, s2 = fabric.add_switch("leaf"), fabric.add_switch("leaf")
    h1, h2 = fabric.add_host(), fabric.add_host()
    fabric.add_link(h1, s1, 100)      # s1 port 1
    fabric.add_link(s1, s2, 100)      # s1 port 2, s2 port 1
    fabric.add_link(h2, s2, 100)      # s2 port 2
    return fabric


def diamond():
    """Two equal branches, one of them over two parallel links.

    ::

              1,2 ===== s2 ===== 3
        h1 -4- s1                 s4 -3- h2
                3 ----- s3 ---- 2

    (numbers are the ports of s1 on the left and of s4 on the right)
    """
    fabric = Fabric("diamond")
    s1, s2, s3, s4 = (fabric.add_switch("x") for _ in range(4))
    h1, h2 = fabric.add_host(), fabric.add_host()
    fabric.add_link(s1, s2, 100)      # s1:1  s2:1
    fabric.add_link(s1, s2, 100)      # s1:2  s2:2 (parallel)
    fabric.add_link(s1, s3, 100)      # s1:3  s3:1
    fabric.add_link(s2, s4, 100)      # s2:3  s4:1
    fabric.add_link(s3, s4, 100)      # s3:2  s4:2
    fabric.add_link(h1, s1, 100)      # s1:4
    fabric.add_link(h2, s4, 100)      # s4:3
    return fabric


def dual_homed():
    """h2 - s1 - h1 - s2 - h3: only a host joins the two switches."""
    fabric = Fabric("dual")
    s1, s2 = fabric.add_switch("x"), fabric.add_switch("x")
    h1, h2, h3 = fabric.add_host(), fabric.add_host(), fabric.add_host()
    fabric.add_link(h1, s1, 100)      # s1:1
    fabric.add_link(h1, s2, 100)      # s2:1
    fabric.add_link(h2, s1, 100)      # s1:2
    fabric.add_link(h3, s2, 100)      # s2:2
    return fabric


def test_line_next_hops():
    table = routing.next_hops(line().logical_graph())
    assert table == {"s1": {"h1": (1,), "h2": (2,)}, "s2": {"h1": (1,), "h2": (2,)}}


def test_diamond_spreads_over_both_branches_and_parallel_links():
    table = routing.next_hops(diamond().logical_graph())
    assert table["s1"]["h2"] == (1, 2, 3), \
        f"s1 should use both parallel links to s2 and the one to s3: {table['s1']['h2']}"
    assert table["s4"]["h1"] == (1, 2)
    assert table["s2"]["h1"] == (1, 2), "both parallel links lead to h1's switch"
    assert table["s1"]["h1"] == (4,)


def test_destinations_limit_the_table():
    table = routing.next_hops(diamond().logical_graph(), destinations=["h2"])
    assert all(set(entries) == {"h2"} for entries in table.values()), table


def test_unreachable_destination_has_no_entry():
    fabric = line()
    logical = fabric.logical_graph()
    logical.remove_edge("s1", "s2")
    table = routing.next_hops(logical)
    assert "h2" not in table["s1"] and "h1" not in table["s2"], table
    assert table["s1"]["h1"] == (1,)


def test_hosts_never_forward_unless_allowed():
    logical = dual_homed().logical_graph()
    table = routing.next_hops(logical)
    assert "h3" not in table["s1"], f"s1 must not reach h3 through host h1: {table['s1']}"
    assert table["s1"]["h1"] == (1,)
    transit = routing.next_hops(logical, transit_hosts=True)
    assert transit["s1"]["h3"] == (1,), "with transit hosts, h1 relays s1's traffic to s2"


def test_shortest_paths_never_transit_hosts():
    logical = dual_homed().logical_graph()
    assert routing.shortest_paths(logical, "h2", "h3") == []
    assert routing.shortest_paths(logical, "h1", "h3") == [["h1", "s2", "h3"]], \
        "a host may be the source even when it is multi-homed"
    assert routing.shortest_paths(logical, "h2", "h1") == [["h2", "s1", "h1"]]


def test_shortest_paths_lists_every_equal_cost_path():
    paths = routing.shortest_paths(diamond().logical_graph(), "h1", "h2")
    assert paths == [["h1", "s1", "s2", "s4", "h2"], ["h1", "s1", "s3", "s4", "h2"]]


def test_circuits_are_edges_of_the_logical_graph():
    """Routing sees a lit circuit as a link between the two switches it joins."""
    fabric = Fabric("tiny-ocs")
    ocs = fabric.add_ocs(radix=4)
    s1, s2 = fabric.add_switch("tor"), fabric.add_switch("tor")
    h1, h2 = fabric.add_host(), fabric.add_host()
    fabric.add_link(h1, s1, 100)
    fabric.add_link(h2, s2, 100)
    fabric.add_link(s1, ocs, 100)     # s1:2 -> o1:1
    fabric.add_link(s2, ocs, 100)     # s2:2 -> o1:2
    assert "h2" not in routing.next_hops(fabric.logical_graph())["s1"], "no circuit, no route"
    fabric.set_circuits(ocs, [(1, 2)])
    table = routing.next_hops(fabric.logical_graph())
    assert table["s1"]["h2"] == (2,) and table["s2"]["h1"] == (2,)


def test_diff_reports_changes_additions_and_removals():
    old = {"s1": {"h1": (1,), "h2": (2, 3), "h3": (4,)}, "s2": {"h1": (1,)}}
    new = {"s1": {"h1": (1,), "h2": (3,), "h4": (5,)}, "s3": {"h1": (2,)}}
    assert routing.diff(old, new) == {
        "s1": {"h2": (3,), "h3": None, "h4": (5,)},
        "s2": {"h1": None},
        "s3": {"h1": (2,)},
    }


def test_diff_of_equal_tables_is_empty():
    table = routing.next_hops(diamond().logical_graph())
    assert routing.diff(table, table) == {}


@pytest.mark.parametrize("builder", [line, diamond, dual_homed])
def test_every_next_hop_port_exists_on_the_switch(builder):
    fabric = builder()
    for switch, entries in routing.next_hops(fabric.logical_graph()).items():
        wired = fabric.ports_of(switch)
        for dst, ports in entries.items():
            assert set(ports) <= set(wired), f"{switch}->{dst}: ports {ports} not in {wired}"
