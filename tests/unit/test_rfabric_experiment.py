"""The rfabric experiment's pure parts, and its iteration runner on a fake testbed:
specs per fabric, the workload's phases, the proxy driven with real timestamps,
exposed vs hidden reconfiguration, metrics and timeline."""

import threading
import time
from types import SimpleNamespace

import pytest

from controllers.proxy_core import ControlProxy
from emu import scenario as scenarios
from emu.experiments import rfabric as rf
from emu.experiments.base import Network
from traffic.scale import Scale
from emu.schema import ScenarioError
from emu.live.cpu import combine_cpu
from emu.live.feed import RunFeed
from topologies import registry
from traffic.workload import build_iteration
from emu.live.replay import FlowResult
from emu.live.rlreplay import IterationRunner, ready_time

SCALE = Scale.from_rates(400, 10, tdf=100)


def settings(**kw):
    base = {k: f.default for k, f in rf.FIELDS.items()}
    base.update(kw)
    return base


# ---------------------------------------------------------------- set-up
def test_specs_match_the_rfabric_gpu_count():
    specs = rf.fabric_specs("rfabric,pods=2,train_pods=1", rf.FABRICS, "piezo")
    assert specs["fattree"] == "fattree,k=4"
    assert specs["clos"] == "clos,gpus=16,radix=8,gpus_per_server=2"
    assert specs["rfabric"].endswith("technology=piezo")
    assert specs["sip-ocs"] == "sip-ocs,gpus=16,technology=piezo"
    for name, spec in specs.items():
        fabric = registry.build(spec)
        assert len(fabric.hosts) == 16, name
        assert fabric.hosts[:3] == ["h1", "h2", "h3"]
    rfab = registry.build(specs["rfabric"])
    assert {rfab.graph.nodes[o]["technology"] for o in rfab.ocs_switches} == {"piezo"}


def test_specs_of_every_fabric_are_pinned():
    assert rf.fabric_specs("rfabric,pods=2,train_pods=1", rf.FABRICS, "piezo") == {
        "fattree": "fattree,k=4", "clos": "clos,gpus=16,radix=8,gpus_per_server=2",
        "fattree-os": "fattree-os,gpus=16,radix=8,gpus_per_server=2",
        "roft": "roft,gpus=16,radix=8,gpus_per_server=2",
        "sip-ocs": "sip-ocs,gpus=16,technology=piezo",
        "rfabric": "rfabric,pods=2,train_pods=1,technology=piezo"}
    assert rf.fabric_specs("rfabric,pods=4,train_pods=2,gpus_per_server=4,radix=16",
                           ["clos", "roft"], "mems") == {
        "clos": "clos,gpus=64,radix=16,gpus_per_server=4",
        "roft": "roft,gpus=64,radix=16,gpus_per_server=4"}
    with pytest.raises(ValueError) as error:
        rf.fabric_specs("rfabric,pods=3,train_pods=1", ["clos", "fattree"], "mems")
    assert str(error.value) == ("rfabric.fabrics: 'fattree' has no k with k^3/4 = 24 GPUs; "
                                "use 'clos' (allowed: fattree, clos, fattree-os, roft, sip-ocs, "
                                "rfabric)")


def test_check_names_the_key_and_the_allowed_values():
    with pytest.raises(ScenarioError, match=r"'rfabric.fabrics' has 'zcube'; allowed: fattree"):
        scenarios.load("rfabric", ["rfabric.fabrics=zcube"])
    with pytest.raises(ScenarioError, match=r"rfabric.fabrics: 'fattree' has no k .* use 'clos'"):
        scenarios.load("rfabric", ["fabric.spec=rfabric,pods=3,train_pods=1"])
    with pytest.raises(ScenarioError, match=r"'rfabric.preset' has 'fast'; allowed: rotornet"):
        scenarios.load("rfabric", ["rfabric.preset=fast"])
    with pytest.raises(ScenarioError, match="repeats a fabric"):
        scenarios.load("rfabric", ["rfabric.fabrics=rfabric,rfabric"])
    with pytest.raises(ScenarioError, match="must be an rfabric spec"):
        scenarios.load("rfabric", ["fabric.spec=fattree,k=4"])
    loaded = scenarios.load("rfabric", ["rfabric.preset=piezo", "rfabric.fabrics=clos,rfabric"])
    assert loaded.section["preset"] == "piezo" and loaded.experiment.network is Network.SERIES


