"""bench/model's fabric-order verdict: a pair of fabrics is judged only when
the emulator, by its own measured repeatability, can tell the two apart (or
the model puts them further apart than that), and a judged pair must come
out in the same order."""

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "model"


@pytest.fixture(scope="module")
def bench():
    loader = importlib.machinery.SourceFileLoader("bench_model", str(BENCH))
    spec = importlib.util.spec_from_loader("bench_model", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def pair(order, a, b):
    return next(p for p in order["pairs"] if (p["a"], p["b"]) == (a, b))


def test_fabrics_far_apart_are_judged_and_close_ones_are_not(bench):
    # The emulator scatters +-0.1 s around the model; "slow" is 5 s slower,
    # "near" 0.02 s from "fast" and reversed.
    emulated = {"fast": [10.1, 9.9, 10.1, 9.9], "near": [10.0, 10.0, 9.9, 10.1],
                "slow": [15.1, 14.9, 15.1, 14.9]}
    model = {"fast": [10.0] * 4, "near": [10.02] * 4, "slow": [15.0] * 4}
    order = bench.judged_order(emulated, model)
    assert order["noise"] > 0.05
    assert pair(order, "fast", "slow")["judged"] and pair(order, "fast", "slow")["same"]
    assert not pair(order, "fast", "near")["judged"]
    assert not pair(order, "fast", "near")["same"]       # reversed, but too close to judge
    assert order["same"]


def test_a_gap_wider_than_the_noise_in_the_other_order_is_reversed(bench):
    emulated = {"a": [10.1, 9.9, 10.1, 9.9], "b": [12.1, 11.9, 12.1, 11.9]}
    model = {"a": [12.0] * 4, "b": [10.0] * 4}
    order = bench.judged_order(emulated, model)
    assert pair(order, "a", "b")["judged"] and not pair(order, "a", "b")["same"]
    assert not order["same"]


def test_a_fabrics_constant_offset_from_the_model_is_a_bias_not_noise(bench):
    # The model is 1 s off on "b" in every iteration: no noise at all, so
    # even the 0.5 s gap between the two is judged (and agrees).
    emulated = {"a": [10.0, 10.0, 10.0], "b": [10.5, 10.5, 10.5]}
    model = {"a": [10.0, 10.0, 10.0], "b": [11.5, 11.5, 11.5]}
    order = bench.judged_order(emulated, model)
    assert order["noise"] == pytest.approx(0.0, abs=1e-12)
    assert pair(order, "a", "b")["judged"] and order["same"]


def test_one_steady_iteration_judges_every_pair(bench):
    order = bench.judged_order({"a": [10.0], "b": [10.01]}, {"a": [10.01], "b": [10.0]})
    assert order["samples"] == 1 and order["resolution"] == 0.0
    assert pair(order, "a", "b")["judged"] and not order["same"]


def test_a_single_modelled_value_stands_for_every_repeat(bench):
    # pd-failure: the emulator repeats the failure three times, the model once
    # (it would give the same figure each time); the repeats' spread is the noise.
    emulated = {"roft": [19.9, 20.1, 22.1], "zcube": [20.0, 20.4, 26.5], "hpn": [54, 54.5, 55]}
    model = {"roft": [20.6], "zcube": [16.4], "hpn": [55.8]}
    order = bench.judged_order(emulated, model)
    assert order["samples"] == 3 and order["noise"] > 1.0
    assert pair(order, "roft", "hpn")["judged"] and pair(order, "roft", "hpn")["same"]
    # The model puts ZCube 4.2 points below ROFT, beyond the noise; the emulator
    # has it above: reversed.
    assert pair(order, "roft", "zcube")["judged"] and not order["same"]


def test_phase_flows_split_a_flow_into_transfer_and_process_overhead(bench, tmp_path):
    # 125,000 bytes at 10 Mbit/s is 0.1 s of transfer; the replayer timed 0.12
    # and 0.13 s.  Iteration 1, another fabric whose name starts the same, a
    # failed flow and another phase are left out.
    header = "id,src,dst,bytes,start_s,end_s,duration_s,goodput_mbps,retransmits,status," \
             "step,group,bytes_received,error\n"
    rows = [
        "roft-i1-train-dp-a,h1,h2,125000,0,1,0.500,10.0,0,ok,0,train-dp,125000,",
        "roft-i2-train-dp-a,h1,h2,125000,0,1,0.120,10.0,0,ok,0,train-dp,125000,",
        "roft-i3-train-dp-a,h1,h2,125000,0,1,0.130,10.0,0,ok,0,train-dp,125000,",
        "roft-i3-train-dp-b,h1,h2,125000,0,1,9.000,10.0,0,timeout,0,train-dp,0,",
        "roft-i3-train-pp-a,h1,h2,125000,0,1,0.900,10.0,0,ok,0,train-pp,125000,",
        "roft-os-i2-train-dp-a,h1,h2,125000,0,1,0.900,10.0,0,ok,0,train-dp,125000,",
    ]
    (tmp_path / "flows.csv").write_text(header + "\n".join(rows) + "\n")
    flows = bench.phase_flows(tmp_path, "roft", "train-dp")
    assert flows["flows"] == 2
    assert flows["duration_s"] == pytest.approx(0.125)
    assert flows["transfer_s"] == pytest.approx(0.1)
    assert flows["overhead_s"] == pytest.approx(0.025)
    assert flows["overhead_max_s"] == pytest.approx(0.03)
    line = bench.explain_flows(flows, dict(flows, duration_s=0.104), 0.0043)
    assert "25 ms a flow (up to 30)" in line and "4.3 ms" in line and "modelled 0.104" in line
    assert bench.phase_flows(tmp_path / "gone", "roft", "train-dp") == {}


def test_resends_count_only_flows_cancelled_while_they_ran(bench, tmp_path):
    # r1 ran from 1.0 and was cancelled at 1.5, resent at 1.54; r2 was armed,
    # not started, when it moved (start = end), and keeps its due time 2.0.
    header = "id,src,dst,bytes,start_s,end_s,duration_s,goodput_mbps,retransmits,status," \
             "step,group,bytes_received,error\n"
    rows = [
        "zcube/1/failure:r1,h1,h2,100,1.0,1.5,0.5,0,0,moved,,zcube/failure,50,",
        "zcube/1/failure:r1~m1,h3,h2,100,1.54,2.0,0.46,1,0,ok,,zcube/failure,100,",
        "zcube/1/failure:r2,h1,h2,100,1.5,1.5,0,0,0,moved,,zcube/failure,0,",
        "zcube/1/failure:r2~m1,h3,h2,100,2.0,2.5,0.5,1,0,ok,,zcube/failure,100,",
        "zcube/1/healthy:r1~m1,h3,h2,100,9.0,9.5,0.5,1,0,ok,,zcube/healthy,100,",
        "roft/1/failure:r1~m1,h3,h2,100,9.0,9.5,0.5,1,0,ok,,roft/failure,100,",
    ]
    (tmp_path / "flows.csv").write_text(header + "\n".join(rows) + "\n")
    assert bench.resends(tmp_path, "zcube") == [pytest.approx(0.04)]
    assert bench.resends(tmp_path, "hpn") == []


def test_the_what_if_remodels_one_fabric_with_the_constants_given_and_keeps_the_file(
        bench, tmp_path, monkeypatch):
    """`remodel_with`: a later notice and a slower resend cost ZCube's moved flows
    time, so its degradation grows; the frozen calibration is left as it was."""
    from traffic.model import calibration

    monkeypatch.setattr(bench, "RUNS", tmp_path / "runs")
    frozen = calibration.DATA.read_text()
    as_calibrated = bench.remodel_with("zcube")
    slower = bench.remodel_with("zcube", notice_s=0.08, resend_s=0.07)
    assert slower > as_calibrated + 0.5
    assert calibration.DATA.read_text() == frozen
    assert len(list((tmp_path / "runs").iterdir())) == 2, "one modelled run each, kept"


def test_each_streams_throughput_after_the_failure_is_the_mean_of_its_repeats(bench):
    def window(repeat, run, when, rps):
        return {"fabric": "roft", "repeat": repeat, "run": run, "window": when,
                "throughput_emu_rps": rps}

    result = {"metrics": {"windows": [
        window(1, "healthy", "after", 10.0), window(2, "healthy", "after", 9.0),
        window(1, "healthy", "before", 99.0), window(1, "failure", "after", 8.0),
        window(2, "failure", "after", 7.0), {**window(1, "healthy", "after", 1.0),
                                             "fabric": "zcube"}]}}
    assert bench.stream_throughputs(result, "roft") == {"healthy": 9.5, "failure": 7.5}
    assert bench.stream_throughputs(result, "hpn") == {"healthy": None, "failure": None}


def test_the_validation_runs_as_many_pd_failure_repeats_as_the_scenario_takes(bench):
    # More repeats than the scenario's default, for the resolution; a number the
    # scenario refuses would stop the validation after a quarter of an hour.
    from emu import scenario as scenarios
    from emu.experiments import pd_failure

    default = pd_failure.FIELDS["repeats"].default
    assert bench.PD_FAILURE_REPEATS > default
    loaded = scenarios.load("pd-failure", [f"pd-failure.repeats={bench.PD_FAILURE_REPEATS}"])
    assert loaded.config["pd-failure"]["repeats"] == bench.PD_FAILURE_REPEATS
    with pytest.raises(ValueError, match="repeats"):
        scenarios.load("pd-failure", [f"pd-failure.repeats={bench.PD_FAILURE_REPEATS + 1}"])
