"""``python -m emu.run cost`` and ``fabrics``: the files, the key figures, bad input."""

import csv
import json

import networkx as nx
import pytest

from emu import run
from emu.scenario import schema_for
from topologies import cost
from topologies.fabric import Fabric


def run_folder(tmp_path):
    (folder,) = tmp_path.iterdir()
    return folder


def result_of(folder):
    return json.loads((folder / "result.json").read_text())


def test_list_shows_each_kind_on_one_line(capsys):
    assert run.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert names == sorted(names) and {"allreduce", "cost", "fabrics", "ocs-reconfig"} <= set(names)
    by = {line.split()[0]: line for line in lines}
    assert "Table 6" in by["cost"] and "no emulation" in by["fabrics"]


def test_only_emulation_kinds_have_fabric_scale_and_fidelity():
    assert {"fabric", "scale", "fidelity"} <= set(schema_for("allreduce"))
    assert set(schema_for("cost")) == {"scenario", "cost"}
    assert set(schema_for("fabrics")) == {"scenario", "fabrics"}


def test_cost_writes_the_table_the_plots_and_the_text_comparisons(tmp_path, capsys):
    assert run.main(["cost", "--out", str(tmp_path)]) == 0
    folder = run_folder(tmp_path)
    names = {path.name for path in folder.iterdir()}
    assert {"cost.csv", "cost.md", "cost_vs_gpus.png", "cost_per_gpu.png", "result.json",
            "report.md"} <= names
    assert (folder / "cost_vs_gpus.png").read_bytes()[:4] == b"\x89PNG"
    with open(folder / "cost.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 6 * 2 * len(cost.RFABRIC_FABRICS)
    assert "ZCube Table 6" in (folder / "cost.md").read_text()

    result = result_of(folder)
    assert result["status"] == "ok" and "fabric" not in result and "scale" not in result
    metrics = result["metrics"]
    table6 = {row["fabric"]: row for row in metrics["table6"]}
    assert {name: row["text_million_usd"] for name, row in table6.items()} == \
        {"roft": 93, "rail-only": 76, "hpn": 84, "zcube": 57}
    for row in table6.values():
        assert row["error_pct"] == pytest.approx(
            100 * (row["cost_million_usd"] / row["text_million_usd"] - 1))
        assert abs(row["error_pct"]) <= 15
    assert table6["zcube"]["switches_count"] == 256
    assert metrics["table6_max_abs_error_pct"] == max(abs(r["error_pct"]) for r in table6.values())
    assert metrics["rfabric_over_ft_text_ratio"] == 1.81
    assert metrics["rfabric_over_ft_ratio"] == pytest.approx(1.81, rel=0.05)
    assert len(metrics["rfabric_over_ft"]) == 12
    assert "`rfabric_over_ft_ratio`" in (folder / "report.md").read_text()
    # The report draws the cost plots from result.json and inlines them in report.html.
    with open(folder / "cost.csv") as handle:
        csv_rows = list(csv.DictReader(handle))
    assert [(r["radix"], r["gpus"], r["fabric"]) for r in metrics["network_cost"]] == \
        [(int(r["radix"]), int(r["gpus"]), r["fabric"]) for r in csv_rows]
    assert [r["cost_million_usd"] * 1e6 for r in metrics["network_cost"]] == \
        pytest.approx([float(r["cost_total"]) for r in csv_rows])
    assert (folder / "cost_per_gpu.png").read_bytes()[:4] == b"\x89PNG"
    report_md = (folder / "report.md").read_text()
    assert "![cost_vs_gpus.png](cost_vs_gpus.png)" in report_md
    assert "![cost_per_gpu.png](cost_per_gpu.png)" in report_md
    # Figure 7's main claim: network cost as a share of the GPU cost.
    assert (folder / "cost_share_of_gpu.png").read_bytes()[:4] == b"\x89PNG"
    assert "![cost_share_of_gpu.png](cost_share_of_gpu.png)" in report_md
    assert [r["share_of_gpu_cost_pct"] for r in metrics["network_cost"]] == \
        pytest.approx([100 * float(r["share_of_gpu_cost"]) for r in csv_rows])
    assert (folder / "report.html").read_text().count('<img src="data:image/png;base64,') == 3

    out = capsys.readouterr().out
    assert "ZCube Table 6" in out and "ZCube" in out and "($57M" in out
    assert "RFabric cost-efficiency over FT" in out and "text 1.81x" in out


def test_cost_price_overrides_and_gpu_price(tmp_path, monkeypatch):
    monkeypatch.setattr(run.os, "geteuid", lambda: 1000)      # no root needed
    args = ["cost", "--out", str(tmp_path), "--set", "cost.gpus=4096,16384",
            "--set", "cost.radices=128", "--set", "cost.gpu_price=25000",
            "--set", "cost.prices.ocs.port=800", "--set", "cost.prices.optics.module.400=900"]
    assert run.main(args) == 0
    folder = run_folder(tmp_path)
    result = result_of(folder)
    assert result["config"]["cost"]["prices"] == {"ocs.port": 800.0, "optics.module.400": 900.0}
    with open(folder / "cost.csv") as handle:
        rows = {(int(r["gpus"]), r["fabric"]): r for r in csv.DictReader(handle)}
    assert len(rows) == 2 * len(cost.RFABRIC_FABRICS)
    rfabric = rows[(16384, "rfabric")]
    assert float(rfabric["cost_ocs"]) == int(rfabric["ocs_ports"]) * 800
    assert float(rfabric["share_of_gpu_cost"]) == pytest.approx(
        float(rfabric["cost_total"]) / (16384 * 25000))
    # Dearer OCS ports and 400G optics: RFabric's advantage and ROFT's cost move.
    assert result["metrics"]["rfabric_over_ft_ratio"] < 1.81
    roft = {r["fabric"]: r for r in result["metrics"]["table6"]}["roft"]
    assert roft["cost_million_usd"] > 93


def test_cost_scenario_file_with_nested_price_table(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[scenario]\nkind = "cost"\n\n[cost]\ngpus = [4096]\nradices = [64]\n'
                    'fabrics = ["clos", "rfabric"]\n\n[cost.prices]\nocs.port = 1000\n'
                    'eps = { chassis = 20000 }\n')
    out = tmp_path / "out"
    assert run.main([str(path), "--out", str(out), "--set", "cost.prices.ocs.port=600"]) == 0
    result = result_of(run_folder(out))
    assert result["config"]["cost"]["prices"] == {"ocs.port": 600.0, "eps.chassis": 20000.0}
    assert [row["gpus"] for row in result["metrics"]["rfabric_over_ft"]] == [4096]


def test_fabrics_prints_one_line_per_fabric_and_exports_graphml(tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setattr(run.os, "geteuid", lambda: 1000)      # no root needed
    args = ["fabrics", "--out", str(tmp_path), "--set", "fabrics.gpus=4096",
            "--set", "fabrics.radix=64", "--set", "fabrics.names=roft,zcube,hpn,railfly",
            "--set", "fabrics.export=zcube,n=4", "--set", "fabrics.format=graphml"]
    assert run.main(args) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()]
    assert any(line.startswith("roft: 4,096 GPUs, 320 switches") for line in lines)
    assert sum(line.split(":")[0] in ("roft", "zcube", "hpn", "railfly") for line in lines) == 4

    folder = run_folder(tmp_path)
    metrics = result_of(folder)["metrics"]
    rows = {row["fabric"]: row for row in metrics["fabrics"]}
    assert list(rows) == ["roft", "zcube", "hpn", "railfly"]
    assert rows["roft"]["switches"] == 320 and rows["roft"]["cables"] == 12288
    assert rows["zcube"]["diameter"] == 2
    assert metrics["gpus_count"] == 4096 and metrics["radix_count"] == 64
    assert metrics["export"]["file"] == "zcube_n_4.graphml"
    graph = nx.read_graphml(folder / "zcube_n_4.graphml")
    assert graph.number_of_nodes() == metrics["export"]["nodes_count"]
    assert "zcube_n_4.graphml" in out
    # One plot of the counts, referenced by report.md and inlined in report.html.
    assert (folder / "fabric_counts.png").read_bytes()[:4] == b"\x89PNG"
    assert "![fabric_counts.png](fabric_counts.png)" in (folder / "report.md").read_text()
    assert (folder / "report.html").read_text().count('<img src="data:image/png;base64,') == 1


def test_fabrics_json_export_and_a_fabric_not_built(tmp_path, capsys):
    args = ["fabrics", "--out", str(tmp_path), "--set", "fabrics.gpus=2048",
            "--set", "fabrics.names=zcube,clos", "--set", "fabrics.export=fattree,k=4",
            "--set", "fabrics.format=json"]
    assert run.main(args) == 0
    assert "zcube: not built at 2,048 GPUs" in capsys.readouterr().out
    folder = run_folder(tmp_path)
    metrics = result_of(folder)["metrics"]
    assert metrics["built_count"] == 1 and metrics["not_built_count"] == 1
    assert "square number" in metrics["fabrics"][0]["note"]
    fabric = Fabric.from_json((folder / "fattree_k_4.json").read_text())
    assert len(fabric.hosts) == 16


@pytest.mark.parametrize("scenario,override,named", [
    ("cost", "cost.fabrics=clos,nosuch", ["'cost.fabrics'", "'nosuch'", "rfabric"]),
    ("cost", "cost.prices.ocs.prot=800", ["'cost.prices.ocs.prot'", "ocs.port, optics.fiber"]),
    ("cost", "cost.prices.ocs.port=-1", ["'cost.prices.ocs.port'", ">= 0"]),
    ("cost", "cost.prices.ocs.port=cheap", ["'cost.prices.ocs.port'", "float"]),
    ("cost", "cost.gpus=-4096", ["'cost.gpus'", ">= 1"]),
    ("cost", "cost.gpus=1000,3", ["cost.gpus 3", "cost.fabrics"]),
    ("fabrics", "fabrics.names=roft,nosuch", ["'fabrics.names'", "'nosuch'"]),
    ("fabrics", "fabrics.gpus=-1", ["'fabrics.gpus'", ">= 1"]),
    ("fabrics", "fabrics.export=nosuch,n=4", ["'fabrics.export'", "unknown fabric"]),
    ("fabrics", "fabrics.format=dot", ["'fabrics.format'", "graphml, json"]),
])
def test_bad_input_exits_2_naming_file_and_key(tmp_path, capsys, scenario, override, named):
    out = tmp_path / "out"
    assert run.main([scenario, "--out", str(out), "--set", override]) == 2
    error = capsys.readouterr().err
    assert f"{scenario}.toml" in error
    for text in named:
        assert text in error
    assert not out.exists()


def test_a_fabric_section_is_refused_for_cost(tmp_path, capsys):
    path = tmp_path / "costly.toml"
    path.write_text('[scenario]\nkind = "cost"\n\n[fabric]\nspec = "fattree,k=4"\n')
    assert run.main([str(path), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "costly.toml" in error and "unknown section 'fabric'" in error
    assert not (tmp_path / "out").exists()