@pytest.mark.parametrize("workload, names", [
    ("toy-moe-16", ["train-pp", "gen-ep", "gen-pd", "gen-af", "response", "train-dp",
                    "weight-sync"]),
    ("toy-16", ["train-pp", "gen-pd", "response", "train-dp", "weight-sync"])])
def test_the_workload_has_the_same_phases_on_every_fabric(workload, names):
    cfg = rf.workload(settings(workload=workload))
    assert cfg.world == 16
    first = None
    for spec in rf.fabric_specs("rfabric", ["fattree", "clos", "rfabric"], "mems").values():
        sched = rf.schedule_for(cfg, registry.build(spec).hosts, SCALE, 4)
        flows = [(f.id, f.src, f.dst, f.bytes) for p in sched.phases for f in p.dag.flows]
        first = first or flows
        assert flows == first, "the same flows whatever the fabric"
    assert sched.names() == names
    assert 10 <= sched.iteration_s <= 20, "an iteration of 10-20 emulated seconds"


def test_the_default_is_the_moe_toy_whose_decode_fits_gen_s():
    """toy-moe-16 is the default; its decode steps at the ~3 ms a step its
    docstring assumes fit the scenario's gen_s, where toy-16's 1K-token
    answers would need 30 times as long (its decode traffic stays in the
    servers, so only the MoE's A/F M2N would show it)."""
    assert rf.FIELDS["workload"].default == "toy-moe-16"
    assert set(rf.WORKLOADS) == {"toy-moe-16", "toy-16"}
    step_s = 0.003
    moe, dense = rf.workload(settings()), rf.workload(settings(workload="toy-16"))
    assert moe.response_len * step_s <= settings()["gen_s"] < 1.5 * moe.response_len * step_s
    assert dense.response_len * step_s > 30 * settings()["gen_s"]
    assert moe.prompt_len == dense.prompt_len and moe.seqs == dense.seqs


# toy-moe-16 (the default) on the 16 hosts of rfabric,pods=2,train_pods=1: (phase,
# window, flows, bytes).
TOY16_PHASES = [
    ("train-pp", "Large", 32, 528 * 2 ** 20),           # 4 lanes x 32 micro-batches x
                                                        # 1,056 tokens x 4 KiB x 2
    ("gen-ep", "Small", 16, 8 * 2 ** 30),               # prefill only, the 2 prefill replicas
                                                        # (A/F's M2N carries the decode's)
    ("gen-pd", "Large", 8, 2 * 2 ** 30),                # 64 requests x 32 MiB of KV
    ("gen-af", "Small", 16, 256 * 2 ** 20),             # 2 lanes x 512 ops x 128 KiB x 2
    ("response", "Large", 4, 64 * 1056 * 8),            # 64 sequences x 1,056 tokens x 8 B
    ("train-dp", "Large", 32, 2e9),                     # dense + experts: 8 ranks x P x 2 B / 4
    ("weight-sync", "Large", 14, 4e9),                  # 1 GB to Gen replica 0, 1 GB to 1-3
]


def test_toy_moe_16_has_ep_and_af_on_the_network():
    cfg = rf.workload(settings())
    assert cfg.model.moe and cfg.model.experts == 8 and cfg.model.top_k == 2
    assert cfg.model.expert_params / cfg.model.params == pytest.approx(0.6, abs=0.01)
    assert cfg.gen.ep == 2 and cfg.train.ep == 1
    assert (cfg.pd_prefill, cfg.pd_decode, cfg.af_attention, cfg.af_ffn) == (1, 1, 1, 1)
    assert {"gen-ep", "gen-af", "gen-pd"} <= set(build_iteration(cfg).kinds())
    fabric = registry.build("rfabric,pods=2,train_pods=1")
    sched = rf.schedule_for(cfg, fabric.hosts, SCALE, 4)
    assert [(p.name, p.window, len(p.dag.flows), p.real_bytes) for p in sched.phases] == \
        TOY16_PHASES
    assert set(sched.off_network) == {"train-tp", "gen-tp"}, "TP stays in the server"
    rank_map = cfg.rank_map(fabric.hosts)
    server = {h: rank_map.server(r) for r, h in enumerate(rank_map.hosts)}
    for name in ("gen-ep", "gen-af"):
        phase = sched.phase(name)
        assert phase.dag.total_bytes() > 0
        assert all(server[f.src] != server[f.dst] for f in phase.dag.flows), \
            f"{name}: every flow leaves its server"
    assert sorted({(f.src, f.dst) for f in sched.phase("gen-af").dag.flows}) == [
        ("h11", "h15"), ("h12", "h16"), ("h15", "h11"), ("h16", "h12")], \
        "the attention replica's lanes (h11, h12) to the FFN replica's (h15, h16) and back"


