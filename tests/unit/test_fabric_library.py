"""Rail-Fabric's cell ports, RailFly against ZCube on the same switches, and the
commands that print them and the ZCube cell table (no emulation)."""

import json

import pytest

from emu import run
from topologies import catalog, rail_fabric, railfly, registry
from topologies.fabric import FabricError


# ------------------------------------------------------------------ Rail-Fabric
def test_rail_fabric_cell_has_the_texts_48_to_52_ports():
    params = catalog.scaled_params("rail-fabric", 1024, 64)
    assert params["d_degree"] == params["degree"] == 8
    ranges = rail_fabric.port_range(**params)
    # P: 32 downlinks + 8 expander + 8 lanes; D: 32 + 8 + the lanes of 38 P switches.
    lanes = 38 * params["fast_lanes"]
    assert ranges["p-switch"] == (48, 48)
    assert ranges["d-switch"] == (32 + 8 + lanes // 26, 32 + 8 + -(-lanes // 26)) == (51, 52)
    counts = catalog.counts_at_scale("rail-fabric", 1024, 64)
    assert counts.gpus == 1024 and counts.switches == {"p-switch": 38, "d-switch": 26}
    assert {role: ports for role, (ports, _) in counts.switch_ports.items()} == \
        {"p-switch": 48, "d-switch": 52}
    assert all(48 <= low <= high <= 52 for low, high in ranges.values())


def test_rail_fabric_d_centric_variant_is_the_texts_simplified_one():
    ranges = rail_fabric.port_range(**rail_fabric.D_CENTRIC)
    assert ranges == {"p-switch": (40, 40), "d-switch": (40, 40)}     # 32+8 and 28+12
    counts = rail_fabric.counts(**rail_fabric.D_CENTRIC)
    assert counts.gpus == (38 * 32 + 26 * 28) // 2 and not rail_fabric.switch_links(
        64, 8, 0, 26, 12, 1, 32, 28)[1]                                # no fast lanes


def test_rail_fabric_builder_default_d_degree_is_unchanged():
    # The small builds keep their D-heavy expander degree (d + d/2 by default).
    # 4 downlinks + 2 expander + 1 lane; 4 + 3 + the 6 P switches' lanes over 2.
    assert rail_fabric.port_range() == {"p-switch": (7, 7), "d-switch": (10, 10)}


# ------------------------------------------------------------------ RailFly vs ZCube
def test_railfly_against_zcube_on_128_switches_matches_the_text():
    result = railfly.versus_zcube()
    fly, cube = result["rows"]
    assert (fly["switches"], cube["switches"]) == (128, 128)
    assert fly["gpus"] == 16 * 8 * (128 - 7) == result["text"]["railfly_gpus"] == 15488
    assert cube["gpus"] == 64 ** 2 == result["text"]["zcube_gpus"] == 4096
    assert (fly["ports_per_gpu"], cube["ports_per_gpu"]) == (1, 2)
    assert fly["interconnect_pct"] == pytest.approx(7 / 128 * 100)
    assert round(fly["interconnect_pct"], 1) == result["text"]["railfly_interconnect_pct"]
    assert cube["interconnect_pct"] == 50.0
    assert result["ratio"] == pytest.approx(15488 / 4096)
    assert round(result["ratio"], 1) == result["text"]["ratio"] == 3.8


def test_railfly_against_zcube_elsewhere_and_errors():
    result = railfly.versus_zcube(switches=128, radix=64)
    assert result["text"] is None
    assert [row["gpus"] for row in result["rows"]] == [16 * 8 * 57, 2 * 32 ** 2]
    with pytest.raises(FabricError, match="switches must be a multiple of rails=8"):
        railfly.versus_zcube(switches=100)
    with pytest.raises(FabricError, match="not whole ZCube cells of 128 switches"):
        railfly.versus_zcube(switches=64)


def only_folder(path):
    (folder,) = path.iterdir()
    return folder


def test_fabrics_command_prints_railfly_against_zcube(tmp_path, capsys):
    args = ["fabrics", "--out", str(tmp_path), "--set", "fabrics.names=zcube,railfly",
            "--set", "fabrics.gpus=1024"]
    assert run.main(args) == 0
    out = capsys.readouterr().out
    assert "RailFly vs ZCube on the same 128 radix-128 switches" in out
    assert "15,488 GPUs (text ~15,488)" in out and "4,096 GPUs (text 4,096)" in out
    assert "RailFly connects 3.78x the GPUs of ZCube (text ~3.8x)" in out
    metrics = json.loads((only_folder(tmp_path) / "result.json").read_text())["metrics"]
    assert metrics["railfly_over_zcube_gpus_ratio"] == pytest.approx(3.78125)
    assert metrics["railfly_over_zcube_text_ratio"] == 3.8
    assert [row["gpus"] for row in metrics["railfly_vs_zcube"]["rows"]] == [15488, 4096]


def test_fabrics_command_without_the_comparison_and_a_bad_budget(tmp_path, capsys):
    assert run.main(["fabrics", "--out", str(tmp_path / "a"), "--set", "fabrics.compare=[]",
                     "--set", "fabrics.names=zcube"]) == 0
    assert "RailFly vs ZCube" not in capsys.readouterr().out
    assert run.main(["fabrics", "--out", str(tmp_path / "b"),
                     "--set", "fabrics.same_switches=100"]) == 2
    err = capsys.readouterr().err
    assert "fabrics.same_switches 100" in err and "multiple of rails=8" in err


# ------------------------------------------------------------------ ZCube cell table
def test_pd_calc_prints_the_zcube_cell_table(tmp_path, capsys):
    assert run.main(["pd-calc", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ZCube cell table (section 5" in out
    for line in ("1,024 GPUs: 128 nodes, k = 32, 64 ports x 64 switches, 80P / 48D (80P / 48D), "
                 "equivalent ROFT GPUs 1,178 (~1,178)",
                 "4,096 GPUs: 512 nodes, k = 64, 128 ports x 128 switches, 320P / 192D "
                 "(320P / 192D), equivalent ROFT GPUs 4,710 (~4,710)",
                 "16,384 GPUs: 2,048 nodes, k = 128, 256 ports x 256 switches, 1280P / 768D "
                 "(1280P / 768D), equivalent ROFT GPUs 18,842 (~18,842)"):
        assert line in out
    metrics = json.loads((only_folder(tmp_path) / "result.json").read_text())["metrics"]
    cells = metrics["zcube_cells"]
    assert [(c["p_nodes_count"], c["d_nodes_count"]) for c in cells] == \
        [(c["text_p_nodes_count"], c["text_d_nodes_count"]) for c in cells]
    assert metrics["cells_max_abs_error_pct"] < 0.05


def test_pd_calc_cell_table_settings_and_a_bad_cell(tmp_path, capsys):
    assert run.main(["pd-calc", "--out", str(tmp_path / "a"), "--set", "pd_calc.cells=256",
                     "--set", "pd_calc.cell_pd_ratio=1.0", "--set", "pd_calc.roft_gain=1.2"]) == 0
    assert "256 GPUs: 32 nodes, k = 16, 32 ports x 32 switches, 16P / 16D, " \
           "equivalent ROFT GPUs 307" in capsys.readouterr().out
    assert run.main(["pd-calc", "--out", str(tmp_path / "b"), "--set", "pd_calc.cells=2048"]) == 2
    assert "pd_calc.cells has 2048" in capsys.readouterr().err and registry.spec_at(
        "zcube", 1024) == "zcube,n=32"
