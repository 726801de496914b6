"""``[testbed] engine = "model"`` end to end through `emu.run.main`: no testbed, no
root, the same result files as an emulation.  Every run here is engine=model (or
a kind that builds no network): none starts an emulation."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from emu import run as emu_run
from emu import scenario as scenarios
from topologies import registry


def _main(argv, tmp_path):
    return emu_run.main(list(argv) + ["--out", str(tmp_path)])


def _run_dir(tmp_path: Path) -> Path:
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir


def _result(tmp_path: Path) -> dict:
    return json.loads((_run_dir(tmp_path) / "result.json").read_text())


@pytest.fixture(autouse=True)
def _never_emulate(monkeypatch):
    """A test that reached the emulation path would fail here, not build a network."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("engine=model must never open a testbed")
    monkeypatch.setattr(emu_run, "_emulate", refuse)
    monkeypatch.setattr(emu_run, "lab", refuse)


def _nonroot(monkeypatch):
    monkeypatch.setattr(emu_run.os, "geteuid", lambda: 1000)


# ---------------------------------------------------------------- allreduce
def test_allreduce_on_the_model_writes_a_model_result(tmp_path, monkeypatch, capsys):
    _nonroot(monkeypatch)              # the model needs no root
    assert _main(["allreduce", "--set", "engine=model"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "not an emulation" in out
    run_dir = _run_dir(tmp_path)
    result = _result(tmp_path)
    assert result["status"] == "ok"
    assert result["mode"] == "model"
    assert result["config"]["testbed"]["engine"] == "model"
    cal = result["model"]["calibration"]
    assert 0 < cal["efficiency"] <= 1
    assert {"startup_s", "hop_latency_s", "round_s", "measured", "source"} <= set(cal)
    assert "fidelity" not in result          # nothing was emulated to assess
    ratio = result["metrics"]["completion_over_ideal_ratio"]
    assert 1.0 <= ratio <= 1.2
    assert result["metrics"]["completion_s"] > 0
    assert result["metrics"]["retransmits_count"] == 0
    with (run_dir / "flows.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    hosts = result["metrics"]["hosts_count"]
    assert len(rows) == 2 * (hosts - 1) * hosts          # ring: 2(n-1) steps of n flows
    assert all(r["status"] == "ok" and float(r["duration_s"]) > 0 for r in rows)
    report = (run_dir / "report.md").read_text()
    assert "flow-level model" in report
    assert "not emulated" in report.lower()


def test_model_flows_csv_has_every_start(tmp_path):
    assert _main(["allreduce", "--set", "engine=model"], tmp_path) == 0
    with (_run_dir(tmp_path) / "flows.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows
    blank = [r["id"] for r in rows if r["start_s"] == ""]
    assert not blank, f"{len(blank)} flows without start_s, e.g. {blank[:3]}"


# ---------------------------------------------------------------- rfabric
def test_rfabric_on_the_model(tmp_path, monkeypatch):
    _nonroot(monkeypatch)
    argv = ["rfabric", "--set", "engine=model", "--set", "rfabric.fabrics=fattree,rfabric"]
    assert _main(argv, tmp_path) == 0
    result = _result(tmp_path)
    assert result["status"] == "ok" and result["mode"] == "model"
    metrics = result["metrics"]
    assert metrics["fattree"]["normalized_throughput_ratio"] == pytest.approx(1.0)
    rf = metrics["rfabric"]
    assert rf["normalized_throughput_ratio"] > 0
    assert rf["normalized_throughput_ratio"] == pytest.approx(
        metrics["fattree"]["iteration_s"] / rf["iteration_s"])
    assert rf["exposed_reconfig_first_s"] > 0
    assert rf["exposed_reconfig_first_s"] > rf["exposed_reconfig_later_s"]
    assert metrics["fattree"]["exposed_reconfig_first_s"] == 0
    assert [row["fabric"] for row in metrics["fabrics"]] == ["fattree", "rfabric"]
    iterations = [r for r in metrics["iterations"] if r["fabric"] == "rfabric"]
    assert [r["iteration"] for r in iterations] == [1, 2]
    assert all(r["iteration_s"] > 0 for r in iterations)
    assert metrics["reconfigurations"]
    dark = result["timeline"]["dark_windows"]
    assert dark and all(w["label"].startswith("rfabric ") for w in dark)
    # 3D MEMS 10 ms x tdf 100 = 1 s dark
    assert all(w["end"] - w["start"] == pytest.approx(1.0) for w in dark)
    assert (_run_dir(tmp_path) / "flows.csv").is_file()
    assert "flow-level model" in (_run_dir(tmp_path) / "report.md").read_text()


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("kind", ["ocs-reconfig", "lab"])
def test_kinds_without_a_model_are_refused(kind, tmp_path, capsys):
    assert _main([kind, "--set", "engine=model"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "testbed.engine" in err
    assert kind in err
    modelled = sorted(k for k, e in scenarios.EXPERIMENTS.items() if e.model is not None)
    assert {"allreduce", "rfabric"} <= set(modelled)
    for name in modelled:
        assert name in err
    assert not any(tmp_path.iterdir())          # nothing was run, no results folder


def test_check_refuses_a_kind_without_a_model(tmp_path, capsys):
    assert _main(["ocs-reconfig", "--check", "--set", "engine=model"], tmp_path) == 2
    assert "testbed.engine" in capsys.readouterr().err


def test_cli_is_refused_on_the_model(tmp_path, capsys):
    assert _main(["allreduce", "--set", "engine=model", "--cli"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "--cli" in err and "model" in err
    assert not any(tmp_path.iterdir())


def test_engine_rejects_an_unknown_value(tmp_path, capsys):
    assert _main(["allreduce", "--check", "--set", "engine=simulate"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "testbed.engine" in err and "model" in err


def test_another_calibration_file_is_the_one_the_model_runs_with(tmp_path, capsys):
    from dataclasses import replace

    from traffic.model import calibration

    slower = calibration.dump(replace(calibration.load(), efficiency=0.5, source="halved"),
                              tmp_path / "slower.toml")
    runs = {}
    for name, extra in (("frozen", []), ("slower", ["--set", f"model_calibration={slower}"])):
        out = tmp_path / name
        out.mkdir()
        assert _main(["allreduce", "--set", "engine=model", *extra], out) == 0
        runs[name] = _result(out)
    assert runs["slower"]["model"]["calibration"]["source"] == "halved"
    assert runs["slower"]["model"]["calibration_file"] == str(slower)
    assert runs["frozen"]["model"]["calibration_file"] == "traffic/model/calibration.toml"
    assert runs["slower"]["metrics"]["completion_s"] > \
        1.8 * runs["frozen"]["metrics"]["completion_s"], "half the TCP share: about twice as long"


def test_a_bad_calibration_file_is_named_with_the_key_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[calibration]\nnotice_s = -1\n")
    out = tmp_path / "out"
    out.mkdir()
    assert _main(["allreduce", "--set", "engine=model", "--set",
                  f"model_calibration={bad}"], out) == 2
    err = capsys.readouterr().err
    assert "testbed.model_calibration" in err and str(bad) in err and "notice_s" in err
    assert not any(out.iterdir())
    assert _main(["allreduce", "--check", "--set", "model_calibration=/nowhere.toml"],
                 out) == 2
    assert "/nowhere.toml: no model calibration" in capsys.readouterr().err


def test_engine_model_is_what_makes_a_scenario_model():
    assert scenarios.load("allreduce", ["engine=model"]).models
    assert not scenarios.load("allreduce", ["engine=model"]).emulates
    assert scenarios.load("allreduce").emulates
    assert not scenarios.load("allreduce").models


# ---------------------------------------------------------------- rfabric-scale
def test_rfabric_scale_check_passes(tmp_path, capsys):
    assert _main(["rfabric-scale", "--check"], tmp_path) == 0
    assert "ok (rfabric-scale)" in capsys.readouterr().out


def test_rfabric_scale_check_names_a_bad_key(tmp_path, capsys):
    assert _main(["rfabric-scale", "--check", "--set", "rfabric_scale.fabrics=nope"],
                 tmp_path) == 2
    err = capsys.readouterr().err
    assert "rfabric_scale.fabrics" in err and "nope" in err


TINY = ["--set", "gpus=64", "--set", "sweep=[]", "--set", "fabrics=clos,fattree-os"]


def test_tiny_rfabric_scale_run(tmp_path, monkeypatch):
    _nonroot(monkeypatch)              # a kind that only computes: no root either
    assert _main(["rfabric-scale"] + TINY, tmp_path) == 0
    result = _result(tmp_path)
    assert result["status"] == "ok"
    metrics = result["metrics"]
    rows = {row["fabric"]: row for row in metrics["figure6"]}
    assert set(rows) == {"clos", "fattree-os"}
    assert all(row["gpus_count"] == 64 for row in rows.values())
    assert rows["clos"]["normalized_throughput_ratio"] == pytest.approx(1.0)
    assert rows["fattree-os"]["normalized_throughput_ratio"] == pytest.approx(
        rows["clos"]["iteration_s"] / rows["fattree-os"]["iteration_s"])
    for row in rows.values():
        assert row["iteration_s"] > 0 and row["flows_count"] > 0
    assert metrics["sweep"] == []
    assert metrics["calibration"]["startup_s"] == 0.0       # real world: no emulator overheads
    assert metrics["text_cost_efficiency_ratio"] == pytest.approx(1.81)
    assert (_run_dir(tmp_path) / "phase_flows.csv").is_file()


def test_rfabric_scale_in_two_processes_gives_the_rows_of_one(tmp_path, monkeypatch):
    """The fabrics are modelled in forked processes (``jobs``); the figures do
    not depend on how many: the same rows, in the same order, as in one."""
    _nonroot(monkeypatch)
    rows = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        out.mkdir()
        assert _main(["rfabric-scale"] + TINY + ["--set", f"jobs={jobs}"], out) == 0
        rows[jobs] = [{k: v for k, v in row.items() if k != "model_wall_s"}
                      for row in _result(out)["metrics"]["figure6"]]
    assert [row["fabric"] for row in rows[1]] == ["clos", "fattree-os"]
    assert rows[2] == rows[1]


def test_rfabric_scale_refuses_a_gpu_count_rfabric_cannot_build(tmp_path, capsys):
    from emu.experiments import rfabric_scale
    settings = {k: f.default for k, f in rfabric_scale.FIELDS.items()}
    fabric = registry.build(rfabric_scale.fabric_spec("rfabric", 64, settings))
    assert len(fabric.hosts) != 64          # one PoD of 256 GPUs: not what was asked
    assert _main(["rfabric-scale", "--check", "--set", "gpus=64", "--set", "sweep=mems",
                  "--set", "fabrics=clos,rfabric"], tmp_path) == 2
    assert "rfabric_scale.gpus" in capsys.readouterr().err


def test_fabrics_are_handed_out_in_the_order_that_ends_soonest(monkeypatch):
    from emu.experiments import rfabric_scale
    from emu.experiments.rfabric_scale import FABRICS, MODEL_COST_S, hand_out_order

    def workers(order, jobs, cost=MODEL_COST_S):
        free, taken = [0.0] * jobs, [[] for _ in range(jobs)]
        for index in order:
            slot = free.index(min(free))
            free[slot] += cost[FABRICS[index]]
            taken[slot].append(FABRICS[index])
        return max(free), sorted(sorted(t) for t in taken)

    order = hand_out_order(FABRICS, 2)
    assert sorted(order) == list(range(len(FABRICS)))
    # By these times the longest first is the best: SiP-OCS beside FT and
    # FT-OS, ROFT beside RFabric, 40 s.
    longest_first = sorted(range(len(FABRICS)), key=lambda i: -MODEL_COST_S[FABRICS[i]])
    assert workers(longest_first, 2)[0] == 40.0
    assert workers(order, 2) == (40.0, [["clos", "fattree-os", "sip-ocs"],
                                        ["rfabric", "roft"]])
    # Where it is not (the costs of an earlier morning), every order is tried.
    earlier = {"rfabric": 27.0, "sip-ocs": 30.0, "roft": 28.0, "clos": 14.0,
               "fattree-os": 14.0}
    monkeypatch.setattr(rfabric_scale, "MODEL_COST_S", earlier)
    longest = sorted(range(len(FABRICS)), key=lambda i: -earlier[FABRICS[i]])
    assert workers(longest, 2, earlier)[0] == 58.0
    assert workers(hand_out_order(FABRICS, 2), 2, earlier)[0] == 57.0
    assert hand_out_order(FABRICS, 1) == list(range(len(FABRICS)))
    # Specs with options, an unknown fabric (the median), and many fabrics.
    assert hand_out_order(["rfabric,gpus=64", "hpn,gpus=64"], 2) in ([0, 1], [1, 0])
    many = [f"f{i}" for i in range(8)] + ["sip-ocs"]
    assert hand_out_order(many, 2)[0] == 8
