"""The orchestrrl plots, from a small hand-made result (no emulation, no model run)."""

import copy
import csv
import json

import pytest

from emu.report import write_report
from emu.report.orchestrrl_plots import (LAYERS_PNG, POLICIES_PNG, STEP_PNG, is_orchestrrl,
                                         pick_run, plot_layers, plot_policies, plot_step,
                                         write_orchestrrl_plots)

PNG = b"\x89PNG\r\n\x1a\n"
TDF = 0.5


def _generation(fabric, policy):
    """A generation step: TP2, a rebalance at 4 s real, a switch to TP4 at 6 s real."""
    static = policy == "static"
    segments = [{"index": 0, "tp": 2, "instances": 4, "start_s": 0.0,
                 "compute_s": 10.0 if static else 4.0, "running_at_start": 16}]
    events = []
    if not static:
        segments += [{"index": 1, "tp": 2, "instances": 4, "start_s": 4.0, "compute_s": 2.0,
                      "running_at_start": 9},
                     {"index": 2, "tp": 4, "instances": 2, "start_s": 6.0, "compute_s": 2.0,
                      "running_at_start": 4}]
        events = [{"kind": "rebalance", "at_s": 4.0, "tp_from": 2, "tp_to": 2,
                   "moved_bytes": 1e8},
                  {"kind": "switch", "at_s": 6.0, "tp_from": 2, "tp_to": 4,
                   "moved_bytes": 3e8}]
    return {"fabric": fabric, "policy": policy, "compute_s": sum(s["compute_s"] for s in segments),
            "segments": segments, "events": events}


def _spans(label, iteration, base, dynamic):
    spans = [("train-pp", "train-pp", 0.0, 0.0, 0.2), ("gen-ep", "gen-ep", 0.0, 0.0, 3.5),
             ("train-dp", "train-dp", 0.2, 0.21, 0.8), ("response", "response", 1.0, 1.0, 4.2),
             ("weight-sync", "weight-sync", 4.3, 4.3, 5.5)]
    if dynamic:
        spans += [("gen-migrate0", "gen-migrate", 2.0, 2.0, 2.01),
                  ("gen-config2-tp4", "gen-config", 3.02, 3.03, 3.1)]
    return [{"fabric": label, "iteration": iteration, "phase": name, "kind": kind,
             "ready": base + ready, "start": base + start, "end": base + end}
            for name, kind, ready, start, end in spans]


def _result(at_scale=True):
    fabrics, policies = ("clos", "rfabric"), ("static", "switch", "switch+rebalance")
    rows, generation, spans, dark, runs = [], [], [], [], []
    for f in fabrics:
        for p in policies:
            gain = {"static": 1.0, "switch": 1.15, "switch+rebalance": 1.12}[p]
            rows.append({"fabric": f, "policy": p, "throughput_vs_static_ratio": gain,
                         "compute_only_gain_ratio": gain + 0.05, "iteration_s": 5.5 / gain,
                         "switches_count": int(p != "static")})
            generation.append(_generation(f, p))
            label = f"{f}/{p}"
            runs.append({"fabric": label, "start": 0.0, "end": 11.0})
            for iteration, base in ((1, 0.0), (2, 5.5)):
                spans += _spans(label, iteration, base, p != "static")
            if f == "rfabric":
                dark += [{"start": 5.5, "end": 5.505, "label": f"{label} o1"},
                         {"start": 8.53, "end": 8.535, "label": f"{label} o2"}]
    metrics = {"policies": rows, "generation": generation, "text_gain_ratio": 1.4,
               "switches": [{"fabric": "rfabric", "policy": "switch+rebalance", "iteration": 2,
                             "phase": "gen-config2-tp4", "mode": "proactive",
                             "exposed_s": 0.0, "hidden_s": 0.018}]}
    if at_scale:
        metrics["at_scale"] = [{"gpus_count": g, "fabric": f, "policy": p,
                                "throughput_vs_static_ratio": 1.0 if p == "static" else 0.97,
                                "compute_only_gain_ratio": 1.0 if p == "static" else 0.98}
                               for g in (2048, 4096) for f in fabrics for p in policies]
    series = [{"label": g, "points": [[t * 0.5, 5.0 if 1 <= t <= 20 else 0.0]
                                      for t in range(24)]}
              for g in ("gen-ep", "gen-config", "gen-migrate", "gen-switch", "train-dp")]
    return {"scenario": "orchestrrl", "scale": {"bw_factor": 2.5e-5, "tdf": TDF},
            "metrics": metrics,
            "timeline": {"t0": 0.0, "series": series, "dark_windows": dark,
                         "phase_spans": spans, "fabric_spans": runs}}


