"""pd-failure's pure parts: checks, windows, degradation, and the failure event."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest

from emu.experiments import pd_failure as pf
from emu import scenario as scenarios
from topologies import registry
from traffic import failover


def _row(arrival, ttft, kv=0.5, served=True):
    return {"arrival_s": arrival, "served": served, "ttft_s": ttft, "kv_s": kv,
            "kv_end_s": arrival + ttft}


def test_window_splits_by_arrival_at_the_failure():
    rows = [_row(0.0, 1.0), _row(1.0, 1.0), _row(2.0, 1.0), _row(3.0, 1.0)]
    assert [r["arrival_s"] for r in pf.window(rows, False, 2.0)] == [0.0, 1.0]
    assert [r["arrival_s"] for r in pf.window(rows, True, 2.0)] == [2.0, 3.0]


def test_window_figures_count_from_the_failure():
    rows = [_row(2.0, 1.0, kv=0.4), _row(3.0, 2.0, kv=0.6), _row(3.5, 9.0, served=False)]
    figures = pf.window_figures(rows, t_start=2.0)
    assert figures["requests_count"] == 3 and figures["served_count"] == 2
    assert figures["throughput_emu_rps"] == pytest.approx(2 / (5.0 - 2.0))
    assert figures["kv_mean_s"] == pytest.approx(0.5)
    assert figures["ttft_p50_s"] == pytest.approx(1.5)
    assert pf.window_figures([_row(0, 1, served=False)]) == {"requests_count": 1,
                                                            "served_count": 0}


def test_degradation_sign_follows_what_is_better():
    assert pf.degradation_pct(2.0, 1.5, higher_is_better=True) == pytest.approx(25.0)
    assert pf.degradation_pct(2.0, 3.0, higher_is_better=False) == pytest.approx(50.0)
    assert pf.degradation_pct(2.0, 2.5, higher_is_better=True) == pytest.approx(-25.0)
    assert pf.degradation_pct(None, 1.0, True) is None
    compared = pf.compare({"throughput_emu_rps": 4.0, "ttft_p50_s": 1.0},
                          {"throughput_emu_rps": 3.0, "ttft_p50_s": 1.2})
    assert compared["throughput_degradation_pct"] == pytest.approx(25.0)
    assert compared["ttft_p50_increase_pct"] == pytest.approx(20.0)
    assert compared["kv_mean_increase_pct"] is None


def _scenario(tmp_path, **section):
    lines = ['[scenario]', 'kind = "pd-failure"', '[fabric]',
             'spec = "zcube,n=4,gpus_per_server=2"', '[scale]', 'link_mbps = 10.0',
             'tdf = 10.0', '[pd-failure]']
    for key, value in section.items():
        lines.append(f"{key} = {value!r}".replace("'", '"'))
    path = tmp_path / "s.toml"
    path.write_text("\n".join(lines) + "\n")
    return scenarios.load(str(path))


def test_check_refuses_bad_fabrics_switches_and_failure_points(tmp_path):
    pf.check(_scenario(tmp_path))
    with pytest.raises(ValueError, match=r"pd-failure.fabrics: \['railfly'\] not supported; "
                                         "allowed: roft, hpn, zcube"):
        pf.check(_scenario(tmp_path, fabrics=["railfly"]))
    with pytest.raises(ValueError, match="fail_after=30 must be below pd-failure.requests=24"):
        pf.check(_scenario(tmp_path, fail_after=30))
    with pytest.raises(ValueError, match="one fabric"):
        pf.check(_scenario(tmp_path, failed_switch="s1"))
    with pytest.raises(ValueError, match="'s99' is not a ToR of zcube; allowed: auto, s1"):
        pf.check(_scenario(tmp_path, fabrics=["zcube"], failed_switch="s99"))
    pf.check(_scenario(tmp_path, fabrics=["zcube"], failed_switch="s1"))


class _Bed:
    """Takes links down at once; the controller's notice comes when ``seen`` is set."""

    def __init__(self, error=None, fabric=None):
        # One network (ZCube's switches all meet).
        self.fabric = fabric or registry.build("zcube,n=4,gpus_per_server=2")
        self.changed = []
        self.readied = []
        self.seen = threading.Event()
        self.error = error

    def switch_links(self, switch):
        return {(switch, "s9")}

    def ready_links(self, links):
        self.readied.append(sorted(links))

    def change_links(self, links, up):
        self.changed.append((sorted(links), up))
        return "change"

    def wait_links_seen(self, change):
        assert change == "change"
        assert self.seen.wait(5)
        if self.error:
            raise self.error
        return 0.05


class _Replayer:
    def __init__(self, flows, done=()):
        self.flows = {f.id: f for f in flows}
        self.t0 = 0.0
        self.done = set(done)
        self.unarmed = {"g"}
        self.running = {"a", "f"}
        self.calls = []
        self.posted = queue.Queue()

    def post(self, callback):
        self.posted.put(callback)

    def run_posted(self):
        self.posted.get(timeout=5)(self)

    def started(self, fid):
        return fid in self.running

    def move(self, fid, src, dst):
        self.calls.append((fid, src, dst))
        if fid in self.done:
            return None
        return fid if fid in self.unarmed else f"{fid}~m1"


