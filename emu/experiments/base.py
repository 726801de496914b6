"""What every experiment is, gets and returns.

An experiment module defines one `Experiment`, ``EXPERIMENT``: the scenario
kind it serves, its TOML section and that section's schema, a one-line
summary, ``check(scenario)`` (cross-field validation, no side effects),
``run(ctx) -> Outcome`` and the network it needs (`Network`):

* ``NONE``: it only computes (cost, counts, sizing).  Its scenario has no
  ``[fabric]``, ``[scale]`` or ``[fidelity]`` section, its context no fabric
  or scale, and it needs no root.
* ``ONE``: the runner opens one testbed on ``[fabric]`` and hands it over as
  ``ctx.bed``.
* ``SERIES``: it opens its own testbeds one at a time through
  ``ctx.testbeds`` (`emu.live.series.TestbedSeries`), e.g. one per fabric of
  a comparison.

An experiment that also has ``model(ctx) -> Outcome`` runs on the flow-level
model instead when the scenario says ``[testbed] engine = "model"``: the same
fabric, scale and flows, no testbed and no root.

The runner samples, dumps and checks every testbed the same way in both
cases (`emu.run`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from emu.progress import progress_printer
from traffic.scale import Scale
from topologies import registry
from topologies.fabric import HOST, Fabric


class Network(enum.Enum):
    NONE = "none"          # computes only: no fabric, no testbed, no root
    ONE = "one"            # one testbed on the scenario's fabric, opened by the runner
    SERIES = "series"      # testbeds the experiment opens one at a time


@dataclass
class Context:
    scenario: object
    fabric: Optional[Fabric]
    scale: Optional[Scale]
    run_dir: Path
    bed: Optional[object] = None          # Network.ONE: the open emu.live.testbed.Testbed
    testbeds: Optional[object] = None     # Network.SERIES: an emu.live.series.TestbedSeries
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
    flows: List = field(default_factory=list)          # emu.live.replay.FlowResult
    timeline: Dict = field(default_factory=dict)
    steps: List[Dict] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    t0: float = 0.0


@dataclass(frozen=True)
class Experiment:
    """One experiment kind, as a scenario's ``[scenario] kind`` names it."""

    kind: str
    summary: str
    section: str                                  # its own TOML section
    fields: Dict                                  # that section's schema (emu.schema)
    check: Callable[[object], None]               # raises ValueError/FabricError
    run: Callable[[Context], Outcome]
    network: Network = Network.ONE
    # The same experiment on the flow-level model (``testbed.engine = "model"``):
    # no testbed, no root; None where the kind has no model.
    model: Optional[Callable[[Context], Outcome]] = None

    @property
    def needs_emulation(self) -> bool:
        return self.network is not Network.NONE

    @property
    def needs_fabric(self) -> bool:
        return self.network is not Network.NONE


def load_calibration(scenario):
    """The model's constants for a scenario: ``testbed.model_calibration``'s file,
    or the frozen one (`traffic.model.calibration`)."""
    from traffic.model import calibration

    path = scenario.config.get("testbed", {}).get("model_calibration")
    return calibration.load(Path(path) if path else None)


def model_calibration(ctx: Context):
    """The flow-level model's constants for this run (`load_calibration`):
    the emulator's overheads at its link rate, or none at the fabric's real rates
    (``testbed.model_overheads``)."""
    cal = load_calibration(ctx.scenario)
    if ctx.scenario.config["testbed"].get("model_overheads", True):
        return cal.for_emulation(ctx.scenario.config["scale"]["link_mbps"])
    return cal.for_real_world(host_gbps(ctx.fabric))


def model_kernel_keys(ctx: Context, fabric: Fabric):
    """The flows' kernel multipath hashes for the model (`traffic.model.kernel_ecmp`)
    when the emulated run would fix every path: the ``linux`` data plane (as
    asked, or as ``auto`` picks it on this machine), a nonzero ECMP seed and a
    kernel whose routers take the seed's hash key.  None otherwise: the model
    then draws each flow's path with its own hash."""
    from emu.live import dataplane
    from traffic import ports
    from traffic.model.kernel_ecmp import KernelFlowKeys

    testbed = ctx.scenario.config["testbed"]
    seed = testbed["ecmp_seed"]
    if seed == ports.KERNEL_SEED or not ports.MULTIPATH_SEED_SYSCTL.exists():
        return None
    asked = testbed.get("dataplane", dataplane.AUTO)
    # Open vSwitch's select groups hash with a key of their own.  (Asked for
    # by name, it need not be installed for a model run: no probe.)
    if asked == dataplane.OVS or dataplane.choose(asked).dataplane != dataplane.LINUX:
        return None
    return KernelFlowKeys(fabric, seed)


def build_fabric(scenario) -> Optional[Fabric]:
    """The scenario's fabric, or None for an experiment without one."""
    if not scenario.experiment.needs_fabric:
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