def test_the_proxy_leaves_gen_ep_and_gen_af_alone():
    """Proactive RFabric proxy over two iterations of the default's (toy-moe-16's)
    schedule: gen-ep and gen-af (Small windows) start without a reconfiguration,
    on demand or ahead, and no other phase's circuits are set for them; the
    Large-window phases do get theirs."""
    fabric = registry.build("rfabric,pods=2,train_pods=1")
    sched = rf.schedule_for(rf.workload(settings()), fabric.hosts, SCALE, 4)
    proxy = ControlProxy(fabric, mode="proactive", tdf=100.0)
    decisions = {}
    base = 0.0
    for it in (1, 2):
        proxy.begin_iteration(base)
        events = sorted([(p.start_s, 1, p) for p in sched.phases] +
                        [(p.planned_end_s, 0, p) for p in sched.phases],
                        key=lambda e: (e[0], e[1], e[2].name))       # ends first
        for offset, starts, phase in events:
            if starts:
                decisions[it, phase.name] = proxy.phase_started(
                    phase.name, phase.kind, base + offset, phase.pairs())
            else:
                proxy.phase_ended(phase.name, base + offset)
        base += sched.iteration_s + 1.0
        proxy.end_iteration(base)
    for it in (1, 2):
        for name in ("gen-ep", "gen-af"):
            decision = decisions[it, name]
            assert decision.requests == [] and not decision.blocking and decision.wait_s == 0, \
                f"iteration {it}: {name} must ride the circuits in place"
            assert proxy.cache[name].name == "rides" and proxy.cache[name].ocs == []
    assert not any(r.phase in ("gen-ep", "gen-af") for r in proxy.reconfigs)
    assert decisions[1, "weight-sync"].requests, "profiling: the weights ask on demand"
    assert any(r.phase == "weight-sync" and r.mode == "proactive" for r in proxy.reconfigs)


def test_ready_time_waits_for_dependencies_and_the_optimizer():
    phase = SimpleNamespace(start_s=2.0, after=("train-dp", "response"), kind="weight-sync",
                            gaps=())
    assert ready_time(phase, 100.0, {"train-dp": 105.0, "response": 101.0}, 3.0) == 108.0
    assert ready_time(phase, 100.0, {"train-dp": 100.5, "response": 101.0}, 0.0) == 102.0
    # The compute owed after a dependency moves with it.
    phase.gaps = (("response", 4.0),)
    assert ready_time(phase, 100.0, {"train-dp": 100.5, "response": 101.0}, 0.0) == 105.0


# ---------------------------------------------------------------- the runner on fakes
class FakeControl:
    """Blocks for the dark time as the controller does, one request at a time."""

    def __init__(self, delay_s):
        self.delay_s, self.calls, self.lock = delay_s, [], threading.Lock()

    def call(self, op, timeout=None, **args):
        with self.lock:
            start = time.time()
            torn = time.time()
            time.sleep(self.delay_s)
            lit = time.time()
            self.calls.append((op, args["ocs"]))
            return {"timestamps": {"start": start, "torn": torn, "lit": lit,
                                   "routes_restored": lit}, "dark_s": lit - torn}


class FakeBed:
    """What the runner uses of a Testbed: ``reconfigure`` through the fake controller,
    then the runner's copy of the fabric takes the circuits (as Testbed.reconfigure)."""

    def __init__(self, fabric, control):
        self.fabric, self.control = fabric, control
        self.ecmp_seed = 1
        self.feed = RunFeed()
        self.events = []                    # what the run's feed heard, in order
        self.feed.subscribe(self.events.append)

    def reconfigure(self, ocs, circuits, timeout_s=60.0, **args):
        reply = self.control.call("reconfigure", timeout=timeout_s, ocs=ocs, circuits=circuits,
                                  **args)
        self.fabric.set_circuits(ocs, circuits)
        return reply


