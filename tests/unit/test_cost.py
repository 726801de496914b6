"""Cost model: the price list, ZCube Table 6, the RFabric comparison and the report files."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from topologies import catalog, cost, report
from topologies.counts import FabricCounts


def test_every_price_has_a_source():
    prices = cost.load_prices()

    def entries(table, where=""):
        for key, value in table.items():
            if "usd" in value:
                yield where + key, value
            else:
                yield from entries(value, f"{where}{key}.")

    found = dict(entries(prices))
    assert {"eps.chassis", "eps.port.400", "optics.module.200", "optics.module.400",
            "optics.fiber", "ocs.port", "gpu.price"} <= set(found)
    assert all(v["source"].strip() and v["usd"] >= 0 for v in found.values())


def test_a_price_without_source_is_rejected(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text('[ocs]\nport = { usd = 1 }\n')
    with pytest.raises(cost.PriceError, match="ocs.port has no source"):
        cost.load_prices(path)


def test_switch_price_follows_radix_and_port_speed():
    prices = cost.load_prices()
    one = FabricCounts("x", 0, 0, {"leaf": 1}, {"leaf": (128, 400.0)}, {}, {})
    breakout = FabricCounts("x", 0, 0, {"leaf": 1}, {"leaf": (256, 200.0)}, {}, {})
    assert cost.network_cost(one, prices).switches == 15000 + 128 * 250
    assert cost.network_cost(breakout, prices).total == cost.network_cost(one, prices).total


def test_overrides_by_dotted_key_and_nested_dict():
    counts = catalog.counts_at_scale("rfabric", 1024, 64)
    base = cost.network_cost(counts, cost.load_prices())
    dotted = cost.network_cost(counts, cost.load_prices(overrides={"ocs.port": 1000}))
    nested = cost.network_cost(counts, cost.load_prices(overrides={"ocs": {"port": 1000}}))
    assert dotted.ocs == nested.ocs == 1024 * 1000
    assert dotted.total - base.total == pytest.approx(1024 * 500)
    with pytest.raises(cost.PriceError):
        cost.load_prices(overrides={"ocs.port": "cheap"})
    with pytest.raises(cost.PriceError, match="no price for 'optics.module.1600'"):
        cost.price(cost.load_prices(), "optics.module.1600")


@pytest.mark.parametrize("row", cost.table6_rows(), ids=lambda r: r["fabric"])
def test_table6_reproduced_within_15_percent(row):
    assert row["switches"] == row["text_switches"]
    assert row["cables_by_speed"] == row["text_cables"]
    assert abs(row["cost_error"]) <= 0.15, f"{row['fabric']}: {row['cost_total'] / 1e6:.1f}M"


def test_table6_order_matches_the_text():
    usd = {row["fabric"]: row["cost_total"] for row in cost.table6_rows()}
    assert usd["zcube"] < usd["roft"] and usd["rail-only"] < usd["roft"] \
        and usd["hpn"] < usd["roft"]


@pytest.fixture(scope="module")
def rows():
    return cost.rfabric_rows()


def test_rfabric_rows_cover_every_scale_radix_and_fabric(rows):
    keys = {(r["radix"], r["gpus"], r["fabric"]) for r in rows}
    assert len(keys) == len(rows) == 2 * 6 * len(cost.RFABRIC_FABRICS)
    assert all(r["cost_efficiency"] == pytest.approx(1.0) for r in rows if r["fabric"] == "clos")


@pytest.mark.parametrize("radix,gpus", [(64, 4096), (64, 32768), (128, 16384), (128, 32768)])
def test_rfabric_cost_efficiency_near_the_text_at_three_tier_scale(rows, radix, gpus):
    ratio = cost.rfabric_ratio(rows, radix, gpus)
    assert ratio == pytest.approx(cost.RFABRIC_TEXT_RATIO, rel=0.05)


def test_rfabric_advantage_shrinks_where_ft_needs_two_tiers(rows):
    assert cost.rfabric_ratio(rows, 64, 1024) < 1.3
    assert cost.rfabric_ratio(rows, 128, 8192) < 1.3


def test_performance_weighs_cost_efficiency():
    rows = cost.rfabric_rows([4096], [64], ["clos", "rfabric"],
                             performance={"clos": 1.0, "rfabric": 0.5})
    by = {r["fabric"]: r for r in rows}
    assert by["rfabric"]["cost_efficiency"] == pytest.approx(
        0.5 * by["clos"]["cost_total"] / by["rfabric"]["cost_total"])


def test_gpu_share_uses_the_gpu_price():
    (row,) = cost.rfabric_rows([1024], [64], ["clos"], gpu_price=10000.0)
    assert row["share_of_gpu_cost"] == pytest.approx(row["cost_total"] / (1024 * 10000.0))


def test_cost_table_writes_csv_and_markdown(tmp_path):
    rows = report.cost_table(tmp_path, gpu_counts=[1024, 4096], radices=[64],
                             overrides={"ocs.port": 400})
    # The plots of these rows are the run report's (tests/unit/test_report_plots.py).
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"cost.csv", "cost.md"}
    with open(tmp_path / "cost.csv") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(rows) == 2 * len(cost.RFABRIC_FABRICS)
    markdown = (tmp_path / "cost.md").read_text()
    assert "| ZCube | 256 (256) |" in markdown and "1.81x" in markdown
    # What the cost plots are drawn from, once the experiment records it.
    assert all({"radix", "gpus", "label", "cost_total", "cost_per_gpu"} <= set(row)
               for row in rows)


def test_topologies_need_no_matplotlib(tmp_path):
    """Plotting is the report's job: topologies imports, and writes the cost table,
    where matplotlib cannot be imported."""
    root = Path(__file__).resolve().parents[2]
    names = sorted(".".join(path.relative_to(root).with_suffix("").parts)
                   for path in (root / "topologies").glob("*.py")
                   if path.stem not in ("__init__", "mininet_topo", "mn_custom"))
    assert "topologies.report" in names
    script = ("import importlib, sys\nsys.modules['matplotlib'] = None\n"
              f"for name in {names!r}:\n    importlib.import_module(name)\n"
              "from topologies import report\n"
              f"report.cost_table({str(tmp_path)!r}, gpu_counts=[1024], radices=[64])\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_summary_lines_one_per_fabric_with_reasons():
    fabrics = [f for f in report.SUMMARY_FABRICS if f != "rail-fabric"]    # 4 s at 16K
    lines = report.fabric_summary_lines(16384, 128, fabrics)
    assert len(lines) == len(fabrics)
    by = {line.split(":")[0]: line for line in lines}
    assert "640 switches" in by["roft"] and "49,152 x 400G" in by["roft"]
    assert "not built" in by["railfly"]                  # 2,055-port rail switches
    assert "not built" in report.fabric_summary_lines(32768, 128, ["zcube"])[0]
