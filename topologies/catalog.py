"""Per-fabric analytic counts, graph measurement and full-scale parameters, by name.

``analytic_counts("zcube", n=128)`` never builds a graph; ``measure_fabric(f)``
counts a built one with the builder's own bisection cut; ``scaled_params``
maps a GPU count and an EPS radix to each builder's parameters, so the
same scale can be asked of every fabric.
"""

from __future__ import annotations

from types import ModuleType
from typing import Dict

from topologies import (fattree_os, hpn, rail_fabric, rail_only, railfly, rfabric, roft, sip_ocs,
                        zcube)
from topologies.counts import FabricCounts, measure
from topologies.fabric import Fabric, FabricError

MODULES: Dict[str, ModuleType] = {
    "clos": fattree_os,
    "fattree-os": fattree_os,
    "fattree-os-edge": fattree_os,
    "roft": roft,
    "rail-only": rail_only,
    "hpn": hpn,
    "sip-ocs": sip_ocs,
    "rfabric": rfabric,
    "zcube": zcube,
    "railfly": railfly,
    "rail-fabric": rail_fabric,
}
TRANSIT_HOSTS = frozenset({"sip-ocs"})
VARIANT_COUNTS = {           # registry names that share a module with another name
    "clos": fattree_os.counts_nonblocking,
    "fattree-os-edge": fattree_os.counts_edge,
}


def _module(name: str) -> ModuleType:
    if name not in MODULES:
        raise FabricError(f"no analytic counts for {name!r}; known: {', '.join(sorted(MODULES))}")
    return MODULES[name]


def analytic_counts(name: str, **params) -> FabricCounts:
    if name in VARIANT_COUNTS:
        return VARIANT_COUNTS[name](**params)
    return _module(name).counts(**params)


def measure_fabric(fabric: Fabric, with_diameter: bool = True) -> FabricCounts:
    """Counts of a built fabric, cut where its builder says its bisection is."""
    module = MODULES.get(fabric.name)
    half = module.bisection_half(fabric) if module else None
    return measure(fabric, half=half, transit_hosts=fabric.name in TRANSIT_HOSTS,
                   with_diameter=with_diameter)


def scaled_params(name: str, gpus: int, radix: int) -> dict:
    return _module(name).scaled_params(gpus, radix)


def counts_at_scale(name: str, gpus: int, radix: int) -> FabricCounts:
    return analytic_counts(name, **scaled_params(name, gpus, radix))
