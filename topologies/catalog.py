"""Analytic counts, graph measurement and full-scale parameters of the registered fabrics.

The fabrics are registered once, with their counts, bisection cuts and
scaling rules, in `topologies.registry`; this module counts with them.
``analytic_counts("zcube", n=128)`` never builds a graph;
``measure_fabric(f)`` counts a built one with the builder's own bisection
cut; ``scaled_params`` maps a GPU count and an EPS radix to each builder's
full-scale parameters (`registry.params_at`), so the same scale can be asked
of every fabric.
"""

from __future__ import annotations

from typing import List

from topologies import registry
from topologies.counts import FabricCounts, measure
from topologies.fabric import Fabric, FabricError


def names() -> List[str]:
    """The registered fabrics that have analytic counts, sorted."""
    return sorted(name for name, entry in registry.FABRICS.items() if entry.counts)


def _counted(name: str) -> registry.FabricEntry:
    entry = registry.FABRICS.get(name)
    if entry is None or entry.counts is None:
        raise FabricError(f"no analytic counts for {name!r}; known: {', '.join(names())}")
    return entry


def analytic_counts(name: str, **params) -> FabricCounts:
    return _counted(name).counts(**params)


def measure_fabric(fabric: Fabric, with_diameter: bool = True) -> FabricCounts:
    """Counts of a built fabric, cut where its builder says its bisection is."""
    entry = registry.FABRICS.get(fabric.name)
    half = entry.bisection_half(fabric) if entry and entry.bisection_half else None
    return measure(fabric, half=half, transit_hosts=bool(entry and entry.transit_hosts),
                   with_diameter=with_diameter)


def scaled_params(name: str, gpus: int, radix: int) -> dict:
    """Builder parameters of ``name`` at full scale: ``gpus`` GPUs, radix-``radix``
    packet switches, the texts' servers."""
    _counted(name)
    return registry.params_at(name, gpus, radix=radix)


def counts_at_scale(name: str, gpus: int, radix: int) -> FabricCounts:
    return analytic_counts(name, **scaled_params(name, gpus, radix))
