"""emu.view.state and emu.view.replay: what the web view shows at a moment of a run.

Three synthetic runs over real fabrics (the scenarios' own specs), with the
events their parts emit (`emu.live.feed`): an OCS reconfiguration on the
ocs-reconfig fabric, RL phases on RFabric, and P/D requests on ZCube.
`test_view_server` serves the same runs.
"""

import csv
import json
import math
import re
from pathlib import Path

import pytest

from emu.live.feed import EVENTS_FILE, RunFeed
from emu.view.replay import LOAD_FILE, ReplayError, load_run
from emu.view.state import MIN_VISIBLE_S, RECENT_S, ViewState, load_events
from topologies.registry import build
from traffic.scale import Scale

T0 = 1_700_000_000.0

OCS_SPEC = "hybrid,tors=2,hosts_per_tor=1,uplinks=2"     # emu/scenarios/ocs-reconfig.toml
RFABRIC_SPEC = "rfabric,pods=2,train_pods=1"             # emu/scenarios/rfabric.toml
PD_SPEC = "zcube,n=4,gpus_per_server=2"                  # emu/scenarios/pd-inference.toml

# ocs-reconfig: 400G links at 20 Mbit/s, undilated; a 2.5 s custom dark window.
OCS_SCALE = Scale.from_rates(400.0, 20.0, tdf=1.0)
DELAY_MS = 2500.0
DARK_FROM, DARK_UNTIL, LIT_AT, DONE_AT = T0 + 3.01, T0 + 5.51, T0 + 5.52, T0 + 5.53
DARK_S = 2.51
# rfabric: 400G at 10 Mbit/s, time x100 (MEMS 10 ms real -> 1 s emulated).
RFABRIC_SCALE = Scale.from_rates(400.0, 10.0, tdf=100.0)
# pd-inference: 200G at 10 Mbit/s, time x10.
PD_SCALE = Scale.from_rates(200.0, 10.0, tdf=10.0)


def make_testbed(spec: str, scale: Scale, t: float = T0, **extra) -> dict:
    return {"kind": "testbed", "t": t, "fabric": build(spec).to_dict(),
            "scale": scale.to_dict(), "dataplane": "ovs", **extra}


def ocs_run() -> list:
    """ocs-reconfig: circuit 2-3 (s1 - s2) is torn and 1-4 lit after 2.5 s dark; the
    TCP flow h1 -> h2 crosses the OCS before and after."""
    return [
        make_testbed(OCS_SPEC, OCS_SCALE),
        {"kind": "preset", "t": T0 + 0.5, "ocs": "o1", "technology": "custom",
         "delay_ms": DELAY_MS},
        # s1:3 - o1:2 and o1:3 - s2:2 are the lit circuit's links.
        {"kind": "load", "t": T0 + 1.0, "interval_s": 0.5, "links": [
            ["s1", 3, "o1", 2, 15.0], ["o1", 3, "s2", 2, 15.0], ["s2", 1, "h2", 1, 15.0],
            ["s1", 1, "h1", 1, 0.4]]},
        {"kind": "circuit", "t": T0 + 3.0, "ocs": "o1", "step": "start", "technology": "custom",
         "tear": [[2, 3]], "light": [[1, 4]], "keep": [], "delay_ms": DELAY_MS},
        {"kind": "circuit", "t": DARK_FROM, "ocs": "o1", "step": "dark", "technology": "custom",
         "dark_until": DARK_UNTIL, "tear": [[2, 3]], "light": [[1, 4]]},
        {"kind": "circuit", "t": LIT_AT, "ocs": "o1", "step": "lit", "technology": "custom",
         "light": [[1, 4]]},
        {"kind": "circuit", "t": DONE_AT, "ocs": "o1", "step": "done", "technology": "custom",
         "dark_s": DARK_S, "tear": [[2, 3]], "light": [[1, 4]]},
        # Now over the new circuit: s1:2 - o1:1 and o1:4 - s2:3.
        {"kind": "load", "t": T0 + 6.0, "interval_s": 0.5, "links": [
            ["s1", 2, "o1", 1, 18.0], ["o1", 4, "s2", 3, 18.0], ["s1", 3, "o1", 2, 0.0],
            ["s2", 1, "h2", 1, 18.0]]},
        {"kind": "link", "t": T0 + 7.0, "a": "s2", "b": "h2", "up": False},
        {"kind": "run", "t": T0 + 8.0, "status": "ended"},
    ]


