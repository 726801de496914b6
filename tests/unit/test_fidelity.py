"""Tests for emu.fidelity: the rows a run's flows give, and the assessment."""

import pytest

from emu.fidelity import (assess, directed_links, fidelity_rows, path_cap_mbps, path_links,
                          shared_links)
from emu.live.replay import FlowResult
from topologies import registry
from traffic.scale import Scale


def flow(flow_id, start, end, goodput, cap, links):
    return {"id": flow_id, "start": start, "end": end, "goodput_mbps": goodput,
            "cap_mbps": cap, "links": links}


IDLE_CPU = {"machine_cpu_pct": {"mean": 40.0, "max": 60.0}, "cores": 2,
            "processes": {"ovs-vswitchd": {"mean_pct_of_core": 30.0,
                                           "max_pct_of_core": 50.0}},
            "samples": 10, "interval_s": 0.5}


def test_alone_flow_below_floor_is_named_in_a_warning():
    flows = [
        flow("f1", 0, 10, 45.0, 100.0, ["s1-s2"]),       # alone, 45 %: warn
        flow("f2", 0, 10, 97.0, 100.0, ["s3-s4"]),       # alone, fine
        flow("f3", 20, 30, 30.0, 100.0, ["s5-s6", "s6-s7"]),   # shares s6-s7
        flow("f4", 25, 35, 30.0, 100.0, ["s6-s7"]),
        flow("f5", 10, 20, 10.0, 100.0, ["s1-s2"]),      # starts as f1 ends: alone
        flow("f6", 0, 5, 1.0, None, ["s9-s10"]),         # no cap: not checked
    ]
    result = assess(flows, IDLE_CPU)
    assert result["flows_checked"] == 6
    assert [row["id"] for row in result["alone_flows"]] == ["f1", "f2", "f5"]
    assert result["alone_flows"][0]["ratio"] == pytest.approx(0.45)
    assert not result["saturated"]
    assert len(result["warnings"]) == 2
    warning = result["warnings"][0]
    assert "f1" in warning and "45.0 Mbit/s" in warning and "100.0 Mbit/s" in warning
    assert "0.45" in warning
    assert "f5" in result["warnings"][1]
    assert result["cpu"] is IDLE_CPU


def test_cpu_saturation_warnings():
    machine_hot = dict(IDLE_CPU, machine_cpu_pct={"mean": 50.0, "max": 95.0})
    result = assess([], machine_hot)
    assert result["saturated"]
    assert result["warnings"][0].startswith("datapath saturated: machine CPU")
    ovs_hot = dict(IDLE_CPU, processes={"ovs-vswitchd": {
        "mean_pct_of_core": 80.0, "max_pct_of_core": 99.0}})
    result = assess([], ovs_hot, saturation_pct=95)
    assert result["saturated"]
    assert "ovs-vswitchd reached 99 % of one core" in result["warnings"][0]
    assert not assess([], ovs_hot, saturation_pct=99.5)["saturated"]
    assert assess([], None)["warnings"] == []


def test_assess_rejects_malformed_flows():
    with pytest.raises(ValueError, match=r"flow #0 \(f1\) lacks key\(s\) \['links'\]"):
        assess([{"id": "f1", "start": 0, "end": 1, "goodput_mbps": 1,
                 "cap_mbps": 1}], None)
    with pytest.raises(ValueError, match="end .* before start"):
        assess([flow("f1", 5, 1, 1, 1, [])], None)
    with pytest.raises(ValueError, match="goodput_floor"):
        assess([], None, goodput_floor=2)


def result(flow_id, src, dst, status="ok", goodput=9.0):
    row = FlowResult(flow_id, src, dst, 1000, None, "g", start=1.0, end=2.0,
                     goodput_mbps=goodput, status=status)
    return row


def test_rows_name_the_links_of_every_shortest_path_and_the_path_rate():
    fabric = registry.build("fattree,k=4")          # 400 Gbit/s links
    scale = Scale.from_rates(400, 10)
    links = path_links(fabric, "h1", "h16")
    assert len(links) == 2 + 2 * 2 + 2 * 4, \
        f"h1 -> h16 crosses pods: 2 host links, 4 edge-agg, 8 agg-core links, got {links}"
    assert path_cap_mbps(fabric, scale, "h1", "h16") == pytest.approx(10.0)
    rows = fidelity_rows(fabric, scale, [result("a", "h1", "h16"),
                                         result("b", "h1", "h2", status="failed")],
                         prefix="ft:")
    assert [row["id"] for row in rows] == ["a"], "a failed flow is not checked"
    assert rows[0]["links"] == ["ft:" + link for link in links]
    assert rows[0]["cap_mbps"] == pytest.approx(10.0) and rows[0]["goodput_mbps"] == 9.0