class FakeReplayer:
    """Each flow takes its ideal time at 1 Gbit/s/1000 (fast), all at once."""

    finished_at = None

    def __init__(self, bed, dag, mbps, work_dir, ports, port_key, agents):
        self.dag = dag

    def prepare(self):
        pass

    def close(self):
        pass

    def run(self):
        start = time.time()
        time.sleep(0.02)
        return [FlowResult(f.id, f.src, f.dst, f.bytes, f.step, f.group, start, time.time(),
                           f.bytes, 1.0, 0, "ok") for f in self.dag.flows]


def fake_run(mode, delay_s=0.05, iterations=2):
    """Fast timings: Train 0.3 s, Gen 0.25 s (responses from 0.06 s), optimizer 0.15 s;
    a core change (two planes) takes 0.1 s."""
    fabric = registry.build("rfabric")
    cfg = rf.workload(settings(train_s=0.003, gen_s=0.0025, optimizer_s=0.0015))
    sched = rf.schedule_for(cfg, fabric.hosts, Scale.from_rates(400, 10, tdf=100), 2)
    bed = FakeBed(fabric, FakeControl(delay_s))
    proxy = ControlProxy(fabric, mode=mode, tdf=delay_s / 0.010)     # mems: 10 ms real
    runner = IterationRunner(bed, sched, "/tmp/unused", 10.0, optimizer_s=0.15, proxy=proxy,
                             log=lambda m: None, replayer=FakeReplayer)
    runner.run(iterations)
    return runner, proxy, bed


def test_proactive_hides_reconfiguration_from_iteration_2():
    runner, proxy, bed = fake_run("proactive")
    first, second = runner.iterations
    assert first.exposed_s >= 4 * 0.05 * 0.9, "profiling: response and weight sync wait"
    assert second.exposed_s < first.exposed_s / 2
    rows = rf.proxy_rows(rf.FabricRecord("rfabric", "rfabric", runner.iterations, proxy))
    assert sorted(rows) == [1, 2] and rows[2]["hidden_s"] > 0
    assert len(bed.control.calls) == len(runner.dark_windows())
    core = {o for o in bed.fabric.ocs_switches if bed.fabric.graph.nodes[o]["role"] == "core-ocs"}
    assert {ocs for _, ocs in bed.control.calls} == core
    assert not proxy.warnings


def test_reactive_exposes_every_iteration():
    runner, _, _ = fake_run("reactive")
    first, second = runner.iterations
    assert second.exposed_s >= 0.8 * first.exposed_s > 0


def test_summarize_reports_normalized_throughput_exposure_and_the_timeline():
    runner, proxy, _ = fake_run("proactive")
    ft_runner, _, _ = fake_run("static")
    records = [rf.FabricRecord("fattree", "fattree,k=4", ft_runner.iterations, None, [],
                               ft_runner.base),
               rf.FabricRecord("rfabric", "rfabric", runner.iterations, proxy,
                               runner.dark_windows(), runner.base)]
    flows = ft_runner.flows("fattree") + runner.flows("rfabric")
    assert len({f.id for f in flows}) == len(flows), "unique ids across fabrics and iterations"
    costs = rf.cost_rows(["fattree", "rfabric"], {"fattree": 1.0, "rfabric": 0.9}, 1024, 64)
    outcome = rf.summarize(records, SCALE, flows, costs)
    m = outcome.metrics
    assert m["fattree"]["normalized_throughput_ratio"] == 1.0
    assert m["rfabric"]["normalized_throughput_ratio"] == pytest.approx(
        records[0].steady_s() / records[1].steady_s())
    assert m["rfabric"]["exposed_reconfig_later_s"] < m["rfabric"]["exposed_reconfig_first_s"]
    assert m["rfabric"]["iteration_real_ms"] == pytest.approx(m["rfabric"]["iteration_s"] * 10)
    assert [r["fabric"] for r in m["cost"]] == ["fattree", "rfabric"]
    assert m["cost"][0]["cost_efficiency_ratio"] == pytest.approx(1.0)
    assert len(outcome.steps) == 4
    dark = outcome.timeline["dark_windows"]
    assert dark and all(w["end"] > w["start"] >= 0 for w in dark)
    # The default (toy-moe-16): gen-ep and gen-af get a throughput series and
    # spans of their own, and ride: no reconfiguration row is theirs.
    assert {s["label"] for s in outcome.timeline["series"]} == {
        "train-pp", "gen-ep", "gen-pd", "gen-af", "response", "train-dp", "weight-sync"}
    for kind in ("gen-ep", "gen-af"):
        series = next(s for s in outcome.timeline["series"] if s["label"] == kind)
        assert max(mbps for _, mbps in series["points"]) > 0, kind
        spans = [s for s in outcome.timeline["phase_spans"] if s["phase"] == kind]
        assert {(s["fabric"], s["iteration"]) for s in spans} == {
            (f, i) for f in ("fattree", "rfabric") for i in (1, 2)}, kind
    assert {r["mode"] for r in m["reconfigurations"]} >= {"reactive", "proactive"}
    assert not {r["phase"] for r in m["reconfigurations"]} & {"gen-ep", "gen-af"}