def rfabric_run() -> list:
    """One RL iteration: a Train and a Gen phase overlap, o1 is reconfigured for
    the Gen phase (1 s dark = 10 ms real), then the weight sync."""
    light = {"o1": [[1, 4], [2, 3]]}
    return [
        make_testbed(RFABRIC_SPEC, RFABRIC_SCALE, label="rfabric"),
        {"kind": "iteration", "t": T0 + 1.0, "state": "start", "iteration": 1, "iterations": 1},
        {"kind": "phase", "t": T0 + 1.0, "state": "start", "name": "train-tp", "iteration": 1,
         "template": None, "circuits": None, "flows": 12, "label": "rfabric"},
        {"kind": "circuit", "t": T0 + 1.05, "ocs": "o1", "step": "start", "technology": "mems",
         "tear": [[1, 3], [2, 4]], "light": [[1, 4], [2, 3]], "keep": [], "delay_ms": 1000.0},
        {"kind": "circuit", "t": T0 + 1.06, "ocs": "o1", "step": "dark", "technology": "mems",
         "dark_until": T0 + 2.06, "tear": [[1, 3], [2, 4]], "light": [[1, 4], [2, 3]]},
        {"kind": "phase", "t": T0 + 1.2, "state": "start", "name": "gen-pd", "iteration": 1,
         "template": "gen", "circuits": light, "flows": 8, "label": "rfabric"},
        {"kind": "circuit", "t": T0 + 2.07, "ocs": "o1", "step": "lit", "technology": "mems",
         "light": [[1, 4], [2, 3]]},
        {"kind": "circuit", "t": T0 + 2.08, "ocs": "o1", "step": "done", "technology": "mems",
         "dark_s": 1.01, "tear": [[1, 3], [2, 4]], "light": [[1, 4], [2, 3]]},
        {"kind": "phase", "t": T0 + 3.0, "state": "end", "name": "gen-pd", "iteration": 1,
         "duration_s": 1.8},
        {"kind": "phase", "t": T0 + 4.0, "state": "end", "name": "train-tp", "iteration": 1,
         "duration_s": 3.0},
        {"kind": "phase", "t": T0 + 4.5, "state": "start", "name": "weight-sync", "iteration": 1,
         "template": "sync", "circuits": None, "flows": 4},
        {"kind": "phase", "t": T0 + 5.0, "state": "end", "name": "weight-sync", "iteration": 1,
         "duration_s": 0.5},
        {"kind": "iteration", "t": T0 + 5.0, "state": "end", "iteration": 1, "iterations": 1,
         "duration_s": 4.0},
        {"kind": "testbed-closed", "t": T0 + 6.0, "label": "rfabric"},
    ]


def pd_run() -> list:
    """Three requests on ZCube: r0 and r1 into D h5, r2 into D h13; r0 ends
    well, r2 fails; two credits per D."""
    def request(t, rid, state, p, d, streams):
        return {"kind": "request", "t": T0 + t, "id": rid, "state": state, "p": p, "d": d,
                "streams": streams, "d_gpus": [d]}

    def credits(t, d, used):
        return {"kind": "credits", "t": T0 + t, "d": d, "used": used, "total": 2}

    return [
        make_testbed(PD_SPEC, PD_SCALE),
        credits(1.0, "h5", 1),
        request(1.0, "r0", "kv", ["h1", "h2"], "h5", 1),
        credits(1.05, "h5", 2),
        request(1.05, "r1", "kv", ["h3", "h4"], "h5", 1),
        request(1.1, "r0", "kv", ["h1", "h2"], "h5", 2),
        credits(1.2, "h13", 1),
        request(1.2, "r2", "kv", ["h9", "h10"], "h13", 2),
        request(2.0, "r0", "decode", ["h1", "h2"], "h5", 0),
        credits(2.01, "h5", 1),
        request(2.01, "r0", "done", ["h1", "h2"], "h5", 0),
        {"kind": "warning", "t": T0 + 2.5, "text": "KV P99 above the target"},
        request(3.0, "r2", "failed", ["h9", "h10"], "h13", 0),
        credits(3.0, "h13", 0),
    ]


