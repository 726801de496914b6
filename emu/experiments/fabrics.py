"""What each fabric is made of at one scale, and a fabric export; no emulation.

Prints one line of counts per fabric at ``gpus`` GPUs with radix-``radix``
packet switches (topologies/catalog.py's analytic counts; a fabric with no
construction at that scale says why), records the same counts in
result.json, and with ``export`` set writes that fabric spec as GraphML or
JSON into the run folder.
"""

from __future__ import annotations

import re

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import catalog, registry, report
from topologies.fabric import FabricError

FORMATS = ("graphml", "json")


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