def test_throughput_series_spreads_bytes_over_bins():
    flow = FlowResult("a", "h1", "h2", 1_000_000, 0, "x", start=10.0, end=12.0,
                      status="ok")
    series = rf.throughput_series([flow], 10.0, bin_s=0.5)["x"]
    assert [p[0] for p in series] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert series[0][1] == pytest.approx(4.0) and series[-1][1] == 0.0


def test_cpu_summaries_combine_weighted():
    a = {"machine_cpu_pct": {"mean": 10.0, "max": 20.0}, "cores": 2, "samples": 1,
         "interval_s": 0.5, "processes": {"ovs-vswitchd": {"mean_pct_of_core": 10.0,
                                                            "max_pct_of_core": 30.0,
                                                            "pids": [1], "found": True}}}
    b = {"machine_cpu_pct": {"mean": 40.0, "max": 50.0}, "cores": 2, "samples": 3,
         "interval_s": 0.5, "processes": {"ovs-vswitchd": {"mean_pct_of_core": 50.0,
                                                            "max_pct_of_core": 60.0,
                                                            "pids": [2], "found": True}}}
    both = combine_cpu([a, b])
    assert both["machine_cpu_pct"] == {"mean": pytest.approx(32.5), "max": 50.0}
    assert both["processes"]["ovs-vswitchd"]["pids"] == [1, 2] and both["samples"] == 4
    assert combine_cpu([]) is None


def test_nothing_is_sent_for_an_iteration_after_the_last():
    runner, proxy, bed = fake_run("proactive", iterations=1)
    sent = len(bed.control.calls)
    assert sent == 4, "iteration 1: response and weight sync, two core planes each"
    assert len(proxy.reconfigs) > sent, "the proxy planned iteration 2 all the same"
    assert all(r.iteration == 2 for r in proxy.reconfigs[sent:])


def test_cost_rows_take_the_ft_reference_first():
    rows = rf.cost_rows(["fattree", "clos", "rfabric"],
                        {"fattree": 1.0, "clos": 1.2, "rfabric": 0.9}, 1024, 64)["rows"]
    by = {r["fabric"]: r for r in rows}
    assert by["fattree"]["throughput_ratio"] == by["clos"]["throughput_ratio"] == 1.0
    assert by["fattree"]["cost_model"] == "FT"
    assert by["rfabric"]["cost_efficiency_ratio"] == pytest.approx(
        0.9 / by["rfabric"]["cost_total_usd"] * by["fattree"]["cost_total_usd"])


# ---------------------------------------------------------------- the run's feed
def _phase_events(bed, iteration):
    return [e for e in bed.events if e["kind"] == "phase" and e["iteration"] == iteration]