def test_failure_event_fails_the_switch_then_moves_only_flows_behind_it():
    flows = [SimpleNamespace(id="g", src="h1", dst="h8"),    # not armed yet: rehosted
             SimpleNamespace(id="a", src="h1", dst="h9"),    # behind the ToR: moves
             SimpleNamespace(id="b", src="h2", dst="h1"),    # ends on one NIC: stays
             SimpleNamespace(id="c", src="h3", dst="h4"),    # elsewhere: untouched
             SimpleNamespace(id="d", src="h5", dst="h6"),    # GPU cut off: stranded
             SimpleNamespace(id="f", src="h7", dst="h1"),    # already done
             SimpleNamespace(id="h", src="h1", dst="h3")]    # armed, not started: rehosted
    bed = _Bed()
    event = pf.ToRFailure(bed, "s1", {"h1": "h2", "h5": None})
    assert bed.readied == [[("s1", "s9")]] and bed.changed == [], \
        "the links' sockets are opened when the event is made, long before it fires"
    replayer = _Replayer(flows, done={"f"})
    event(replayer)
    assert bed.changed == [([("s1", "s9")], False)], "every link of the switch, down"
    assert replayer.calls == [] and replayer.posted.empty(), \
        "nothing moves before the controller saw the failure, and the loop is not held"
    bed.seen.set()
    replayer.run_posted()
    event.finish()
    assert event.noticed_s == 0.05
    assert event.moved_after_s is not None and event.moved_after_s >= 0, \
        "when the loop moved the flows, counted from the failure"
    # g: h8 (port 1, a B switch) is two switches from h2's B switch; its GPU's
    # port 0, h7, is one link away (ZCube's other path; alive in this map).
    assert replayer.calls == [("a", "h2", "h9"), ("f", "h7", "h2"), ("g", "h2", "h7"),
                              ("h", "h2", "h3")], \
        "flows that started move first (a running one is due again at once), then plan order"
    assert event.moved == ["a"], "only a running flow is resent; a finished one stays"
    assert event.rehosted == ["g", "h"], "a flow not started yet starts from the new port"
    assert event.stranded == ["d"], "a GPU with no surviving port strands its flows"


def test_failure_event_on_hpn_moves_the_other_end_into_the_same_plane():
    """HPN's planes are two networks: a flow whose source fails over to the
    other plane is sent to its destination GPU's port in that plane."""
    fabric = registry.build("hpn,gpus=64,gpus_per_server=2,radix=8")
    nodes = fabric.graph.nodes
    port = {(nodes[h]["gpu"], nodes[h]["nic_port"]): h for h in fabric.hosts}
    src, dst = port[0, 0], port[62, 0]                  # rail 0, segments 0 and 3, plane 0
    tor = failover.host_switch(fabric, src)
    assert failover.host_switch(fabric, dst) != tor
    bed = _Bed(fabric=fabric)
    event = pf.ToRFailure(bed, tor, failover.failover_map(fabric, [tor]))
    replayer = _Replayer([SimpleNamespace(id="a", src=src, dst=dst)])
    event(replayer)
    bed.seen.set()
    replayer.run_posted()
    event.finish()
    assert replayer.calls == [("a", port[0, 1], port[62, 1])], "both ends on plane 1"
    assert event.moved == ["a"] and not event.stranded


def test_failure_event_hands_a_controller_error_to_the_loop_and_to_finish():
    bed = _Bed(error=RuntimeError("the controller did not see it"))
    event = pf.ToRFailure(bed, "s1", {"h1": "h2"})
    replayer = _Replayer([SimpleNamespace(id="a", src="h1", dst="h9")])
    event(replayer)
    bed.seen.set()
    with pytest.raises(RuntimeError, match="did not see it"):
        replayer.run_posted()
    with pytest.raises(RuntimeError, match="did not see it"):
        event.finish()
    assert replayer.calls == []


def test_failure_event_finish_names_a_notice_that_never_came():
    bed = _Bed()
    event = pf.ToRFailure(bed, "s1", {"h1": "h2"})
    event(_Replayer([]))
    with pytest.raises(RuntimeError, match="did not see s1 fail in 0 s"):
        event.finish(timeout_s=0.1)
    bed.seen.set()


def test_repeats_sum_counts_average_figures_and_keep_the_spread():
    same = {"fabric": "zcube", "failed_switch": "s6", "role": "zcube-b"}
    rows = [{**same, "moved_flows_count": 3, "served_count": 8,
             "nic_ports_failed_over_count": 4, "control_notice_ms": 100.0,
             "throughput_degradation_pct": -2.0, "text_degradation_pct": 2.8,
             "mechanism": "m", "kv_window_bytes": 14480},
            {**same, "moved_flows_count": 5, "served_count": 8,
             "nic_ports_failed_over_count": 4, "control_notice_ms": 200.0,
             "throughput_degradation_pct": 6.0, "text_degradation_pct": 2.8,
             "mechanism": "m", "kv_window_bytes": 14480}]
    row = pf.summarize_repeats(rows)
    assert row["moved_flows_count"] == 8 and row["served_count"] == 16
    assert row["nic_ports_failed_over_count"] == 4 and row["text_degradation_pct"] == 2.8
    assert row["control_notice_ms"] == pytest.approx(150.0)
    assert row["throughput_degradation_pct"] == pytest.approx(2.0)
    assert (row["throughput_degradation_min_pct"], row["throughput_degradation_max_pct"]) == \
        (-2.0, 6.0)
    assert row["throughput_degradation_runs_pct"] == [-2.0, 6.0]    # each repeat's
    assert row["repeats_count"] == 2 and row["mechanism"] == "m"
    notes = pf.notes([row])
    assert "8 KV flows moved in 2 run(s)" in notes[1] and "-2.0% to +6.0%" in notes[1]
    assert row["kv_window_bytes"] == 14480, "the window is kept, not summed"
    assert any("window was bounded (bytes: zcube 14480)" in line for line in notes)