RUNS = {"ocs": (ocs_run, OCS_SPEC), "rfabric": (rfabric_run, RFABRIC_SPEC),
        "pd": (pd_run, PD_SPEC)}


def state_of(events) -> ViewState:
    state = ViewState()
    state.extend(events)
    return state


def link_at(snap: dict, node: str, port: int) -> dict:
    """The link that has ``node:port`` at one of its ends."""
    found = [link for link in snap["links"]
             if (link["a"], link["a_port"]) == (node, port)
             or (link["b"], link["b_port"]) == (node, port)]
    assert len(found) == 1, f"{node}:{port}: {found}"
    return found[0]


def circuit_rows(snap: dict) -> dict:
    return {(row["ocs"], row["a"], row["b"]): row for row in snap["circuits"]}


# ------------------------------------------------------------ every fabric
@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_node_has_a_tier_and_a_place(name):
    make, spec = RUNS[name]
    fabric = build(spec)
    snap = state_of(make()).snapshot(T0 + 0.1)
    nodes = {node["name"]: node for node in snap["nodes"]}
    assert set(nodes) == set(fabric.graph.nodes)
    for node in nodes.values():
        assert math.isfinite(node["x"]) and math.isfinite(node["y"]), node
        assert -1.0 <= node["x"] <= 1.0 and -1.0 <= node["y"] <= 1.0, node
    tiers = {node["name"]: node["tier"] for node in nodes.values()}
    kinds = {n: d["kind"] for n, d in fabric.graph.nodes(data=True)}
    roles = {n: d.get("role") for n, d in fabric.graph.nodes(data=True)}
    assert {tiers[n] for n in kinds if kinds[n] == "host"} == {0}
    # ToRs (and ZCube's switches, every one of which has hosts) right above the hosts.
    assert {tiers[n] for n in kinds if kinds[n] == "eps"} == {1}
    if name != "pd":
        assert {tiers[n] for n in kinds if kinds[n] == "ocs"} == {2}
        assert {roles[n] for n in kinds if kinds[n] == "ocs"} <= {"ocs", "agg-ocs", "core-ocs"}
    # Bottom to top by tier; left to right in the fabric's order within one.
    by_tier = {}
    for name_ in fabric.graph.nodes:
        by_tier.setdefault(tiers[name_], []).append(nodes[name_])
    heights = [by_tier[tier][0]["y"] for tier in sorted(by_tier)]
    assert heights == sorted(heights) and len(set(heights)) == len(heights)
    for tier, row in by_tier.items():
        assert len({node["y"] for node in row}) == 1, tier
        xs = [node["x"] for node in row]
        assert xs == sorted(xs) and len(set(xs)) == len(xs), (tier, [n["name"] for n in row])


@pytest.mark.parametrize("name", sorted(RUNS))
def test_testbed_and_links_follow_the_fabric(name):
    make, spec = RUNS[name]
    events = make()
    fabric = build(spec)
    scale = Scale.from_dict(events[0]["scale"])
    snap = state_of(events).snapshot(T0 + 0.1)
    testbed = snap["testbed"]
    assert testbed["fabric"] == fabric.name
    assert testbed["counts"] == {kind: sum(1 for _, d in fabric.graph.nodes(data=True)
                                           if d["kind"] == kind)
                                 for kind in ("host", "eps", "ocs")}
    assert testbed["scale"] == scale.to_dict()
    assert len(snap["links"]) == fabric.graph.number_of_edges()
    for link in snap["links"]:
        assert link["capacity_mbps"] == pytest.approx(scale.emu_mbps(link["real_gbps"]))
        assert link["mbps"] == 0.0 and link["util"] == 0.0
    assert testbed["link_real_gbps"] == pytest.approx(max(k["real_gbps"] for k in snap["links"]))
    json.dumps(snap, allow_nan=False)       # what /data serves: plain JSON