def _flows_csv(path):
    """Flows of rfabric/switch+rebalance iteration 2, and a look-alike of another run."""
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["id", "src", "dst", "bytes", "start_s", "end_s", "duration_s",
                         "goodput_mbps", "retransmits", "status", "step", "group"])
        for prefix in ("rfabric-switch-rebalance-i2-", "rfabric-switch-i2-"):
            writer.writerow([f"{prefix}gen-migrate0-0", "h1", "h2", 4000, 7.5, 7.51, 0.01,
                             3.2, 0, "ok", 0, "gen-migrate"])
            writer.writerow([f"{prefix}gen-config2-tp4-switch-0", "h1", "h3", 5000, 8.53,
                             8.54, 0.01, 4.0, 0, "ok", 0, "gen-switch"])
            writer.writerow([f"{prefix}gen-config2-tp4-decode-0", "h1", "h3", 20000, 8.54,
                             8.6, 0.06, 2.7, 0, "ok", 0, "gen-config"])
            writer.writerow([f"{prefix}gen-ep-0", "h1", "h4", 9000, 6.0, 6.1, 0.1,
                             0.7, 0, "ok", 0, "gen-ep"])


def _is_png(path):
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def test_both_plots_are_written_and_non_empty(tmp_path):
    written = write_orchestrrl_plots(_result(), tmp_path)
    assert written == [tmp_path / STEP_PNG, tmp_path / POLICIES_PNG]
    assert all(_is_png(p) for p in written)


def test_the_step_plot_reads_the_runs_own_flows_when_there_are_some(tmp_path):
    _flows_csv(tmp_path / "flows.csv")
    assert plot_step(_result(), tmp_path, tmp_path / STEP_PNG) == tmp_path / STEP_PNG
    assert _is_png(tmp_path / STEP_PNG)


