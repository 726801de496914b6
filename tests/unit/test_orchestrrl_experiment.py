"""The orchestrrl experiment's pure parts (workload rule, policy, compute-only
time, scenario checks, summary) and the whole kind on the flow-level model
(``engine=model``: no testbed, no root)."""

from __future__ import annotations

import copy
import dataclasses
import json
from types import SimpleNamespace

import pytest

from emu import run as emu_run
from emu import scenario as scenarios
from emu.experiments import orchestrrl as orl
from emu.schema import ScenarioError
from topologies import registry
from traffic import generation as gen
from traffic.generation import Event, GenerationStep, Move, Segment
from traffic.iterations import IterationRun, PhaseRun
from traffic.scale import Scale
from traffic.workload import ComputeTimes, WorkloadError

SPEC32 = "rfabric,pods=2,train_pods=1,servers_per_pod=8,gpus_per_server=2,radix=8"


def settings(**kw):
    base = {k: f.default for k, f in orl.FIELDS.items()}
    base.update(kw)
    return base


# ---------------------------------------------------------------- set-up
@pytest.mark.parametrize("gpus, per_server", [(32, 2), (48, 2), (64, 4), (16, 2)])
def test_emulated_config_splits_the_gpus_in_halves_with_a_server_per_instance(gpus, per_server):
    s = settings(batch_per_gpu=3, prompt_len=200, train_s=0.7, optimizer_s=0.07)
    cfg = orl.emulated_config(s, gpus, per_server)
    lengths, _, _ = gen.load_defaults()
    assert cfg.train_gpus == cfg.gen_gpus == gpus // 2
    assert cfg.train.world == cfg.gen.world == gpus // 2 and cfg.world == gpus
    assert cfg.train.tp == cfg.gen.tp == per_server == cfg.gpus_per_server
    assert (cfg.train.dp, cfg.train.ep, cfg.train.pp) == (2, 2, 2)
    assert cfg.train.cp == gpus // 2 // (4 * per_server) and cfg.cp_comm == "p2p", \
        "both layer types of section 4.3: ring attention's CP, the MoE block's EP"
    assert cfg.gen.ep == 2 and (cfg.af_attention, cfg.af_ffn) == (0, 0)
    assert cfg.gen.dp == gpus // 2 // per_server
    assert cfg.seqs == gpus // 2 * 3, "batch_per_gpu sequences per Gen GPU"
    assert cfg.prompt_len == 200 and cfg.response_len == lengths.median
    assert cfg.compute == ComputeTimes(train_s=0.7, optimizer_s=0.07, gen_s=0.0)
    assert cfg.model is orl.QWEN2_57B_A14B and cfg.model.experts > 1, "MoE: Gen has EP"
    given = ComputeTimes(train_s=9.0, optimizer_s=1.0, gen_s=0.0)
    assert orl.emulated_config(s, gpus, per_server, given).compute == given


def test_the_gen_ranks_land_on_the_gen_pod():
    fabric = registry.build(SPEC32)
    cfg = orl.emulated_config(settings(), len(fabric.hosts), 2)
    rank_map = cfg.rank_map(fabric.hosts)
    roles = {fabric.graph.nodes[rank_map.host(r)]["pod_role"] for r in range(cfg.train.world)}
    assert roles == {"train"}
    roles = {fabric.graph.nodes[rank_map.host(r)]["pod_role"]
             for r in range(cfg.train.world, cfg.world)}
    assert roles == {"gen"}


@pytest.mark.parametrize("gpus, per_server", [(12, 2), (24, 4), (8, 4), (6, 2)])
def test_emulated_config_refuses_gpus_that_do_not_split(gpus, per_server):
    with pytest.raises(WorkloadError, match=rf"^orchestrrl: {gpus} GPUs must split"):
        orl.emulated_config(settings(), gpus, per_server)


@pytest.mark.parametrize("per_server", [1, 2, 4, 8])
def test_policy_params_widen_from_one_server_to_two(per_server):
    params = orl.policy_params(per_server)
    _, _, shipped = gen.load_defaults()
    assert params.tp == per_server and params.switch_tp == 2 * per_server
    assert dataclasses.replace(params, tp=shipped.tp, switch_tp=shipped.switch_tp) == shipped, \
        "everything else as the data file says"