def test_before_the_testbed_event_there_is_no_testbed():
    events = [{"kind": "warning", "t": T0 - 1.0, "text": "early"}] + ocs_run()
    state = state_of(events)
    snap = state.snapshot(T0 - 0.5)
    assert snap["testbed"] is None
    assert snap["nodes"] == snap["links"] == snap["circuits"] == []
    assert snap["warnings"] == ["early"]
    assert snap["elapsed_s"] == pytest.approx(0.5)
    assert state.snapshot(T0)["testbed"]["fabric"] == "hybrid"
    assert ViewState().snapshot()["testbed"] is None


def test_the_latest_moment_is_the_default():
    state = state_of(ocs_run())
    assert state.span == (T0, T0 + 8.0)
    snap = state.snapshot()
    assert snap["t"] == T0 + 8.0 and snap["status"] == "ended"


def test_events_added_out_of_order_are_folded_in_time_order():
    events = ocs_run()
    state = state_of(reversed(events))
    assert state.snapshot(T0 + 4.0) == state_of(events).snapshot(T0 + 4.0)


# ------------------------------------------------------------ ocs-reconfig
def test_a_circuit_is_lit_then_dark_counting_down_then_lit():
    state = state_of(ocs_run())
    before = circuit_rows(state.snapshot(T0 + 2.0))
    assert list(before) == [("o1", 2, 3)]
    assert before[("o1", 2, 3)]["state"] == "lit"
    assert before[("o1", 2, 3)]["ends"] == "s1 - s2"
    assert before[("o1", 2, 3)]["technology"] == "custom"     # from the preset event

    starting = circuit_rows(state.snapshot(T0 + 3.005))
    assert starting[("o1", 2, 3)]["state"] == "lit"
    assert starting[("o1", 2, 3)]["note"] == "about to go dark"

    remaining = []
    for t in (T0 + 4.0, T0 + 5.0):
        rows = circuit_rows(state.snapshot(t))
        assert rows[("o1", 2, 3)]["state"] == "dark" and rows[("o1", 2, 3)]["note"] == "torn"
        lighting = rows[("o1", 1, 4)]
        assert lighting["state"] == "about to light"
        assert lighting["remaining_s"] == pytest.approx(DARK_UNTIL - t)
        assert f"lights in {(DARK_UNTIL - t) * 1e3:.0f} ms of {DELAY_MS:.0f}" in lighting["note"]
        remaining.append(lighting["remaining_s"])
    assert remaining[0] > remaining[1] > 0

    just_lit = circuit_rows(state.snapshot(LIT_AT + 0.001))
    assert just_lit[("o1", 1, 4)]["state"] == "lit"
    assert just_lit[("o1", 1, 4)]["note"] == "just lit"

    after = circuit_rows(state.snapshot(DONE_AT + 0.1))
    assert list(after) == [("o1", 1, 4)]
    assert after[("o1", 1, 4)]["state"] == "lit" and after[("o1", 1, 4)]["note"] == ""
    assert after[("o1", 1, 4)]["remaining_s"] is None


def test_the_change_stays_in_recent_after_it_with_its_durations():
    state = state_of(ocs_run())
    assert state.snapshot(DONE_AT - 0.001)["recent"] == []
    for age in (0.0, MIN_VISIBLE_S, RECENT_S - 0.01):
        recent = state.snapshot(DONE_AT + age)["recent"]
        change = [r for r in recent if r.get("ocs") == "o1"]
        assert len(change) == 1, (age, recent)
        assert change[0]["age_s"] == pytest.approx(age)
        # Emulated 2.51 s dark, undilated: 2.51 s in the real fabric too.
        assert change[0]["text"] == ("o1: tore 2-3, lit 1-4 after 2510.0 ms dark "
                                     "(2.51 s in the real fabric)")
    assert not [r for r in state.snapshot(DONE_AT + RECENT_S + 0.01)["recent"]
                if r.get("ocs") == "o1"]


def test_link_events_are_listed_newest_first():
    recent = state_of(ocs_run()).snapshot(T0 + 7.5)["recent"]
    assert [r["text"] for r in recent] == [
        "link s2-h2 down", "o1: tore 2-3, lit 1-4 after 2510.0 ms dark "
                           "(2.51 s in the real fabric)"]