def test_the_feed_hears_each_phase_start_then_its_end_within_its_iteration():
    runner, proxy, bed = fake_run("reactive")
    told = [(e["state"], e["iteration"]) for e in bed.events if e["kind"] == "iteration"]
    assert told == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    position = {id(e): i for i, e in enumerate(bed.events)}
    for it in runner.iterations:
        first, last = [e for e in bed.events
                       if e["kind"] == "iteration" and e["iteration"] == it.iteration]
        assert last["duration_s"] == pytest.approx(it.duration_s)
        phases = _phase_events(bed, it.iteration)
        assert all(position[id(first)] < position[id(e)] < position[id(last)]
                   for e in phases), "a phase is told within its iteration"
        for run in it.phases:
            mine = [e for e in phases if e["name"] == run.name]
            assert [e["state"] for e in mine] == ["start", "end"], mine
            start, end = mine
            assert start["t"] == run.start and end["t"] == run.end
            assert end["duration_s"] == pytest.approx(run.duration_s) and end["ok"]
            phase = next(p for p in runner.schedule.phases if p.name == run.name)
            assert start["flows"] == len(phase.dag.flows) > 0
            assert start["template"] == proxy.cache[run.name].name
            assert start["stall_s"] == pytest.approx(run.stall_s)


def test_a_phase_tells_the_circuits_the_proxy_asked_for_it_on_demand_or_ahead():
    for mode, later in (("reactive", "reactive"), ("proactive", "proactive")):
        runner, proxy, bed = fake_run(mode)
        asked = 0
        for it in (1, 2):
            for start in (e for e in _phase_events(bed, it) if e["state"] == "start"):
                records = [r for r in proxy.reconfigs
                           if r.iteration == it and r.phase == start["name"]]
                if not records:
                    assert start["circuits"] is None, start
                    continue
                asked += 1
                assert start["circuits"] == {r.ocs: r.request["circuits"] for r in records}
                assert start["template"] == records[0].template
                if it == 2:
                    assert {r.mode for r in records} == {later}, (mode, records)
        assert asked >= 4, f"{mode}: response and weight sync ask for circuits every iteration"


def test_a_static_proxy_tells_no_template_and_no_circuits():
    _, _, bed = fake_run("static", iterations=1)
    starts = [e for e in _phase_events(bed, 1) if e["state"] == "start"]
    assert len(starts) == 7, "toy-moe-16's phases, gen-ep and gen-af included"
    assert all(e["template"] is None and e["circuits"] is None for e in starts)


class BrokenReplayer(FakeReplayer):
    """The response phase's replay breaks off (an agent died, say)."""

    def __init__(self, bed, dag, mbps, work_dir, ports, port_key, agents):
        super().__init__(bed, dag, mbps, work_dir, ports, port_key, agents)
        self.broken = str(work_dir).endswith("/response")

    def run(self):
        if self.broken:
            raise RuntimeError("host agent on h9 exited during the replay")
        return super().run()


def test_a_phase_whose_replay_breaks_off_still_ends_on_the_feed_failed():
    fabric = registry.build("rfabric")
    cfg = rf.workload(settings(train_s=0.003, gen_s=0.0025, optimizer_s=0.0015))
    sched = rf.schedule_for(cfg, fabric.hosts, Scale.from_rates(400, 10, tdf=100), 2)
    bed = FakeBed(fabric, FakeControl(0.01))
    runner = IterationRunner(bed, sched, "/tmp/unused", 10.0, optimizer_s=0.15,
                             log=lambda m: None, replayer=BrokenReplayer)
    with pytest.raises(RuntimeError, match="response: RuntimeError: host agent"):
        runner.run(2)
    response = [e for e in _phase_events(bed, 1) if e["name"] == "response"]
    assert [e["state"] for e in response] == ["start", "end"]
    assert response[0]["template"] is None and response[0]["circuits"] is None, "no proxy"
    assert response[1]["ok"] is False
    whole = [("start", None), ("end", True)]
    # Phases that started before the response broke off run to their end; the
    # weight sync waits for the response, so it never starts (nor is told);
    # the DP all-reduce starts or not, as its time came before the break or not.
    for name, expected in (("train-pp", [whole]), ("gen-pd", [whole]),
                           ("train-dp", [whole, []]), ("weight-sync", [[]])):
        told = [(e["state"], e.get("ok")) for e in _phase_events(bed, 1) if e["name"] == name]
        assert told in expected, (name, told)
    told = [(e["state"], e["iteration"], e.get("ok")) for e in bed.events
            if e["kind"] == "iteration"]
    assert told == [("start", 1, None), ("end", 1, False)], "no iteration after a failed one"
