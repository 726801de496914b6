"""What the command line prints and writes about fabrics: cost tables, summaries, exports.

* `cost_table(out_dir, ...)`: RFabric's cost comparison (Figure 7's analogue)
  and ZCube's Table 6, as CSV and Markdown in `out_dir`; the plots of its
  rows are drawn by the run report, so this package needs no matplotlib.
* `fabric_summary_lines(gpus, radix)`: one line of counts per fabric.
* `export(fabric, path, fmt)`: GraphML or JSON.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

import networkx as nx

from topologies import catalog, cost
from topologies.fabric import Fabric, FabricError

SUMMARY_FABRICS = ("clos", "fattree-os", "fattree-os-edge", "roft", "rail-only", "hpn",
                   "sip-ocs", "rfabric", "zcube", "railfly", "rail-fabric")
CSV_COLUMNS = ("radix", "gpus", "fabric", "label", "switches", "cables", "optical_modules",
               "ocs_ports", "diameter", "bisection_tbps", "cost_switches", "cost_optics",
               "cost_fiber", "cost_ocs", "cost_total", "cost_per_gpu", "share_of_gpu_cost",
               "throughput", "cost_efficiency")


def cost_table(out_dir, gpu_counts: Iterable[int] = cost.GPU_COUNTS,
               radices: Iterable[int] = cost.RADICES,
               fabrics: Iterable[str] = cost.RFABRIC_FABRICS,
               overrides: Optional[Mapping] = None, gpu_price: Optional[float] = None,
               performance: Optional[Mapping[str, float]] = None) -> List[dict]:
    """Compute the cost rows and write cost.csv and cost.md into `out_dir`
    (created if missing); returns the rows."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prices = cost.load_prices(overrides=overrides)
    gpu_counts, radices, fabrics = list(gpu_counts), list(radices), list(fabrics)
    rows = cost.rfabric_rows(gpu_counts, radices, fabrics, prices, gpu_price, performance)
    with open(out / "cost.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    table6 = cost.table6_rows(prices)
    (out / "cost.md").write_text(_markdown(rows, table6, radices, gpu_counts))
    return rows


def _markdown(rows: List[dict], table6: List[dict], radices, gpu_counts) -> str:
    lines = ["# Network cost", "",
             "Prices: topologies/prices.toml (assumptions, calibrated to ZCube Table 6).", "",
             "## ZCube Table 6 (16,384 GPUs, 51.2T switches)", "",
             "| fabric | switches (text) | cables | cables (text) | cost $M | text $M | error |",
             "|---|---|---|---|---|---|---|"]
    for row in table6:
        lines.append(f"| {row['label']} | {row['switches']} ({row['text_switches']}) | "
                     f"{_cables(row['cables_by_speed'])} | {_cables(row['text_cables'])} | "
                     f"{row['cost_total'] / 1e6:.1f} | {row['text_cost'] / 1e6:.0f} | "
                     f"{row['cost_error']:+.1%} |")
    lines += ["", "## RFabric comparison (Figure 7)", "",
              "| radix | GPUs | fabric | switches | cables | OCS ports | cost $M | $/GPU | "
              "share of GPU cost | cost-efficiency vs FT |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        efficiency = "" if row["cost_efficiency"] is None else f"{row['cost_efficiency']:.2f}x"
        lines.append(f"| {row['radix']} | {row['gpus']:,} | {row['label']} | "
                     f"{row['switches']:,} | {row['cables']:,} | {row['ocs_ports']:,} | "
                     f"{row['cost_total'] / 1e6:.1f} | {row['cost_per_gpu']:,.0f} | "
                     f"{row['share_of_gpu_cost']:.1%} | {efficiency} |")
    ratios = [(r, g, cost.rfabric_ratio(rows, r, g)) for r in radices for g in gpu_counts]
    ratios = [f"{g:,} GPUs radix {r}: {x:.2f}x" for r, g, x in ratios if x is not None]
    if ratios:
        lines += ["", f"RFabric cost-efficiency over FT (text: {cost.RFABRIC_TEXT_RATIO}x): "
                  + "; ".join(ratios) + "."]
    return "\n".join(lines) + "\n"


def _cables(by_speed: Mapping[float, int]) -> str:
    return " + ".join(f"{n:,} x {g:g}G" for g, n in by_speed.items())


def fabric_summary_lines(gpus: int = 16384, radix: int = 128,
                         fabrics: Optional[Iterable[str]] = None) -> List[str]:
    """One line of counts per fabric at `gpus` GPUs with radix-`radix` EPS;
    a fabric that has no construction at that scale says why."""
    lines = []
    for name in fabrics or SUMMARY_FABRICS:
        try:
            counts = catalog.counts_at_scale(name, gpus, radix)
        except FabricError as error:
            lines.append(f"{name}: not built at {gpus:,} GPUs / radix {radix}: {error}")
            continue
        ports = ", ".join(f"{role} {r}x{g:g}G" for role, (r, g) in counts.switch_ports.items())
        lines.append(f"{counts.summary(name)}; ports {ports or 'none'}; "
                     f"modules {sum(counts.optical_modules.values()):,}")
    return lines


# ------------------------------------------------------------------ export
def export(fabric: Fabric, path, fmt: Optional[str] = None) -> Path:
    """Write `fabric` as GraphML or JSON (`fmt` defaults to the file suffix)."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt == "json":
        path.write_text(fabric.to_json())
    elif fmt == "graphml":
        nx.write_graphml(graphml_graph(fabric), path)
    else:
        raise FabricError(f"export: format {fmt!r} not one of graphml, json")
    return path


def graphml_graph(fabric: Fabric) -> nx.MultiGraph:
    """A copy GraphML can hold: `ports` flattened into end_a/port_a, end_b/port_b
    (named ends, since GraphML may write an undirected edge either way round),
    None values dropped, other non-scalars as JSON text."""
    graph = nx.MultiGraph(name=fabric.name, params=json.dumps(fabric.params, sort_keys=True),
                          circuits=json.dumps({o: sorted(map(list, c))
                                               for o, c in fabric.circuits.items()}))
    for node, data in fabric.graph.nodes(data=True):
        graph.add_node(node, **_scalars(data))
    for u, v, key, data in fabric.graph.edges(keys=True, data=True):
        attrs = _scalars({k: val for k, val in data.items() if k != "ports"})
        graph.add_edge(u, v, key=key, end_a=u, port_a=data["ports"][u], end_b=v,
                       port_b=data["ports"][v], **attrs)
    return graph


def _scalars(data: Dict[str, object]) -> Dict[str, object]:
    result = {}
    for key, value in data.items():
        if value is None:
            continue
        result[key] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    return result