def test_link_load_lands_on_its_link():
    state = state_of(ocs_run())
    snap = state.snapshot(T0 + 2.0)
    assert snap["load_t"] == T0 + 1.0
    uplink = link_at(snap, "s1", 3)                  # o1:2 - s1:3, the lit circuit's
    assert (uplink["a"], uplink["a_port"], uplink["b"]) == ("o1", 2, "s1")
    assert uplink["capacity_mbps"] == pytest.approx(20.0)
    assert uplink["mbps_ba"] == 15.0 and uplink["mbps_ab"] == 0.0   # s1 -> o1
    assert uplink["mbps"] == 15.0 and uplink["util"] == pytest.approx(15.0 / 20.0)
    assert uplink["real_gbps_now"] == pytest.approx(300.0)
    assert uplink["circuit"] == "lit"
    down = link_at(snap, "s2", 1)
    assert down["mbps_ab"] == 15.0 and down["util"] == pytest.approx(0.75)
    assert down["circuit"] is None                   # not an OCS link
    assert link_at(snap, "h1", 1)["util"] == pytest.approx(0.4 / 20.0)
    assert link_at(snap, "o1", 1)["mbps"] == 0.0 and link_at(snap, "o1", 1)["circuit"] == "idle"

    later = state.snapshot(T0 + 6.5)                 # the next sample replaces the first
    assert link_at(later, "s1", 2)["util"] == pytest.approx(18.0 / 20.0)
    assert link_at(later, "s1", 2)["circuit"] == "lit"
    assert link_at(later, "s1", 3)["mbps"] == 0.0
    assert link_at(later, "s1", 3)["circuit"] == "idle"
    assert link_at(later, "h1", 1)["mbps"] == 0.0    # not in that sample


def test_a_dark_ocs_link_says_dark():
    snap = state_of(ocs_run()).snapshot(T0 + 4.0)
    assert link_at(snap, "o1", 2)["circuit"] == "dark"       # torn: 2-3
    assert link_at(snap, "o1", 3)["circuit"] == "dark"
    assert link_at(snap, "o1", 1)["circuit"] == "lighting"   # 1-4, about to light
    assert link_at(snap, "o1", 4)["circuit"] == "lighting"


def test_a_failed_reconfiguration_is_not_shown_dark_forever():
    events = [e for e in ocs_run() if not (e["kind"] == "circuit" and e["step"] in
                                           ("lit", "done"))]
    events.append({"kind": "circuit", "t": T0 + 5.6, "ocs": "o1", "step": "failed",
                   "technology": "custom", "error": "RuntimeError: the switch went away"})
    snap = state_of(events).snapshot(T0 + 6.0)
    assert snap["circuits"] == []                    # torn, never lit
    assert all(link_at(snap, "o1", port)["circuit"] == "idle" for port in (1, 2, 3, 4))
    assert snap["recent"][0]["text"] == ("o1: reconfiguration failed: "
                                         "RuntimeError: the switch went away")


# ------------------------------------------------------------ rfabric
def test_a_phase_shows_its_template_and_circuits_while_it_runs():
    state = state_of(rfabric_run())
    assert state.snapshot(T0 + 0.5)["phase"] is None
    assert state.snapshot(T0 + 0.5)["testbed"]["label"] == "rfabric"

    train = state.snapshot(T0 + 1.1)["phase"]
    assert train == {"name": "train-tp", "iteration": 1, "template": None, "circuits": None,
                     "flows": 12, "since": T0 + 1.0}

    both = state.snapshot(T0 + 2.5)
    assert [phase["name"] for phase in both["phases"]] == ["train-tp", "gen-pd"]
    assert [phase["name"] for phase in state.snapshot(T0 + 3.5)["phases"]] == ["train-tp"]
    assert state.snapshot(T0 + 5.5)["phases"] == []
    gen = both["phase"]          # the latest started of the two
    assert gen["name"] == "gen-pd" and gen["template"] == "gen"
    assert gen["circuits"] == {"o1": [[1, 4], [2, 3]]}
    assert gen["flows"] == 8 and gen["since"] == T0 + 1.2

    # Gen's end leaves Train running.
    assert state.snapshot(T0 + 3.5)["phase"]["name"] == "train-tp"
    # Between phases, and after the last: the iteration, no phase.
    assert state.snapshot(T0 + 4.2)["phase"] == {"name": None, "iteration": 1}
    assert state.snapshot(T0 + 4.7)["phase"]["template"] == "sync"
    assert state.snapshot(T0 + 5.5)["phase"] == {"name": None, "iteration": 1}


