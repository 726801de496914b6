"""Optical circuit switch core: circuits, their changes and their technology.

A circuit is a bidirectional pair of ports, lit or torn as one `Lightpath`
intent (OpenFlow: two port-to-port flows; a patch panel: two redirects).
A new circuit assignment is validated and split into the circuits kept,
torn and lit (`ReconfigPlan`); `controllers.reconfig` orders the steps.  Technology presets
are Table 2 of the RFabric text.  The injected dark time of a
reconfiguration is the preset's delay (or a custom one) times the testbed's
time-dilation factor, so that it keeps its proportion to dilated traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set

from controllers.intents import Lightpath
from topologies.fabric import Circuit, Fabric, FabricError


@dataclass(frozen=True)
class Technology:
    label: str
    delay_ms: float
    radix: int


# Table 2 of the RFabric text: reconfiguration delay and radix per OCS type.
TECHNOLOGIES: Dict[str, Technology] = {
    "rotornet": Technology("RotorNet (InFocus)", 0.01, 128),
    "mems": Technology("3D MEMS (Calient)", 10.0, 320),
    "piezo": Technology("Piezo (Polatis)", 25.0, 576),
    "lc": Technology("Liquid crystal (Coherent)", 100.0, 512),
    "robotic": Technology("Robotic (Telescent)", 120000.0, 1008),
}
CUSTOM = "custom"
# The longest dark window a reconfiguration may sleep through, emulated seconds:
# time.sleep's own limit is about 9.2e9 s, and a longer window failed with an
# OverflowError after its circuits were torn.
MAX_DARK_S = 1e9


def delay_ms_for(technology: str, delay_ms: Optional[float] = None) -> float:
    """Real-world reconfiguration delay of a preset, or a custom delay."""
    # A control request is JSON: NaN passed the check below and the dark
    # window never ended (the controller spun, holding its reconfiguration
    # lock); a string or true failed mid-way with a TypeError.
    if delay_ms is not None and (isinstance(delay_ms, bool)
                                 or not isinstance(delay_ms, (int, float))
                                 or not math.isfinite(delay_ms)):
        raise FabricError(f"delay_ms must be a finite number of milliseconds, got {delay_ms!r}")
    if delay_ms is not None and delay_ms < 0:
        raise FabricError(f"delay_ms must be >= 0, got {delay_ms}")
    if technology == CUSTOM:
        if delay_ms is None or delay_ms < 0:
            raise FabricError("technology 'custom' needs a delay_ms >= 0")
        return float(delay_ms)
    if technology not in TECHNOLOGIES:
        raise FabricError(f"unknown OCS technology {technology!r}; allowed: "
                          f"{', '.join(list(TECHNOLOGIES) + [CUSTOM])}")
    if delay_ms is not None:
        return float(delay_ms)
    return TECHNOLOGIES[technology].delay_ms


@dataclass
class ReconfigPlan:
    ocs: str
    keep: Set[Circuit]
    tear: Set[Circuit]
    light: Set[Circuit]
    delay_real_ms: float
    delay_emulated_s: float
    technology: str

    @property
    def dark_ports(self) -> List[int]:
        return sorted({p for c in self.tear | self.light for p in c})

    def to_dict(self) -> dict:
        return {"ocs": self.ocs, "keep": sorted(self.keep), "tear": sorted(self.tear),
                "light": sorted(self.light), "dark_ports": self.dark_ports,
                "technology": self.technology, "delay_real_ms": self.delay_real_ms,
                "delay_emulated_ms": self.delay_emulated_s * 1000.0}


# Reconfigurations an OCS remembers.  The service reads back the last few (to
# predict the next one's lead time); a run of thousands of reconfigurations
# (an RL run's phase after phase, for hours) must not keep every result.
HISTORY_KEPT = 64


class Recent(list):
    """A list that keeps its last ``keep`` items: ``append`` drops the oldest."""

    def __init__(self, items=(), keep: int = HISTORY_KEPT):
        super().__init__(items)
        self.keep = keep
        del self[:-keep]

    def append(self, item) -> None:
        super().append(item)
        del self[:-self.keep]


@dataclass
class OcsCore:
    """Pure logic for one OCS of a fabric; returns intents."""

    fabric: Fabric
    name: str
    tdf: float = 1.0
    history: List[dict] = field(default_factory=Recent)

    @property
    def circuits(self) -> Set[Circuit]:
        return self.fabric.circuits[self.name]

    @property
    def technology(self) -> str:
        return self.fabric.graph.nodes[self.name]["technology"]

    def lightpaths(self, circuits: Iterable[Circuit], lit: bool) -> List[Lightpath]:
        return [Lightpath(self.name, a, b, lit) for a, b in sorted(circuits)]

    def switch_start(self) -> List[Lightpath]:
        """The lit circuits, for an OCS that starts dark."""
        return self.lightpaths(self.circuits, lit=True)

    def set_technology(self, technology: str, delay_ms: Optional[float] = None) -> float:
        real_ms = delay_ms_for(technology, delay_ms)
        self.fabric.set_technology(self.name, technology,
                                   delay_ms if technology == CUSTOM else None)
        return real_ms

    def plan(self, circuits: Iterable[Iterable[int]], delay_ms: Optional[float] = None) -> ReconfigPlan:
        """Validate a new full circuit assignment and split it into steps."""
        target = self.fabric.check_circuits(self.name, circuits)
        node = self.fabric.graph.nodes[self.name]
        real_ms = delay_ms_for(node["technology"],
                               delay_ms if delay_ms is not None else node.get("delay_ms"))
        if not real_ms * self.tdf / 1000.0 <= MAX_DARK_S:
            raise FabricError(f"{self.name}: delay_ms={real_ms:g} at tdf {self.tdf:g} is a dark "
                              f"window of {real_ms * self.tdf / 1000.0:.3g} s; at most "
                              f"{MAX_DARK_S:.0e} s")
        return ReconfigPlan(ocs=self.name, keep=self.circuits & target,
                            tear=self.circuits - target, light=target - self.circuits,
                            delay_real_ms=real_ms, delay_emulated_s=real_ms * self.tdf / 1000.0,
                            technology=node["technology"])

    def tear(self, plan: ReconfigPlan) -> List[Lightpath]:
        return self.lightpaths(plan.tear, lit=False)

    def light(self, plan: ReconfigPlan) -> List[Lightpath]:
        return self.lightpaths(plan.light, lit=True)

    def commit(self, plan: ReconfigPlan) -> None:
        self.fabric.circuits[self.name] = plan.keep | plan.light