def test_the_generation_step_runs_the_gen_gpus_and_batch():
    cfg = orl.emulated_config(settings(), 32, 2)
    step = orl.generation_step(cfg, "switch", 0)
    assert step.gpus == cfg.gen.world == 16 and len(step.lengths) == cfg.seqs
    assert step.segments[0].tp == 2 and step.segments[-1].tp == 4
    assert [e.kind for e in step.events] == ["switch"]
    assert orl.generation_step(cfg, "switch", 0).lengths == step.lengths, "seeded"
    assert orl.generation_step(cfg, "switch", 1).lengths != step.lengths


@pytest.mark.parametrize("train_s, optimizer_s, step_s, expected", [
    (0.5, 0.05, 22.7, 22.7),          # the generation step is longer
    (30.0, 2.0, 22.7, 32.0),          # Train and its optimizer step are
    (1.0, 1.0, 2.0, 2.0),
])
def test_iteration_compute_is_the_longer_of_train_and_the_step(train_s, optimizer_s, step_s,
                                                                expected):
    cfg = orl.emulated_config(settings(train_s=train_s, optimizer_s=optimizer_s), 32, 2)
    assert orl.iteration_compute_s(cfg, SimpleNamespace(compute_s=step_s)) == \
        pytest.approx(expected)


# ---------------------------------------------------------------- scenario checks
def base_scenario():
    return scenarios.load("orchestrrl", [f"fabric.spec={SPEC32}", "orchestrrl.fabrics=rfabric",
                                         "orchestrrl.policies=static,switch"])


def with_section(scenario, **changes):
    config = copy.deepcopy(scenario.config)
    config["orchestrrl"].update(changes)
    return dataclasses.replace(scenario, config=config)


def test_the_shipped_scenario_loads_and_checks():
    loaded = scenarios.load("orchestrrl")
    assert loaded.kind == "orchestrrl" and loaded.section["policies"][0] == "static"
    orl.check(loaded)
    assert orl.check(base_scenario()) is None


@pytest.mark.parametrize("changes, words", [
    ({"fabrics": []}, r"orchestrrl\.fabrics is empty"),
    ({"policies": []}, r"orchestrrl\.policies is empty"),
    ({"fabrics": ["rfabric", "rfabric"]}, r"orchestrrl\.fabrics repeats an entry"),
    ({"policies": ["static", "switch", "static"]}, r"orchestrrl\.policies repeats an entry"),
    ({"policies": ["switch", "switch+rebalance"]},
     r"orchestrrl\.policies must include 'static' .*allowed: static, switch, switch\+rebalance"),
])
def test_check_refuses_bad_lists_naming_the_key(changes, words):
    with pytest.raises(ValueError, match=words):
        orl.check(with_section(base_scenario(), **changes))


def test_check_refusals_reach_the_scenario_loader():
    with pytest.raises(ScenarioError, match=r"orchestrrl\.policies must include 'static'"):
        scenarios.load("orchestrrl", [f"fabric.spec={SPEC32}", "orchestrrl.policies=switch"])
    with pytest.raises(ScenarioError, match=r"orchestrrl\.fabrics repeats an entry"):
        scenarios.load("orchestrrl", [f"fabric.spec={SPEC32}",
                                      "orchestrrl.fabrics=rfabric,rfabric"])


def test_a_fabric_that_does_not_build_at_the_gpu_count_is_named_under_orchestrrl():
    # The shipped spec has 48 GPUs: no k-ary fat-tree has k^3/4 = 48 hosts.
    with pytest.raises(ScenarioError) as error:
        scenarios.load("orchestrrl", ["orchestrrl.fabrics=fattree,rfabric"])
    assert "orchestrrl.fabrics: 'fattree'" in str(error.value)
    assert "rfabric.fabrics" not in str(error.value)


def test_check_refuses_a_gen_pod_whose_tors_have_one_agg_uplink():
    # Three ToRs per PoD, radix 8 with 3 core uplinks: one agg uplink each.
    spec = "rfabric,pods=2,train_pods=1,servers_per_pod=6,gpus_per_server=2,radix=8,core_uplinks=3"
    with pytest.raises(ScenarioError, match=r"1 agg uplink each; orchestrrl needs 2 or more"):
        scenarios.load("orchestrrl", [f"fabric.spec={spec}", "orchestrrl.fabrics=rfabric"])


def test_check_refuses_a_gpu_count_that_does_not_split():
    # 3 PoDs of 4 GPUs: 12 GPUs, not two halves of whole 2-server pairs.
    spec = "rfabric,pods=3,train_pods=1,servers_per_pod=2,gpus_per_server=2,radix=8"
    with pytest.raises(ScenarioError, match=r"orchestrrl: 12 GPUs must split"):
        scenarios.load("orchestrrl", [f"fabric.spec={spec}", "orchestrrl.fabrics=rfabric"])