def test_a_reconfiguration_under_time_dilation_tells_the_real_duration():
    state = state_of(rfabric_run())
    rows = circuit_rows(state.snapshot(T0 + 1.5))
    assert {key: row["state"] for key, row in rows.items()} == {
        ("o1", 1, 3): "dark", ("o1", 2, 4): "dark", ("o1", 1, 4): "about to light",
        ("o1", 2, 3): "about to light",
        ("o2", 1, 3): "lit", ("o2", 2, 4): "lit", ("o3", 1, 3): "lit", ("o3", 2, 4): "lit",
        ("o4", 1, 3): "lit", ("o4", 2, 4): "lit"}
    # 1 s emulated at time x100: 10 ms in the real fabric.
    assert rows[("o1", 1, 4)]["note"] == "lights in 560 ms of 1000 (10 ms real)"
    assert rows[("o1", 1, 4)]["ends"] == "s1 - s4"
    after = state.snapshot(T0 + 2.5)
    assert after["recent"][0]["text"] == ("o1: tore 1-3, 2-4, lit 1-4, 2-3 after 1010.0 ms "
                                          "dark (10.1 ms in the real fabric)")
    assert {key for key, row in circuit_rows(after).items() if key[0] == "o1"} == {
        ("o1", 1, 4), ("o1", 2, 3)}


def test_a_closed_testbed_is_no_longer_shown():
    snap = state_of(rfabric_run()).snapshot(T0 + 7.0)
    assert snap["testbed"] is None and snap["links"] == [] and snap["circuits"] == []


def test_a_new_testbed_starts_from_scratch():
    events = ocs_run() + [make_testbed(PD_SPEC, PD_SCALE, t=T0 + 9.0, label="zcube")]
    snap = state_of(events).snapshot(T0 + 9.5)
    assert snap["testbed"]["fabric"] == "zcube" and snap["testbed"]["label"] == "zcube"
    assert snap["circuits"] == [] and snap["load_t"] is None
    assert all(link["mbps"] == 0.0 for link in snap["links"])


# ------------------------------------------------------------ pd-inference
def test_requests_in_flight_and_credits_per_decode_gpu():
    state = state_of(pd_run())
    assert state.snapshot(T0 + 0.5)["requests"] == {"in_flight": [], "done": 0, "failed": 0}
    assert state.snapshot(T0 + 0.5)["credits"] == []

    busy = state.snapshot(T0 + 1.5)
    assert busy["requests"]["in_flight"] == [
        {"id": "r0", "state": "kv", "p": ["h1", "h2"], "d": "h5", "streams": 2},
        {"id": "r1", "state": "kv", "p": ["h3", "h4"], "d": "h5", "streams": 1},
        {"id": "r2", "state": "kv", "p": ["h9", "h10"], "d": "h13", "streams": 2}]
    assert busy["credits"] == [{"d": "h13", "used": 1, "total": 2, "streams": 2},
                               {"d": "h5", "used": 2, "total": 2, "streams": 3}]

    decoding = state.snapshot(T0 + 2.0)["requests"]["in_flight"][0]
    assert decoding["state"] == "decode" and decoding["streams"] == 0

    one_done = state.snapshot(T0 + 2.5)
    assert [r["id"] for r in one_done["requests"]["in_flight"]] == ["r1", "r2"]
    assert (one_done["requests"]["done"], one_done["requests"]["failed"]) == (1, 0)
    assert one_done["credits"] == [{"d": "h13", "used": 1, "total": 2, "streams": 2},
                                   {"d": "h5", "used": 1, "total": 2, "streams": 1}]
    assert one_done["warnings"] == ["KV P99 above the target"]

    end = state.snapshot(T0 + 3.5)
    assert [r["id"] for r in end["requests"]["in_flight"]] == ["r1"]
    assert (end["requests"]["done"], end["requests"]["failed"]) == (1, 1)
    assert end["credits"] == [{"d": "h13", "used": 0, "total": 2, "streams": 0},
                              {"d": "h5", "used": 1, "total": 2, "streams": 1}]


