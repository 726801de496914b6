"""What each fabric is made of at one scale, and a fabric export; no emulation.

Prints one line of counts per fabric at ``gpus`` GPUs with radix-``radix``
packet switches (topologies/catalog.py's analytic counts; a fabric with no
construction at that scale says why), records the same counts in
result.json, and with ``export`` set writes that fabric spec as GraphML or
JSON into the run folder.  ``compare = ["railfly-zcube"]`` (the default) adds
the 002 text's section-8 comparison: the GPUs RailFly and ZCube connect with
the same ``same_switches`` radix-``radix`` switches (`railfly.versus_zcube`;
the text: 128 switches, ~15,488 against 4,096 GPUs, 3.8x).
"""

from __future__ import annotations

import re

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import catalog, railfly, registry, report
from topologies.fabric import FabricError

FORMATS = ("graphml", "json")
COMPARISONS = ("railfly-zcube",)


def _check_spec(spec: str) -> None:
    if spec:
        registry.check_args(*registry.parse_spec(spec))


SECTION = "fabrics"
SUMMARY = "counts of every fabric at one scale, and GraphML/JSON export; no emulation"
FIELDS = {
    "gpus": Field(int, 16384, "GPU count", minimum=1),
    "radix": Field(int, 128, "packet-switch radix", minimum=2),
    "names": Field(list, list(report.SUMMARY_FABRICS), "fabrics to count", item=str,
                   choices=catalog.names()),
    "export": Field(str, "", "fabric spec to export, e.g. 'zcube,n=4'; empty = none",
                    check=_check_spec),
    "format": Field(str, "graphml", "export format", choices=FORMATS),
    "compare": Field(list, list(COMPARISONS), "side-by-side comparisons to print: "
                     "railfly-zcube = GPUs on the same switches (002 text, section 8)",
                     item=str, choices=COMPARISONS),
    "same_switches": Field(int, 128, "switch budget of the railfly-zcube comparison (text: 128)",
                           minimum=1),
}


def check(scenario) -> None:
    settings = scenario.section
    if not settings["names"]:
        raise ValueError("fabrics.names is empty")
    if settings["export"]:
        try:
            registry.build(settings["export"])
        except FabricError as error:
            raise ValueError(f"fabrics.export {settings['export']!r}: {error}") from None
    if "railfly-zcube" in settings["compare"]:
        try:
            railfly.versus_zcube(settings["same_switches"], settings["radix"])
        except FabricError as error:
            raise ValueError(f"fabrics.compare railfly-zcube with fabrics.same_switches "
                             f"{settings['same_switches']} and fabrics.radix "
                             f"{settings['radix']}: {error}") from None


def _counts_row(name: str, gpus: int, radix: int) -> dict:
    try:
        counts = catalog.counts_at_scale(name, gpus, radix)
    except FabricError as error:
        return {"fabric": name, "note": f"not built: {error}"}
    bisection = counts.bisection_gbps
    return {"fabric": name, "gpus": counts.gpus, "switches": counts.total_switches,
            "cables": counts.total_cables, "optical_modules": sum(counts.optical_modules.values()),
            "ocs": counts.ocs, "ocs_ports": counts.ocs_ports, "diameter": counts.diameter,
            "bisection_gbps": None if bisection is None else round(bisection)}


def _railfly_zcube(ctx: Context, switches: int, radix: int) -> dict:
    """Section 8: RailFly against ZCube on the same switches, logged and as metrics."""
    result = railfly.versus_zcube(switches, radix)
    text = result["text"] or {}

    def cited(key: str, form: str) -> str:
        return f" (text {form.format(text[key])})" if key in text else ""

    ctx.log(f"RailFly vs ZCube on the same {switches:,} radix-{radix} switches "
            f"(002 text, section 8):")
    railfly_row, zcube_row = result["rows"]
    ctx.log(f"  RailFly: {railfly_row['copies']} units of {railfly.TEXT_RAILS} rails, "
            f"{railfly_row['gpus']:,} GPUs{cited('railfly_gpus', '~{:,}')}, "
            f"{railfly_row['ports_per_gpu']} port per GPU, "
            f"{railfly_row['interconnect_pct']:.1f}% of switch ports interconnect"
            f"{cited('railfly_interconnect_pct', '{:g}%')}")
    ctx.log(f"  ZCube({radix // 2}, 2): {zcube_row['copies']} "
            f"cell{'s' if zcube_row['copies'] != 1 else ''}, {zcube_row['gpus']:,} GPUs"
            f"{cited('zcube_gpus', '{:,}')}, {zcube_row['ports_per_gpu']} ports per GPU, "
            f"{zcube_row['interconnect_pct']:.1f}% of switch ports interconnect"
            f"{cited('zcube_interconnect_pct', '{:g}%')}")
    ctx.log(f"  RailFly connects {result['ratio']:.2f}x the GPUs of ZCube{cited('ratio', '~{}x')}")
    metrics = {"railfly_over_zcube_gpus_ratio": result["ratio"],
               "railfly_vs_zcube": {"switches_count": switches, "radix_count": radix,
                                    "rows": result["rows"]}}
    if text:
        metrics["railfly_over_zcube_text_ratio"] = text["ratio"]
        metrics["railfly_vs_zcube"]["text"] = text
    return metrics


def run(ctx: Context) -> Outcome:
    settings = ctx.settings
    gpus, radix, names = settings["gpus"], settings["radix"], settings["names"]
    ctx.log(f"fabrics at {gpus:,} GPUs, radix-{radix} packet switches:")
    for line in report.fabric_summary_lines(gpus, radix, names):
        ctx.log(f"  {line}")
    rows = [_counts_row(name, gpus, radix) for name in names]
    metrics = {"gpus_count": gpus, "radix_count": radix,
               "built_count": sum("note" not in row for row in rows),
               "not_built_count": sum("note" in row for row in rows), "fabrics": rows}
    if "railfly-zcube" in settings["compare"]:
        metrics.update(_railfly_zcube(ctx, settings["same_switches"], radix))
    if settings["export"]:
        spec, fmt = settings["export"], settings["format"]
        fabric = registry.build(spec)
        path = ctx.run_dir / f"{re.sub(r'[^A-Za-z0-9.-]+', '_', spec)}.{fmt}"
        report.export(fabric, path, fmt)
        nodes, links = fabric.graph.number_of_nodes(), fabric.graph.number_of_edges()
        metrics["export"] = {"spec": spec, "file": path.name, "nodes_count": nodes,
                             "links_count": links}
        ctx.log(f"exported {spec} ({nodes} nodes, {links} links) -> {path}")
    return Outcome(metrics=metrics)


EXPERIMENT = Experiment(kind="fabrics", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.NONE)