# ---------------------------------------------------------------- the summary
def hand_step(policy, compute_s, events=()):
    segment = Segment(0, 2, [(0, 1)], 0.0, compute_s, 10, 4, [1.0], [2])
    return GenerationStep(policy, 2, [5, 5], [segment], list(events), compute_s, 10)


def iteration(index, start, duration, sync_ready, stall=0.0):
    phases = [PhaseRun(index, "gen-ep", "gen-ep", start, start + stall, start + 1.0),
              PhaseRun(index, "weight-sync", "weight-sync", start + sync_ready,
                       start + sync_ready, start + duration)]
    return IterationRun(index, start, start + duration, phases)


def record(fabric, policy, durations, compute_s, events=(), cfg=None, proxy=None):
    cfg = cfg or orl.emulated_config(settings(train_s=0.5, optimizer_s=0.05), 32, 2)
    runs, t = [], 100.0
    for i, duration in enumerate(durations, start=1):
        runs.append(iteration(i, t, duration, duration - 1.0, stall=0.25 * i))
        t += duration
    return orl.PolicyRecord(fabric, f"{fabric},spec", policy, hand_step(policy, compute_s, events),
                            cfg, runs, proxy=proxy, base=100.0)


SWITCH = Event("switch", 5.0, 2, 4, [Move(0, 2, 2e6), Move(1, 3, 1e6)], 0.0, 3e6, 4)
REBALANCE = Event("rebalance", 7.0, 4, 4, [Move(0, 4, 5e5)], 0.0, 5e5, 1)


def test_summarize_gives_the_ratios_by_their_closed_forms():
    records = [record("rfabric", "static", [12.0, 10.0, 10.0], 27.0),
               record("rfabric", "switch+rebalance", [11.0, 8.0, 9.0], 22.5,
                      [SWITCH, REBALANCE]),
               record("clos", "static", [9.0, 6.0], 27.0),
               record("clos", "switch+rebalance", [7.0, 5.0], 18.0, [SWITCH])]
    scale = Scale(bw_factor=1e-3, tdf=0.5)
    outcome = orl.summarize(records, scale, [])
    rows = {(r["fabric"], r["policy"]): r for r in outcome.metrics["policies"]}
    dynamic = rows["rfabric", "switch+rebalance"]
    gain = 10.0 / 8.5                         # static's later mean over this one's
    compute_gain = 27.0 / 22.5                # both far above Train's 0.55 s
    assert dynamic["iteration_s"] == pytest.approx(8.5)
    assert dynamic["iteration_first_s"] == pytest.approx(11.0)
    assert dynamic["throughput_vs_static_ratio"] == pytest.approx(gain)
    assert dynamic["compute_only_gain_ratio"] == pytest.approx(compute_gain)
    assert dynamic["gain_kept_by_network_ratio"] == pytest.approx((gain - 1) / (compute_gain - 1))
    assert dynamic["switches_count"] == 1 and dynamic["rebalances_count"] == 1
    assert dynamic["switch_moved_real_mb"] == pytest.approx(3.0)
    assert dynamic["rebalance_moved_real_mb"] == pytest.approx(0.5)
    assert dynamic["step_s"] == pytest.approx((7.0 + 8.0) / 2), "the weight sync's ready"
    assert dynamic["exposed_first_s"] == pytest.approx(0.25)
    assert dynamic["exposed_later_s"] == pytest.approx((0.5 + 0.75) / 2)
    assert dynamic["iteration_real_ms"] == pytest.approx(8.5 / 0.5 * 1000)
    clos = rows["clos", "switch+rebalance"]
    assert clos["throughput_vs_static_ratio"] == pytest.approx(6.0 / 5.0), \
        "each fabric against its own static"
    assert clos["compute_only_gain_ratio"] == pytest.approx(27.0 / 18.0)
    assert clos["gain_kept_by_network_ratio"] == pytest.approx(0.2 / 0.5)
    static = rows["rfabric", "static"]
    assert static["throughput_vs_static_ratio"] == pytest.approx(1.0)
    assert static["compute_only_gain_ratio"] == pytest.approx(1.0)
    assert static["gain_kept_by_network_ratio"] is None, "no compute gain to keep"
    assert "gain_kept_by_network_ratio" not in outcome.metrics["rfabric/static"]
    assert outcome.metrics["rfabric/switch+rebalance"]["switches_count"] == 1
    assert outcome.metrics["text_gain_ratio"] == orl.TEXT_GAIN
    assert [g["policy"] for g in outcome.metrics["generation"]] == \
        ["static", "switch+rebalance"] * 2
    assert "switches" not in outcome.metrics, "no proxy, no switch rows"
    json.dumps(outcome.metrics)