# ------------------------------------------------------------ a finished run's files
LOAD_HEADER = ["t", "node", "port", "peer", "peer_port", "bytes", "mbps"]


def write_load_csv(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(LOAD_HEADER)
        writer.writerows(rows)
    return path


def test_load_csv_reads_as_load_events(tmp_path):
    path = write_load_csv(tmp_path / LOAD_FILE, [
        [f"{T0 + 1:.6f}", "s1", 3, "o1", 2, 1000, 15.0],
        [f"{T0 + 1:.6f}", "s2", 1, "h2", 1, 1000, 14.5],
        [f"{T0 + 1.5:.6f}", "s1", 3, "o1", 2, 2000, 16.0]])
    assert load_events(path) == [
        {"kind": "load", "t": T0 + 1, "links": [["s1", 3, "o1", 2, 15.0],
                                                 ["s2", 1, "h2", 1, 14.5]]},
        {"kind": "load", "t": T0 + 1.5, "links": [["s1", 3, "o1", 2, 16.0]]}]


def test_a_hosts_side_of_its_link_lands_on_that_link_in_its_direction(tmp_path):
    # load.csv's host rows (node = the host, counted at its switch port's rx).
    path = write_load_csv(tmp_path / LOAD_FILE, [
        [f"{T0 + 1:.6f}", "s1", 1, "h1", 1, 1000, 2.0],
        [f"{T0 + 1:.6f}", "h1", 1, "s1", 1, 5000, 8.0]])
    [event] = load_events(path)
    assert event["links"] == [["s1", 1, "h1", 1, 2.0], ["h1", 1, "s1", 1, 8.0]]
    state = state_of([make_testbed(OCS_SPEC, OCS_SCALE), event])
    link = link_at(state.snapshot(T0 + 1.5), "h1", 1)
    sent = {(link["a"], link["b"]): link["mbps_ab"], (link["b"], link["a"]): link["mbps_ba"]}
    assert sent == {("h1", "s1"): 8.0, ("s1", "h1"): 2.0}
    assert link["mbps"] == 8.0 and link["util"] == pytest.approx(8.0 / 20.0)


def test_a_malformed_load_csv_names_its_file_and_line(tmp_path):
    path = write_load_csv(tmp_path / LOAD_FILE, [
        [f"{T0 + 1:.6f}", "s1", 3, "o1", 2, 1000, 15.0],
        [f"{T0 + 1:.6f}", "s2", "one", "h2", 1, 1000, 14.5]])
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 3 is not a load sample")):
        load_events(path)
    short = tmp_path / "short.csv"
    short.write_text(",".join(LOAD_HEADER) + "\n" + f"{T0},s1,3\n")
    with pytest.raises(ValueError, match=re.escape(f"{short}: line 2 is not a load sample")):
        load_events(short)
    missing = tmp_path / "missing.csv"
    missing.write_text("t,switch,port\n")
    with pytest.raises(ValueError, match=re.escape(f"{missing}: missing column(s)")):
        load_events(missing)


def record_run(run_dir: Path, events) -> Path:
    """A results folder as a run leaves it: events.jsonl from a RunFeed, the
    load samples in load.csv."""
    feed = RunFeed(run_dir / EVENTS_FILE)
    loads = []
    for event in events:
        event = dict(event)
        if event["kind"] == "load":
            loads.append(event)
        feed.emit(event.pop("kind"), **event)
    feed.close()
    write_load_csv(run_dir / LOAD_FILE, [
        [f"{event['t']:.6f}", *link[:4], 0, link[4]] for event in loads
        for link in event["links"]])
    return run_dir


def test_a_recorded_run_replays_as_it_was_shown(tmp_path):
    events = ocs_run()
    state = load_run(record_run(tmp_path / "ocs-reconfig-1", events))
    assert state.span == (T0, T0 + 8.0)
    live = state_of(events)
    for t in (T0 + 2.0, T0 + 4.0, T0 + 6.5):
        assert state.snapshot(t) == dict(live.snapshot(t), status="replay")
    assert state.snapshot()["status"] == "ended"     # the run's own last word


def test_a_run_of_several_testbeds_replays_each_ones_load(tmp_path):
    run_dir = tmp_path / "pd-inference-1"
    feed = RunFeed(run_dir / EVENTS_FILE)
    feed.label = "zcube"
    feed.emit("testbed", **{k: v for k, v in make_testbed(PD_SPEC, PD_SCALE).items()
                            if k != "kind"})
    write_load_csv(run_dir / "zcube" / LOAD_FILE, [[f"{T0 + 1:.6f}", "s1", 1, "h1", 1, 9, 5.0]])
    feed.close()
    snap = load_run(run_dir).snapshot(T0 + 1.5)
    assert snap["testbed"]["label"] == "zcube"
    assert link_at(snap, "h1", 1)["util"] == pytest.approx(0.5)


def test_replay_errors_say_what_is_missing(tmp_path):
    with pytest.raises(ReplayError, match=re.escape(f"{tmp_path / 'nowhere'}: no such "
                                                    "results folder")):
        load_run(tmp_path / "nowhere")
    (tmp_path / "model-run").mkdir()
    with pytest.raises(ReplayError, match=f"no {EVENTS_FILE}; only emulated runs record one"):
        load_run(tmp_path / "model-run")
    early = tmp_path / "early"
    early.mkdir()
    (early / EVENTS_FILE).write_text(json.dumps({"kind": "warning", "t": T0, "text": "x"}) + "\n")
    with pytest.raises(ReplayError, match="no testbed event; the run ended before its network"):
        load_run(early)


def test_replay_errors_name_a_bad_file(tmp_path):
    run_dir = record_run(tmp_path / "run", ocs_run())
    with open(run_dir / LOAD_FILE, "a") as stream:
        stream.write(f"{T0 + 9},s1,x,o1,2,0,1.0\n")
    with pytest.raises(ReplayError, match=re.escape(str(run_dir / LOAD_FILE))):
        load_run(run_dir)
    (run_dir / LOAD_FILE).unlink()
    lines = (run_dir / EVENTS_FILE).read_text().splitlines()
    (run_dir / EVENTS_FILE).write_text("\n".join(lines[:1] + ["{oops"] + lines[1:]) + "\n")
    with pytest.raises(ReplayError, match=re.escape(f"{run_dir / EVENTS_FILE}: line 2")):
        load_run(run_dir)


def test_a_running_schedule_is_stated_and_its_end_too():
    """Rotors change circuits every slot inside the kernel, with no event per
    slot: the snapshot says a schedule runs, and the page's header says so."""
    from emu.view.page import _header

    events = [make_testbed("rotor,tors=4", RFABRIC_SCALE),
              {"kind": "schedule", "t": T0 + 1.0, "epoch": T0 + 1.05, "slot_emulated_s": 0.2,
               "guard_emulated_s": 0.02, "slots": 3, "duty_cycle": 0.9,
               "ocs": ["o1", "o2", "o3"]},
              {"kind": "schedule", "t": T0 + 9.0, "stopped": True}]
    state = state_of(events)
    running = state.snapshot(T0 + 2.0)
    assert running["schedule"]["ocs"] == ["o1", "o2", "o3"]
    assert running["schedule"]["text"] == \
        "o1, o2, o3: 3 slots of 200 ms, each dark 20 ms first (duty 0.90)"
    assert running["recent"][0]["text"].startswith("schedule started: o1, o2, o3")
    assert "schedule running on o1, o2, o3: 3 slots of 200 ms" in _header(running)
    stopped = state.snapshot(T0 + 9.5)
    assert stopped["schedule"] is None and stopped["recent"][0]["text"] == "schedule stopped"
    assert "schedule running" not in _header(stopped)
    assert state.snapshot(T0 + 0.5)["schedule"] is None, "not before it started"