def test_hosts_without_a_path_have_no_cap():
    fabric = registry.build("hybrid,tors=3")
    scale = Scale.from_rates(100, 10)
    fabric.set_circuits("o1", [])
    far = next(h for h in fabric.hosts if fabric.host_port(h)[0] != fabric.host_port("h1")[0])
    assert path_cap_mbps(fabric, scale, "h1", far) is None and path_links(fabric, "h1", far) == []


def test_rows_take_the_path_the_data_plane_gave_each_flow():
    fabric = registry.build("fattree,k=4")
    scale = Scale.from_rates(400, 10)
    edge = fabric.host_port("h1")[0]
    path = ["h1", edge, "h2"]
    rows = fidelity_rows(fabric, scale, [result("a", "h1", "h2"), result("b", "h1", "h16")],
                         paths={0: path})
    assert rows[0]["links"] == [f"h1->{edge}", f"{edge}->h2"] and rows[0]["path"] == path
    assert "path" not in rows[1] and rows[1]["links"] == path_links(fabric, "h1", "h16"), \
        "a flow without a known path keeps every shortest path's links"


def test_parallel_links_are_told_apart_by_the_port_a_flow_left_on():
    """FT-OS at 16 GPUs joins each ToR to its one spine by two links: two flows
    out of one ToR share a link only if the kernel hashed them onto the same one."""
    fabric = registry.build("fattree-os,gpus=16,radix=8,gpus_per_server=2")
    scale = Scale.from_rates(400, 10)
    tor, spine = fabric.host_port("h1")[0], "s4"
    uplinks = sorted(data["ports"][tor] for data in fabric.graph.get_edge_data(tor, spine).values())
    assert len(uplinks) == 2
    assert {f"{tor}->{spine} (port {p})" for p in uplinks} <= set(path_links(fabric, "h1", "h7")), \
        "a flow whose path is unknown may have taken either uplink"
    far = fabric.host_port("h7")[0]
    path = ["h1", tor, spine, far, "h7"]
    down = next(iter(fabric.graph.get_edge_data(spine, far).values()))["ports"][spine]
    rows = fidelity_rows(fabric, scale, [result("a", "h1", "h7"), result("b", "h2", "h8")],
                         paths={0: path, 1: ["h2", tor, spine, far, "h8"]},
                         ports={0: [0, uplinks[0], down, 0], 1: [0, uplinks[1], down, 0]})
    assert f"{tor}->{spine} (port {uplinks[0]})" in rows[0]["links"]
    assert f"{tor}->{spine} (port {uplinks[1]})" in rows[1]["links"]
    shared = {row["link"] for row in shared_links(rows)}
    assert not any(link.startswith(f"{tor}->{spine}") for link in shared), \
        "flows on the two parallel uplinks did not share one"
    assert f"{spine}->{far} (port {down})" in shared, shared
    assert directed_links(path) == [f"h1->{tor}", f"{tor}->{spine}", f"{spine}->{far}",
                                    f"{far}->h7"], "without the fabric, node pairs"


def test_consecutive_flows_of_one_kept_connection_do_not_share_their_links():
    """The persistent transport writes a ring's next chunk while the last one's
    tail is still in flight: on one connection they queue, they do not compete."""
    fabric = registry.build("fattree,k=4")
    scale = Scale.from_rates(400, 10)
    path = ["h1", "s7", "h2"]
    flows = [result("s0", "h1", "h2"), result("s1", "h1", "h2"), result("other", "h1", "h2")]
    for flow, sport in zip(flows, (40000, 40000, 40001)):
        flow.sport, flow.dport = sport, 5600
    flows[1].start, flows[1].end = 1.9, 3.0         # overlaps s0's last 0.1 s
    flows[2].start, flows[2].end = 2.95, 3.5
    rows = fidelity_rows(fabric, scale, flows, paths={i: path for i in range(3)})
    assert rows[0]["connection"] == rows[1]["connection"] == "h1:40000->h2:5600"
    shared = shared_links(rows)
    assert {row["link"] for row in shared} == {"h1->s7", "s7->h2"}
    assert all(row["flows"] == ["other", "s1"] for row in shared), shared
    assert all(row["overlap_s"] == pytest.approx(0.05) for row in shared), shared


