"""``python -m emu.run pd-calc``: printed figures, result.json metrics, bad input."""

import json

import pytest

from emu import run
from emu.scenario import schema_for
from traffic import kvcache


def result_of(tmp_path):
    (folder,) = tmp_path.iterdir()
    return folder, json.loads((folder / "result.json").read_text())


def test_pd_calc_needs_no_fabric_and_no_root(tmp_path, monkeypatch):
    monkeypatch.setattr(run.os, "geteuid", lambda: 1000)
    assert set(schema_for("pd-calc")) == {"scenario", "pd_calc"}
    assert run.main(["pd-calc", "--out", str(tmp_path)]) == 0
    folder, result = result_of(tmp_path)
    assert result["status"] == "ok" and "fabric" not in result
    assert (folder / "report.md").is_file()


def test_pd_calc_prints_and_records_the_texts_figures(tmp_path, capsys):
    args = ["pd-calc", "--out", str(tmp_path), "--set", "pd_calc.prompt_tokens=32768",
            "--set", "pd_calc.output_tokens=4096"]
    assert run.main(args) == 0
    out = capsys.readouterr().out
    assert "78 x (512 + 64) x 2 = 89,856 B of KV per token" in out
    assert "2.94 GB per request, 368 MB per card at TP=8" in out
    assert "P/D = 2.55:1" in out
    for line in ("0.64:1 (text 0.64:1)", "1.27:1 (text 1.27:1)", "2.55:1 (text 2.55:1)",
                 "1.15:1 (text 1.15:1)", "11.50 GB (~11.5 GB)", "18.22 GB (~18.2 GB)"):
        assert line in out
    assert "binds); N_P =" in out

    _, result = result_of(tmp_path)
    metrics = result["metrics"]
    assert metrics["kv_per_token_bytes"] == 89_856
    assert metrics["kv_per_request_bytes"] == 89_856 * 32_768
    assert metrics["kv_per_card_bytes"] == pytest.approx(89_856 * 32_768 / 8)
    assert metrics["pd_ratio"] == pytest.approx(2.548, abs=1e-3)
    assert metrics["profiles_max_abs_error_ratio"] == pytest.approx(0, abs=1e-9)
    rows = {row["profile"]: row for row in metrics["profiles"]}
    assert {name: row["text_pd_ratio"] for name, row in rows.items()} == {
        "deep-thinking": 0.64, "coding-agent": 1.27, "repo-heavy": 2.55, "cached-coding": 1.15}
    assert [row["prompt"] for row in metrics["kv_table"]] == ["32K", "128K", "200K"]
    terms = {key: metrics[f"n_d_{key}_count"] for key in ("compute", "kv_memory", "kv_ingress")}
    assert metrics["n_d_count"] == max(terms.values())
    assert terms[metrics["n_d_binding"]] == metrics["n_d_count"]


def test_headroom_and_hit_ratio_change_the_ratio(tmp_path, capsys):
    args = ["pd-calc", "--out", str(tmp_path), "--set", "prompt_tokens=32768",
            "--set", "output_tokens=6144", "--set", "hit_ratio=0.4", "--set", "headroom=1.2"]
    assert run.main(args) == 0
    _, result = result_of(tmp_path)
    metrics = result["metrics"]
    assert metrics["pd_ratio"] == pytest.approx(kvcache.pd_ratio(32768, 6144, 0.4) * 1.2)
    assert metrics["effective_input_tokens_count"] == pytest.approx(
        kvcache.effective_input_tokens(32768, 0.4))
    assert "then at h = 1.2" in capsys.readouterr().out
    assert all(row["pd_with_headroom_ratio"] == pytest.approx(row["pd_ratio"] * 1.2)
               for row in metrics["profiles"])


def test_a_tight_kv_memory_makes_memory_bind(tmp_path, capsys):
    args = ["pd-calc", "--out", str(tmp_path), "--set", "pd_calc.kv_memory_gb=10",
            "--set", "pd_calc.model=glm-5.1-fp8"]
    assert run.main(args) == 0
    _, result = result_of(tmp_path)
    assert result["metrics"]["n_d_binding"] == "kv_memory"
    assert result["metrics"]["kv_per_token_bytes"] == 44_928
    assert "(kv memory binds)" in capsys.readouterr().out


@pytest.mark.parametrize("override, message", [
    ("pd_calc.hit_ratio=1.5", "must be <= 1"),
    ("pd_calc.model=gpt-9", "allowed"),
    ("pd_calc.tokens=5", "unknown key"),
])
def test_bad_settings_exit_2_before_running(tmp_path, capsys, override, message):
    assert run.main(["pd-calc", "--out", str(tmp_path), "--set", override]) == 2
    assert message in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_check_validates_the_builtin_file(capsys):
    assert run.main(["pd-calc", "--check"]) == 0
    assert "ok (pd-calc)" in capsys.readouterr().out


def test_list_names_pd_calc_as_a_computation(capsys):
    assert run.main(["--list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "no emulation" in lines["pd-calc"]
