"""What serving a planned stream takes from a run, and what it tells the run's feed (on a
fake replay; the replay itself is integration-tested)."""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import pytest

from emu.experiments import pd_setup
from emu.experiments.pd_serve import ServeSettings, kv_window_bytes, serve
from emu.live.feed import RunFeed, read_events
from topologies import registry
from traffic import fastlane, kvwindow
from traffic.pdplan import plan
from traffic.results import FlowResult
from traffic.scale import Scale

SCALE = Scale.from_rates(200, 10, tdf=10)


def _ctx(**section):
    return SimpleNamespace(settings=section, scale=SCALE,
                           scenario=SimpleNamespace(config={"scale": {"link_mbps": 10.0}}))


def test_settings_come_from_the_run_and_default_where_a_scenario_has_no_key():
    plain = ServeSettings.from_context(_ctx(path_credits=0))
    assert plain == ServeSettings(10.0, SCALE, None, 1, fastlane.WAIT)
    lanes = ServeSettings.from_context(_ctx(path_credits=2, lane_capacity=3,
                                            lane_when_busy=fastlane.EXPANDER))
    assert (lanes.path_credits, lanes.lane_capacity, lanes.lane_when_busy) == \
        (2, 3, fastlane.EXPANDER)


def _planned(*flows_per_request):
    return [SimpleNamespace(transfer=SimpleNamespace(dag=SimpleNamespace(flows=[None] * n)))
            for n in flows_per_request]


def test_the_kv_window_counts_the_flows_of_the_streams_a_d_admits():
    bed = SimpleNamespace(queue_packets=41, mtu=1500)
    # Two credits of two-flow requests: 4 flows share a queue, 10 segments each.
    assert kv_window_bytes(bed, _planned(2, 2, 1), kvwindow.BOUNDED, 2) == 10 * 1448
    # Four flows per request (two ranks, two NIC ports each): 8 flows, 5 segments.
    assert kv_window_bytes(bed, _planned(4, 2), kvwindow.BOUNDED, 2) == 5 * 1448
    # Without credits, the text's smallest D limit (2) is counted.
    assert kv_window_bytes(bed, _planned(2), kvwindow.BOUNDED, None) == 10 * 1448
    assert kv_window_bytes(bed, _planned(2), kvwindow.TCP, 2) == 0


def test_the_kv_window_rule_comes_from_the_scenario_and_defaults_to_bounded():
    assert ServeSettings.from_context(_ctx()).kv_window == kvwindow.BOUNDED
    assert ServeSettings.from_context(_ctx(kv_window="tcp")).kv_window == kvwindow.TCP


# ---------------------------------------------------------------- the run's feed
ZCUBE = "zcube,n=4,gpus_per_server=2"
STREAM = dict(workload="deep-thinking", requests=5, rate_per_s=30.0, seed=1, tp=2,
              placement="tiles", tile="3p2d")


class StepReplayer:
    """Stands in for `Replayer` with its hooks: each pass asks the gate about
    every flow not yet admitted, in plan order, starts those it admits, then
    ends the flow started first (one time unit later).  A flow in ``fail``
    ends failed; one in ``move`` is cancelled and resent (``<id>~m1``) once."""

    def __init__(self, bed, dag, mbps, work_dir, *, gate, on_done, on_start, on_moved,
                 fail=(), move=(), **_options):
        self.flows = {f.id: f for f in dag.flows}
        self.gate, self.on_done, self.on_start, self.on_moved = gate, on_done, on_start, on_moved
        self.fail, self.move = set(fail), set(move)
        self.t0 = 1000.0
        self.results = []

    def _start(self, fid, now, started, running):
        self.on_start(self.flows[fid])
        started[fid] = now
        running.append(fid)

    def run(self):
        now, admitted, started, running = self.t0, set(), {}, []
        order = list(self.flows)
        while len(self.results) < len(order):
            for fid in order:
                if fid not in admitted and self.gate(self.flows[fid]):
                    admitted.add(fid)
                    self._start(fid, now, started, running)
            assert running, "the gate holds every flow and none runs: a stall"
            fid = running.pop(0)
            now += 1.0
            if fid in self.move:
                self.move.discard(fid)
                new_id = f"{fid}~m1"
                self.flows[new_id] = dataclasses.replace(self.flows[fid], id=new_id)
                self.on_moved(fid, new_id)
                order.insert(order.index(fid) + 1, new_id)
                order.remove(fid)       # its record is "moved": not a result here
                continue
            flow = self.flows[fid]
            status = "failed" if fid in self.fail else "ok"
            result = FlowResult(fid, flow.src, flow.dst, flow.bytes, flow.step, flow.group,
                                started[fid], now, flow.bytes, 1.0, 0, status)
            self.results.append(result)
            self.on_done(result)
        return self.results


def _stream():
    """Five requests on two Ds of a 16-GPU ZCube (two NIC ports per GPU), as
    pd-inference plans them."""
    fabric = registry.build(ZCUBE)
    topo = pd_setup.topology(fabric, STREAM["tp"])
    place = pd_setup.make_placement(topo, STREAM)
    planned = plan(topo, place, pd_setup.stream_of(STREAM), SCALE, "fixed", 5.0, STREAM["seed"])
    return fabric, topo, planned


def _bed(fabric, feed):
    """What `serve` uses of a Testbed when the replay is a fake."""
    return SimpleNamespace(fabric=fabric, queue_packets=41, mtu=1500, feed=feed)


