"""Fabric registry: one entry per fabric name, and Mininet-style spec strings (``fattree,k=4``).

`FABRICS` registers each name once, with its builder and, where its module
has them, its analytic counts, the GPUs on one side of its bisection cut and
its rule for the parameters at a GPU count.  That rule is the one place that
says what "this fabric at N GPUs" is: `params_at` asks it for the cost
model's full scale (`topologies.catalog`) and, with ``small=True``, for the
small builds the experiments emulate (`spec_at`, `build_at`).

``build("fattree,k=4")`` and ``build("fattree", k=4)`` are the same.  Argument
types follow the builder's defaults, so a spec string from a command line or a
scenario file is checked before anything is created.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, List, Optional, Tuple

from topologies import (fattree, fattree_os, hpn, hybrid, leafspine, rail_fabric, rail_only,
                        railfly, rfabric, roft, rotor, sip_ocs, zcube)
from topologies.counts import FabricCounts
from topologies.fabric import Fabric, FabricError


@dataclass(frozen=True)
class FabricEntry:
    """What the registry knows of one fabric name.

    ``params_at(gpus, radix=None, gpus_per_server=None, small=False)`` returns
    the builder's parameters at ``gpus`` GPUs (see `params_at`).
    """

    build: Callable[..., Fabric]
    counts: Optional[Callable[..., FabricCounts]] = None         # analytic, no graph built
    bisection_half: Optional[Callable[[Fabric], List[int]]] = None   # GPUs on one side
    params_at: Optional[Callable[..., dict]] = None
    transit_hosts: bool = False          # its GPUs forward traffic (counted as switches)


def _module_entry(module: ModuleType, build: Optional[Callable[..., Fabric]] = None,
                  counts: Optional[Callable[..., FabricCounts]] = None,
                  transit_hosts: bool = False) -> FabricEntry:
    """The entry of a builder module with the usual names (``build``, ``counts``,
    ``bisection_half``, ``params_at``); ``build`` and ``counts`` pick a variant."""
    return FabricEntry(build or module.build, counts or module.counts, module.bisection_half,
                       module.params_at, transit_hosts)


FABRICS: Dict[str, FabricEntry] = {
    "fattree": FabricEntry(fattree.build, params_at=fattree.params_at),
    "leafspine": FabricEntry(leafspine.build),
    "hybrid": FabricEntry(hybrid.build),
    "clos": _module_entry(fattree_os, fattree_os.build_nonblocking,
                          fattree_os.counts_nonblocking),
    "fattree-os": _module_entry(fattree_os),
    "fattree-os-edge": _module_entry(fattree_os, fattree_os.build_edge, fattree_os.counts_edge),
    "roft": _module_entry(roft),
    "rail-only": _module_entry(rail_only),
    "hpn": _module_entry(hpn),
    "sip-ocs": _module_entry(sip_ocs, transit_hosts=True),
    "rfabric": _module_entry(rfabric),
    "zcube": _module_entry(zcube),
    "railfly": _module_entry(railfly),
    "rail-fabric": _module_entry(rail_fabric),
    "rotor": _module_entry(rotor),
}


def register(name: str, builder: Callable[..., Fabric], **fields) -> None:
    """Add or replace fabric ``name``; ``fields`` are the other `FabricEntry` fields."""
    FABRICS[name] = FabricEntry(builder, **fields)


def names() -> List[str]:
    """Every registered fabric name, in registration order."""
    return list(FABRICS)


def entry(name: str) -> FabricEntry:
    if name not in FABRICS:
        raise FabricError(f"unknown fabric {name!r}; known fabrics: {', '.join(sorted(FABRICS))}")
    return FABRICS[name]


def _coerce(fabric: str, key: str, value, default):
    value = _coerce_type(fabric, key, value, default)
    # nan fails no bound a builder checks (every comparison is false), and nan
    # or inf would be built into the links' rates as they are.
    if isinstance(value, float) and not math.isfinite(value):
        raise FabricError(f"{fabric}: {key}={value!r} is not a finite number")
    return value


def _coerce_type(fabric: str, key: str, value, default):
    if isinstance(value, str) and default is not None and not isinstance(default, str):
        kind = type(default)
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                return value.lower() in ("true", "1")
            return kind(value)
        except ValueError:
            raise FabricError(f"{fabric}: {key}={value!r} is not a {kind.__name__}") from None
    if isinstance(value, str) and default is None:
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        # A parameter without a default is an optional count (hosts_per_edge):
        # handed on as text, it failed inside the builder with a TypeError.
        raise FabricError(f"{fabric}: {key}={value!r} is not a number")
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if default is not None and not isinstance(value, type(default)) \
            and not (isinstance(default, float) and isinstance(value, (int, float))):
        raise FabricError(f"{fabric}: {key}={value!r} should be a {type(default).__name__}")
    return value


def parse_spec(spec: str) -> Tuple[str, Dict[str, str]]:
    name, *pairs = [part.strip() for part in spec.split(",")]
    kwargs = {}
    for pair in pairs:
        if "=" not in pair:
            raise FabricError(f"fabric spec {spec!r}: {pair!r} is not key=value")
        key, value = pair.split("=", 1)
        key = key.strip()
        # "k=4,k=8" is a typo or a paste, not a choice: the last one winning
        # silently would build a fabric nobody asked for.
        if key in kwargs:
            raise FabricError(f"fabric spec {spec!r}: key {key!r} is given more than once "
                              f"({key}={kwargs[key]!r} and {key}={value.strip()!r})")
        kwargs[key] = value.strip()
    return name, kwargs


def check_args(name: str, kwargs: dict) -> Dict[str, object]:
    """Coerce and validate builder arguments without building anything."""
    params = inspect.signature(entry(name).build).parameters
    result = {}
    for key, value in kwargs.items():
        if key not in params:
            raise FabricError(f"{name}: unknown parameter {key!r}; allowed: "
                              f"{', '.join(params)}")
        result[key] = _coerce(name, key, value, params[key].default)
    return result


def build(spec: str, **overrides) -> Fabric:
    name, kwargs = parse_spec(spec)
    kwargs.update(overrides)
    fabric = entry(name).build(**check_args(name, kwargs))
    # Whatever a builder lets through, a fabric without hosts is no fabric to
    # run on (hpn,gpus=0 built one, and every experiment failed on it later).
    if not fabric.hosts:
        given = ", ".join(f"{k}={v}" for k, v in kwargs.items()) or "the defaults"
        raise FabricError(f"{name}: these parameters ({given}) build a fabric without hosts")
    return fabric


def parameters(name: str) -> Dict[str, object]:
    """Builder parameters and their defaults, for listings and help text."""
    return {k: p.default for k, p in inspect.signature(entry(name).build).parameters.items()}


# ---------------------------------------------------------------- a fabric at N GPUs
def params_at(name: str, gpus: int, *, radix: Optional[int] = None,
              gpus_per_server: Optional[int] = None, small: bool = False,
              **fixed) -> Dict[str, object]:
    """Builder parameters of fabric ``name`` with ``gpus`` GPUs, by the fabric's
    own rule (`FabricEntry.params_at`, next to its builder).

    ``radix``: ports of a packet switch; ``gpus_per_server``: GPUs per server
    (None: the texts' eight); ``small``: the small build that is emulated
    rather than the texts' full-scale construction (they differ where a
    fabric's full-scale shape cannot be emulated, e.g. Rail-Fabric's cell);
    ``fixed``: builder parameters to pass as they are, after the rule's.
    A parameter the rule leaves at None keeps the builder's default.  Raises
    `ScaleError` when the fabric has no build at that GPU count, FabricError
    when it has no rule.
    """
    rule = entry(name).params_at
    if rule is None:
        raise FabricError(f"{name}: no rule for its parameters at a GPU count")
    params = rule(gpus, radix=radix, gpus_per_server=gpus_per_server, small=small)
    params.update(fixed)
    return {key: value for key, value in params.items() if value is not None}


def spec_at(name: str, gpus: int, **options) -> str:
    """The spec string of `params_at` (same arguments), checked against the builder:
    ``spec_at("roft", 16, radix=8, gpus_per_server=2)`` is
    ``roft,gpus=16,radix=8,gpus_per_server=2``."""
    params = params_at(name, gpus, **options)
    check_args(name, params)
    return ",".join([name] + [f"{key}={value}" for key, value in params.items()])


def build_at(name: str, gpus: int, **options) -> Fabric:
    """The fabric of `spec_at` (same arguments)."""
    return build(spec_at(name, gpus, **options))