def test_summarize_when_train_bounds_the_compute_only_iteration():
    slow_train = orl.emulated_config(settings(train_s=40.0, optimizer_s=2.0), 32, 2)
    records = [record("rfabric", "static", [50.0, 44.0], 27.0, cfg=slow_train),
               record("rfabric", "switch", [49.0, 43.0], 22.5, [SWITCH], cfg=slow_train)]
    (_, dynamic) = orl.summarize(records, Scale(), []).metrics["policies"]
    assert dynamic["compute_only_gain_ratio"] == pytest.approx(1.0), "42 s of Train either way"
    assert dynamic["gain_kept_by_network_ratio"] is None
    assert dynamic["throughput_vs_static_ratio"] == pytest.approx(44.0 / 43.0)


def test_switch_rows_keep_the_configuration_phases_of_run_iterations():
    occurrences = [
        {"iteration": 1, "phase": "gen-config1-tp4", "kind": "gen-config",
         "template": "gen-config", "mode": "reactive", "reconfig_s": 0.2, "exposed_s": 0.2,
         "hidden_s": 0.0},
        {"iteration": 1, "phase": "weight-sync", "kind": "weight-sync", "template": "t2g-tree",
         "mode": "reactive", "reconfig_s": 0.4, "exposed_s": 0.4, "hidden_s": 0.0},
        {"iteration": 2, "phase": "gen-config1-tp4", "kind": "gen-config",
         "template": "gen-config", "mode": "proactive", "reconfig_s": 0.2, "exposed_s": 0.0,
         "hidden_s": 0.2},
        {"iteration": 3, "phase": "gen-config1-tp4", "kind": "gen-config",
         "template": "gen-config", "mode": "proactive", "reconfig_s": 0.2, "exposed_s": 0.0,
         "hidden_s": 0.2},
    ]
    proxy = SimpleNamespace(occurrences=lambda: occurrences, warnings=[])
    rec = record("rfabric", "switch", [10.0, 9.0], 22.5, [SWITCH], proxy=proxy)
    rows = orl.switch_rows(rec)
    assert [(r["iteration"], r["mode"]) for r in rows] == [(1, "reactive"), (2, "proactive")], \
        "the weight sync is no switch; iteration 3 was planned, never run"
    assert all(r["fabric"] == "rfabric" and r["policy"] == "switch" for r in rows)
    assert orl.switch_rows(record("clos", "switch", [10.0], 22.5)) == []
    outcome = orl.summarize([record("rfabric", "static", [10.0, 9.5], 27.0), rec], Scale(), [])
    (_, row) = outcome.metrics["policies"]
    assert row["exposed_switch_first_s"] == pytest.approx(0.2)
    assert row["exposed_switch_later_s"] == pytest.approx(0.0)
    assert outcome.metrics["switches"] == rows