def _feed_run(tmp_path, credits=1, **replay):
    """Serve the stream on a `StepReplayer`; the events the feed recorded and told."""
    fabric, topo, planned = _stream()
    feed = RunFeed(tmp_path / "events.jsonl")
    events = []
    feed.subscribe(events.append)
    served = serve(_bed(fabric, feed), planned, ServeSettings(10.0, SCALE), credits,
                   tmp_path / "flows", replayer_class=functools.partial(StepReplayer, **replay))
    feed.close()
    return topo, planned, served, events


def _states(events, rid):
    """A request's states in order, repeats (a new count of streams) folded."""
    states = [e["state"] for e in events if e["kind"] == "request" and e["id"] == rid]
    return [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]


def test_the_feed_hears_each_request_go_kv_decode_done_and_its_ds_credit_up_then_down(
        tmp_path):
    topo, planned, served, events = _feed_run(tmp_path)
    assert served.summary["served_count"] == len(planned) == 5
    assert len({x.d for x in planned}) == 2, "two Ds, so that requests wait for credit"
    d_name = {}
    position = {id(e): i for i, e in enumerate(events)}
    for x in planned:
        mine = [e for e in events if e["kind"] == "request" and e["id"] == x.id]
        assert _states(events, x.id) == ["kv", "decode", "done"], mine
        streams = [e["streams"] for e in mine if e["state"] == "kv"]
        assert streams == list(range(1, len(x.flow_ids) + 1)) + \
            list(range(len(x.flow_ids) - 1, 0, -1)), "each start, then each end but the last"
        assert [e["streams"] for e in mine if e["state"] != "kv"] == [0, 0]
        node = topo.node(x.d)
        # The D is named by its rank-0 GPU's first NIC port, the P by each rank's.
        assert {e["d"] for e in mine} == {node.hosts[0][0]}
        assert mine[0]["d_gpus"] == [rank[0] for rank in node.hosts]
        assert mine[0]["p"] == [rank[0] for rank in topo.node(x.p).hosts]
        d_name.setdefault(x.d, node.hosts[0][0])
        # Its D's credit is taken before its KV goes and given back between its
        # KV's arrival (decode) and its end.
        at = {e["state"]: position[id(e)] for e in mine}     # the last of each state
        first_kv = position[id(mine[0])]
        credits = [(position[id(e)], e["used"]) for e in events
                   if e["kind"] == "credits" and e["d"] == d_name[x.d]]
        assert any(i < first_kv and used == 1 for i, used in credits)
        assert any(at["decode"] < i < at["done"] and used == 0 for i, used in credits)
    for d, name in d_name.items():
        used = [e["used"] for e in events if e["kind"] == "credits" and e["d"] == name]
        assert used == [1, 0] * (len(used) // 2) and used, f"D {name}: one credit, {used}"
        assert {e["total"] for e in events if e["kind"] == "credits" and e["d"] == name} == {1}
    assert len(d_name) == len(set(d_name.values())), "one name per D"
    recorded = read_events(tmp_path / "events.jsonl")
    assert [(e["kind"], e.get("id"), e.get("state")) for e in recorded] == \
        [(e["kind"], e.get("id"), e.get("state")) for e in events], "recorded as told"


def test_without_credits_the_feed_tells_streams_per_d_and_no_limit(tmp_path):
    _, planned, _, events = _feed_run(tmp_path, credits=None)
    credits = [e for e in events if e["kind"] == "credits"]
    assert credits and {e["total"] for e in credits} == {None}
    assert max(e["used"] for e in credits) > 1, "every request starts when due"
    assert all(_states(events, x.id) == ["kv", "decode", "done"] for x in planned)


def test_a_request_with_a_failed_flow_fails_and_a_moved_flow_only_changes_its_streams(
        tmp_path):
    _, _, planned = _stream()
    broken, moved = planned[0].flow_ids[0], planned[1].flow_ids[0]
    _, _, served, events = _feed_run(tmp_path, fail={broken}, move={moved})
    assert _states(events, planned[0].id) == ["kv", "failed"]
    assert _states(events, planned[1].id) == ["kv", "decode", "done"]
    streams = [e["streams"] for e in events
               if e["kind"] == "request" and e["id"] == planned[1].id and e["state"] == "kv"]
    assert streams == [1, 2, 1, 2, 1], "cancelled, then resent, then each end but the last"
    assert served.summary["served_count"] == len(planned) - 1
    last = {}
    for e in events:
        if e["kind"] == "credits":
            last[e["d"]] = e["used"]
    assert set(last.values()) == {0}, "every credit given back, the failed request's too"


def test_a_replay_that_breaks_off_fails_the_requests_it_had_started(tmp_path):
    class Breaking(StepReplayer):
        def run(self):
            self.on_done = self._break
            return super().run()

        def _break(self, result):
            raise RuntimeError("host agent on h9 exited during the replay")

    fabric, _, planned = _stream()
    feed, events = RunFeed(), []
    feed.subscribe(events.append)
    with pytest.raises(RuntimeError, match="exited"):
        serve(_bed(fabric, feed), planned, ServeSettings(10.0, SCALE), 1, tmp_path,
              replayer_class=Breaking)
    started = [x.id for x in planned if _states(events, x.id)]
    assert started and len(started) < len(planned), "credit let some go, not all"
    assert all(_states(events, rid) == ["kv", "failed"] for rid in started)
