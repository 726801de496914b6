"""What every experiment gets and returns.

An experiment module provides ``SECTION`` (its TOML section), ``FIELDS``
(that section's schema), ``SUMMARY``, ``NEEDS_EMULATION``,
``check(scenario)`` (cross-field validation, no side effects) and
``run(ctx) -> Outcome``.  An experiment that only computes (no emulation,
no fabric of its own) sets ``NEEDS_FABRIC = False``: its scenario then has
no ``[fabric]``, ``[scale]`` or ``[fidelity]`` section, and its context no
fabric or scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from emu.progress import progress_printer
from emu.scale import Scale
from topologies import registry, routing
from topologies.fabric import HOST, Fabric


@dataclass
class Context:
    scenario: object
    fabric: Optional[Fabric]
    scale: Optional[Scale]
    run_dir: Path
    bed: Optional[object] = None
    log: Callable[[str], None] = print

    @property
    def settings(self) -> Dict:
        return self.scenario.section

    def progress(self, label: str) -> Callable[[int, int], None]:
        return progress_printer(label)

    @property
    def captures_dir(self) -> Path:
        return self.run_dir / "captures"


@dataclass
class Outcome:
    metrics: Dict = field(default_factory=dict)
    flows: List = field(default_factory=list)          # traffic.replay.FlowResult
    timeline: Dict = field(default_factory=dict)
    steps: List[Dict] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    t0: float = 0.0


def needs_fabric(experiment) -> bool:
    return getattr(experiment, "NEEDS_FABRIC", True)


def build_fabric(scenario) -> Optional[Fabric]:
    """The scenario's fabric, or None for an experiment without one."""
    if not needs_fabric(scenario.experiment):
        return None
    return registry.build(scenario.config["fabric"]["spec"])


def host_gbps(fabric: Fabric) -> float:
    """Real rate of the links that attach hosts: the reference for link_mbps."""
    rates = [d["gbps"] for u, v, d in fabric.links()
             if HOST in (fabric.kind(u), fabric.kind(v))]
    return max(rates) if rates else 1.0


def scale_for(scenario, fabric: Fabric) -> Scale:
    settings = scenario.config["scale"]
    return Scale.from_rates(host_gbps(fabric), settings["link_mbps"], tdf=settings["tdf"])


def path_links(fabric: Fabric, src: str, dst: str) -> List[str]:
    """Links on any current shortest path (ECMP may pick any of them)."""
    logical = fabric.logical_graph()
    links = set()
    for path in routing.shortest_paths(logical, src, dst):
        for u, v in zip(path, path[1:]):
            links.add("-".join(sorted((u, v))))
    return sorted(links)


def path_cap_mbps(fabric: Fabric, scale: Scale, src: str, dst: str) -> Optional[float]:
    logical = fabric.logical_graph()
    caps = []
    for path in routing.shortest_paths(logical, src, dst):
        caps.append(min(min(d["gbps"] for d in logical[u][v].values())
                        for u, v in zip(path, path[1:])))
    return scale.emu_mbps(max(caps)) if caps else None


def fidelity_rows(fabric: Fabric, scale: Scale, flows) -> List[Dict]:
    rows = []
    for flow in flows:
        if flow.status != "ok":
            continue
        rows.append({"id": flow.id, "start": flow.start, "end": flow.end,
                     "goodput_mbps": flow.goodput_mbps,
                     "cap_mbps": path_cap_mbps(fabric, scale, flow.src, flow.dst),
                     "links": path_links(fabric, flow.src, flow.dst)})
    return rows