# ---------------------------------------------------------------- on the model
@pytest.fixture
def never_emulate(monkeypatch):
    """A test that reached the emulation path would fail here, not build a network."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("engine=model must never open a testbed")
    monkeypatch.setattr(emu_run, "_emulate", refuse)
    monkeypatch.setattr(emu_run, "lab", refuse)
    monkeypatch.setattr(emu_run.os, "geteuid", lambda: 1000)


def test_the_model_engine_at_32_gpus(tmp_path, never_emulate):
    argv = ["orchestrrl", "--set", "engine=model", "--set", f"fabric.spec={SPEC32}",
            "--set", "orchestrrl.fabrics=rfabric",
            "--set", "orchestrrl.policies=static,switch+rebalance",
            "--set", "scale.tdf=0.5", "--set", "orchestrrl.model_gpus=[]",
            "--set", "orchestrrl.layerwise=true", "--out", str(tmp_path)]
    assert emu_run.main(argv) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["mode"] == "model"
    metrics = result["metrics"]
    rows = {r["policy"]: r for r in metrics["policies"]}
    assert set(rows) == {"static", "switch+rebalance"}
    dynamic, static = rows["switch+rebalance"], rows["static"]
    assert dynamic["switches_count"] == 1 and static["switches_count"] == 0
    assert dynamic["switch_moved_real_mb"] > 0 and static["switch_moved_real_mb"] == 0
    assert dynamic["compute_only_gain_ratio"] > 1
    assert static["throughput_vs_static_ratio"] == pytest.approx(1.0)
    assert dynamic["throughput_vs_static_ratio"] == pytest.approx(
        static["iteration_s"] / dynamic["iteration_s"])
    switches = [r for r in metrics["switches"] if r["policy"] == "switch+rebalance"]
    assert {r["template"] for r in switches} == {"gen-config"}
    assert not [r for r in metrics["switches"] if r["policy"] == "static"], \
        "static has no configuration to switch to"
    first = {r["phase"]: r for r in switches if r["iteration"] == 1}
    second = {r["phase"]: r for r in switches if r["iteration"] == 2}
    same = sorted(set(first) & set(second))
    assert same, f"a configuration reconfigured in both iterations: {switches}"
    for phase in same:
        assert first[phase]["mode"] == "reactive" and first[phase]["exposed_s"] > 0, \
            "profiling puts the circuits in on demand"
        assert second[phase]["mode"] == "proactive" and second[phase]["exposed_s"] == 0, \
            "iteration 2 puts them in ahead of the switch"
    assert dynamic["exposed_switch_first_s"] > 0 and dynamic["exposed_switch_later_s"] == 0
    spans = result["timeline"]["phase_spans"]
    riding = [s for s in spans if s["kind"] in ("gen-af", "gen-migrate")]
    assert metrics["assumptions"]["af"] == "1:1", "A/F inside the instances by default"
    assert not [s for s in spans if s["kind"] == "gen-ep"], \
        "with A/F the M2N carries the experts' traffic: no expert all-to-all"
    assert {s["fabric"] for s in spans if s["kind"] == "gen-af"} == \
        {"rfabric/switch+rebalance"}, "a TP-2 instance's M2N stays in its server; TP 4 crosses"
    assert dynamic["af_m2n_real_mb"] > 0
    assert static["af_m2n_real_mb"] == pytest.approx(dynamic["af_m2n_real_mb"]), \
        "every token goes through the M2N once each way, whatever the policy"
    assert not [o for o in metrics.get("switches", []) if o["phase"].startswith("gen-af")], \
        "the proxy asks no circuits for the M2N"
    layers = [r for r in metrics["layers"] if r["policy"] == "static"]
    assert {r["kind"] for r in layers} == {"train-ep"}, \
        "at 32 GPUs a CP pair shares its ToR: attention rides, the MoE block gets circuits"
    assert any(s["kind"] == "train-cp" for s in spans), "the attention layers still run"
    assert (run_dir / "orchestrrl_layers.png").is_file()
    assert all(s["start"] == pytest.approx(s["ready"]) for s in riding), \
        "a phase that rides never waits for circuits"
    assert any(s["kind"] == "gen-config" for s in spans)
    assert not any(s["kind"] == "gen-tp" for s in spans), "the segments replace gen-tp"
    assert metrics["assumptions"]["source"].startswith("traffic/decode.toml")
    assert (run_dir / "report.md").is_file() and (run_dir / "flows.csv").is_file()


def test_the_model_engine_at_48_gpus_alternates_the_layer_types(tmp_path, never_emulate):
    """The scenario's own fabric: ring attention's CP and the MoE block's EP
    cross ToRs with different partners, so the Train circuits change with
    every layer type; iteration 2 puts them in while the layer before computes."""
    argv = ["orchestrrl", "--set", "engine=model", "--set", "orchestrrl.fabrics=rfabric",
            "--set", "orchestrrl.policies=static", "--set", "orchestrrl.model_gpus=[]",
            "--set", "orchestrrl.layerwise=true", "--out", str(tmp_path)]
    assert emu_run.main(argv) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = json.loads((run_dir / "result.json").read_text())["metrics"]
    layers = metrics["layers"]
    assert {r["kind"] for r in layers} == {"train-cp", "train-ep"}
    assert {r["template"] for r in layers} == {"train-layer"}
    first = [r for r in layers if r["iteration"] == 1]
    second = [r for r in layers if r["iteration"] == 2]
    assert len(first) >= 2 * 4 * 2 - 1, "a change at (almost) every layer block and type"
    assert {r["mode"] for r in first} == {"reactive"} and {r["mode"] for r in second} == \
        {"proactive"}
    exposed = [sum(r["exposed_s"] for r in rows) for rows in (first, second)]
    assert exposed[1] < exposed[0], exposed
    assert sum(r["exposed_s"] == 0 for r in second) >= len(second) - 1, \
        "hidden, except where the iteration starts with no window"
    (row,) = metrics["policies"]
    assert row["exposed_layers_later_s"] < row["exposed_layers_first_s"]