def test_paths_follow_each_flow_even_when_ids_repeat():
    """pd-pairing replays the same request ids once per configuration on one
    testbed: each flow keeps its own path, not the last one with its id."""
    fabric = registry.build("fattree,k=4")
    scale = Scale.from_rates(400, 10)
    edge1, edge3 = fabric.host_port("h1")[0], fabric.host_port("h3")[0]
    first, again = result("r1", "h1", "h2"), result("r1", "h3", "h4")
    rows = fidelity_rows(fabric, scale, [first, again],
                         paths={0: ["h1", edge1, "h2"], 1: ["h3", edge3, "h4"]})
    assert rows[0]["links"] == [f"h1->{edge1}", f"{edge1}->h2"]
    assert rows[1]["links"] == [f"h3->{edge3}", f"{edge3}->h4"]


def test_flows_that_met_on_a_link_are_listed_with_the_time_they_shared():
    def known(flow_id, start, end, links):
        return dict(flow(flow_id, start, end, 9.0, 10.0, links), path=["x"])

    flows = [known("a", 0, 10, ["s1->s2", "s2->s3"]),
             known("b", 5, 12, ["s1->s2"]),             # meets a on s1->s2 for 5 s
             known("c", 0, 10, ["s2->s1"]),             # the other direction: not shared
             known("d", 10, 20, ["s2->s3"]),            # starts as a ends: not shared
             flow("e", 0, 10, 9.0, 10.0, ["s1->s2"])]   # path unknown: not counted
    shared = shared_links(flows)
    assert shared == [{"link": "s1->s2", "flows": ["a", "b"], "overlap_s": 5.0}]
    report = assess(flows, IDLE_CPU)
    assert report["paths_known_count"] == 4
    assert report["flows_sharing_a_link_count"] == 2 and report["shared_links"] == shared
    assert not any("s1->s2" in text for text in report["warnings"]), \
        "a shared link explains a slowdown; it is not a warning"


def test_where_the_kernel_forwards_only_a_busy_machine_on_average_is_saturated():
    spiky = dict(IDLE_CPU, machine_cpu_pct={"mean": 42.0, "max": 100.0}, processes={})
    assert assess([], spiky)["saturated"], "a userspace datapath competes with the peak"
    assert not assess([], spiky, kernel_forwarding=True)["saturated"]
    busy = dict(spiky, machine_cpu_pct={"mean": 93.0, "max": 100.0})
    assert assess([], busy, kernel_forwarding=True)["saturated"]
    forwarding = dict(spiky, softirq_pct={"mean": 30.0, "max": 55.0})
    warnings = assess([], forwarding, kernel_forwarding=True)["warnings"]
    assert warnings and warnings[0].startswith("kernel forwarding saturated: softirq took 55 %")


def test_a_lone_flow_too_short_or_losing_at_its_own_queue_is_not_held_to_its_rate():
    def lone(flow_id, link, nbytes, retransmits, goodput=4.0):
        return dict(flow(flow_id, 0, 1, goodput, 10.0, [link]), bytes=nbytes,
                    retransmits=retransmits)

    flows = [lone("short", "a->b", 84_000, 0),             # 67 ms at 10 Mbit/s
             lone("lossy", "c->d", 1_250_000, 12),         # overran its own queue
             lone("slow", "e->f", 1_250_000, 0)]           # nothing explains it
    report = assess(flows, IDLE_CPU)
    assert [w.split()[1] for w in report["warnings"]] == ["slow"]
    why = {row["id"]: row["not_held"] for row in report["alone_flows"]}
    assert why == {"short": "shorter than 0.2 s at its rate",
                   "lossy": "12 retransmissions at its own queue", "slow": None}


def test_a_busy_server_of_a_cluster_run_marks_it_saturated():
    calm = assess([], None, servers_cpu={"localhost": 40.0, "10.0.0.12": None})
    assert not calm["saturated"] and calm["servers_cpu_pct"]["localhost"] == 40.0
    busy = assess([], None, servers_cpu={"localhost": 40.0, "10.0.0.12": 95.0})
    assert busy["saturated"]
    assert any("server 10.0.0.12 used 95 %" in w for w in busy["warnings"])