def test_another_scenario_writes_nothing(tmp_path):
    rfabric = {"scenario": "rfabric", "metrics": {
        "fabrics": [{"fabric": "rfabric", "normalized_throughput_ratio": 0.95}]},
        "timeline": {"series": [], "phase_spans": []}}
    rotor = {"scenario": "rotor", "metrics": {"rotor": [
        {"congestion": "cubic", "duty_cycle": 0.5, "goodput_of_bound": 0.8}]}}
    for result in (rfabric, rotor, {"scenario": "x"}, {"scenario": "x", "metrics": None}):
        assert not is_orchestrrl(result)
        assert write_orchestrrl_plots(result, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_the_policies_plot_is_drawn_without_at_scale(tmp_path):
    result = _result(at_scale=False)
    assert "at_scale" not in result["metrics"]
    assert plot_policies(result, tmp_path / POLICIES_PNG) == tmp_path / POLICIES_PNG
    assert _is_png(tmp_path / POLICIES_PNG)


def test_at_scale_alone_still_draws_the_policies_plot(tmp_path):
    result = _result()
    del result["metrics"]["policies"]
    assert plot_policies(result, tmp_path / POLICIES_PNG) == tmp_path / POLICIES_PNG


def test_the_step_is_rfabric_of_the_most_dynamic_policy_at_iteration_2():
    row, iteration = pick_run(_result())
    assert (row["fabric"], row["policy"], iteration) == ("rfabric", "switch+rebalance", 2)


def test_without_switch_rebalance_the_switch_run_is_drawn_at_its_last_iteration():
    result = _result()
    metrics, timeline = result["metrics"], result["timeline"]
    metrics["generation"] = [g for g in metrics["generation"]
                             if g["policy"] != "switch+rebalance"]
    timeline["phase_spans"] = [s for s in timeline["phase_spans"] if s["iteration"] == 1]
    row, iteration = pick_run(result)
    assert (row["fabric"], row["policy"], iteration) == ("rfabric", "switch", 1)


@pytest.mark.parametrize("strip", [
    lambda r: r["metrics"].pop("generation"),
    lambda r: [g.update(segments=[]) for g in r["metrics"]["generation"]],
])
def test_no_generation_step_no_step_plot_but_the_policies_plot(tmp_path, strip):
    result = _result()
    strip(result)
    assert plot_step(result, tmp_path, tmp_path / STEP_PNG) is None
    assert write_orchestrrl_plots(result, tmp_path) == [tmp_path / POLICIES_PNG]


def test_missing_timeline_and_keys_are_tolerated(tmp_path):
    result = _result()
    del result["timeline"]
    del result["scale"]
    for key in ("switches", "text_gain_ratio"):
        del result["metrics"][key]
    written = write_orchestrrl_plots(result, tmp_path)
    assert written == [tmp_path / STEP_PNG, tmp_path / POLICIES_PNG]
    assert all(_is_png(p) for p in written)


def test_nothing_usable_in_the_rows_draws_no_policies_plot(tmp_path):
    result = _result(at_scale=False)
    for row in result["metrics"]["policies"]:
        row["throughput_vs_static_ratio"] = row["compute_only_gain_ratio"] = None
    assert plot_policies(result, tmp_path / POLICIES_PNG) is None


def test_the_report_writer_draws_and_lists_them(tmp_path):
    result = copy.deepcopy(_result())
    (tmp_path / "result.json").write_text(json.dumps(result))
    _flows_csv(tmp_path / "flows.csv")
    written = write_report(tmp_path)
    assert tmp_path / STEP_PNG in written and tmp_path / POLICIES_PNG in written
    report = (tmp_path / "report.md").read_text()
    assert STEP_PNG in report and POLICIES_PNG in report


def _with_layers():
    """The result with a layer-wise Train chain in rfabric/switch+rebalance's
    iterations, its reconfigurations on o3 and their dark windows."""
    result = copy.deepcopy(_result())
    label = "rfabric/switch+rebalance"
    timeline, layers = result["timeline"], []
    for iteration, base in ((1, 0.0), (2, 5.5)):
        t = base
        for block, kind in ((0, "cp"), (0, "ep"), (1, "cp"), (1, "ep")):
            wait = 0.005 if iteration == 1 else 0.0
            name = f"train-f{block}-{kind}"
            timeline["phase_spans"].append({"fabric": label, "iteration": iteration,
                                            "phase": name, "kind": f"train-{kind}",
                                            "ready": t, "start": t + wait, "end": t + 0.02})
            timeline["dark_windows"].append({"start": t - 0.004 + wait, "end": t + wait,
                                             "label": f"{label} o3"})
            layers.append({"fabric": "rfabric", "policy": "switch+rebalance",
                           "iteration": iteration, "phase": name, "kind": f"train-{kind}",
                           "ocs": ["o3"], "template": "train-layer",
                           "mode": "reactive" if iteration == 1 else "proactive",
                           "exposed_s": wait, "hidden_s": 0.005 - wait})
            t += 0.04
    result["metrics"]["layers"] = layers
    return result


def test_the_layers_plot_draws_both_iterations_of_the_chain(tmp_path):
    written = write_orchestrrl_plots(_with_layers(), tmp_path)
    assert written == [tmp_path / STEP_PNG, tmp_path / LAYERS_PNG, tmp_path / POLICIES_PNG]
    assert _is_png(tmp_path / LAYERS_PNG)


def test_no_layer_wise_chain_no_layers_plot(tmp_path):
    assert plot_layers(_result(), tmp_path / LAYERS_PNG) is None, \
        "train-pp and train-dp alone are not a layer-wise chain"
    assert not (tmp_path / LAYERS_PNG).exists()


def test_the_step_plot_draws_the_m2n_phases_and_flows_apart_from_gen_ep(tmp_path, monkeypatch):
    """With A/F, the M2N (gen-af) has its own row of phases and its own flow line, in
    its own colour; the segment after the switch is anchored at its phases."""
    from emu.report import orchestrrl_plots as plots
    result = _result(at_scale=False)
    for row in result["metrics"]["generation"]:
        row["af"] = "1:1"
    label = "rfabric/switch+rebalance"
    result["timeline"]["phase_spans"] = [
        s for s in result["timeline"]["phase_spans"] if s["kind"] != "gen-ep"]
    result["timeline"]["phase_spans"].append(
        {"fabric": label, "iteration": 2, "phase": "gen-af2-tp4", "kind": "gen-af",
         "ready": 8.6, "start": 8.6, "end": 8.7})
    _flows_csv(tmp_path / "flows.csv")
    with open(tmp_path / "flows.csv", "a", newline="") as stream:
        csv.writer(stream).writerow(["rfabric-switch-rebalance-i2-gen-af2-tp4-0", "h1", "h4",
                                     12000, 8.6, 8.7, 0.1, 0.96, 0, "ok", 0, "gen-af"])
    figures, original = [], plots.new_figure

    def capture(*args, **kwargs):
        figures.append(original(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(plots, "new_figure", capture)
    assert plot_step(result, tmp_path, tmp_path / STEP_PNG) == tmp_path / STEP_PNG
    top, middle, bottom = figures[0].axes[:3]
    rows = [t.get_text() for t in middle.get_yticklabels()]
    assert "gen-af" in rows and "gen-ep" not in rows
    lines = {line.get_label(): line for line in bottom.get_lines()}
    assert "gen-af" in lines and "gen-config" in lines
    assert lines["gen-af"].get_color() != lines["gen-config"].get_color()
    assert plots.KIND_COLORS["gen-af"] != plots.KIND_COLORS["gen-ep"]
    assert any("A/F 1:1" in line.get_label() for line in top.get_lines())
    assert _is_png(tmp_path / STEP_PNG)
