"""Fabric registry and Mininet-style spec strings (``fattree,k=4``).

``build("fattree,k=4")`` and ``build("fattree", k=4)`` are the same.  Argument
types follow the builder's defaults, so a spec string from a command line or a
scenario file is checked before anything is created.
"""

from __future__ import annotations

import inspect
from typing import Callable, Dict, Tuple

from topologies import (fattree, fattree_os, hpn, hybrid, leafspine, rail_fabric, rail_only,
                        railfly, rfabric, roft, sip_ocs, zcube)
from topologies.fabric import Fabric, FabricError

BUILDERS: Dict[str, Callable[..., Fabric]] = {
    "fattree": fattree.build,
    "leafspine": leafspine.build,
    "hybrid": hybrid.build,
    "clos": fattree_os.build_nonblocking,
    "fattree-os": fattree_os.build,
    "fattree-os-edge": fattree_os.build_edge,
    "roft": roft.build,
    "rail-only": rail_only.build,
    "hpn": hpn.build,
    "sip-ocs": sip_ocs.build,
    "rfabric": rfabric.build,
    "zcube": zcube.build,
    "railfly": railfly.build,
    "rail-fabric": rail_fabric.build,
}


def register(name: str, builder: Callable[..., Fabric]) -> None:
    BUILDERS[name] = builder


def _coerce(fabric: str, key: str, value, default):
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
        kwargs[key.strip()] = value.strip()
    return name, kwargs


def check_args(name: str, kwargs: dict) -> Dict[str, object]:
    """Coerce and validate builder arguments without building anything."""
    if name not in BUILDERS:
        raise FabricError(f"unknown fabric {name!r}; known fabrics: {', '.join(sorted(BUILDERS))}")
    params = inspect.signature(BUILDERS[name]).parameters
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
    return BUILDERS[name](**check_args(name, kwargs))


def parameters(name: str) -> Dict[str, object]:
    """Builder parameters and their defaults, for listings and help text."""
    if name not in BUILDERS:
        raise FabricError(f"unknown fabric {name!r}; known fabrics: {', '.join(sorted(BUILDERS))}")
    return {k: p.default for k, p in inspect.signature(BUILDERS[name]).parameters.items()}
