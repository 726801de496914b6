"""Network cost of a fabric from its counts and a price list (topologies/prices.toml).

Cost = packet switches (chassis + radix x port price) + optical modules by
speed + one fibre per cable + OCS ports, the "primary expenditures of
optical modules and switches" of RFabric's Figure 7.  In-server NVLink
switches and GPU NICs are part of the servers and are not priced.

`rfabric_rows` produces the RFabric comparison (FT, FT-OS, ROFT, SiP-OCS,
RFabric at 1,024-32,768 GPUs, radix-64 and radix-128 EPS); `table6_rows`
the 16,384-GPU comparison of ZCube's Table 6.
"""

from __future__ import annotations

import copy
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (Ubuntu 22.04)
    import tomli as tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

from topologies import catalog
from topologies.counts import FabricCounts

PRICES_FILE = Path(__file__).with_name("prices.toml")

RFABRIC_FABRICS = ("clos", "fattree-os", "fattree-os-edge", "roft", "sip-ocs", "rfabric")
LABELS = {"clos": "FT", "fattree-os": "FT-OS 3:1", "fattree-os-edge": "FT-OS 3:1 (ToR)",
          "roft": "ROFT", "sip-ocs": "SiP-OCS",
          "rfabric": "RFabric", "rail-only": "Rail-only", "hpn": "HPN", "zcube": "ZCube",
          "railfly": "RailFly", "rail-fabric": "Rail-Fabric"}
GPU_COUNTS = (1024, 2048, 4096, 8192, 16384, 32768)
RADICES = (64, 128)

# ZCube Table 6 (002 text): 16,384 GPUs, 51.2T switches.
TABLE6 = {
    "roft": {"switches": 640, "cables": {400.0: 49152}, "usd": 93e6},
    "rail-only": {"switches": 384, "cables": {400.0: 32768}, "usd": 76e6},
    "hpn": {"switches": 384, "cables": {400.0: 16384, 200.0: 32768}, "usd": 84e6},
    "zcube": {"switches": 256, "cables": {200.0: 49152}, "usd": 57e6},
}
TABLE6_GPUS, TABLE6_RADIX = 16384, 128
RFABRIC_TEXT_RATIO = 1.81


class PriceError(ValueError):
    """A price is missing or malformed."""


def load_prices(path: Optional[Path] = None, overrides: Optional[Mapping] = None) -> dict:
    """The price list as nested dicts of {"usd", "source"}; `overrides` replaces
    values by dotted key ({"ocs.port": 800}) or nested dict ({"ocs": {"port": 800}})."""
    with open(path or PRICES_FILE, "rb") as handle:
        prices = tomllib.load(handle)
    _check(prices, "")
    return with_overrides(prices, overrides or {})


def _flatten(overrides: Mapping, prefix: str = "") -> Dict[str, object]:
    flat = {}
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _check(table: dict, where: str) -> None:
    for key, value in table.items():
        name = f"{where}{key}"
        if not isinstance(value, dict):
            raise PriceError(f"prices: {name} should be a table")
        if "usd" in value:
            if not isinstance(value.get("source"), str) or not value["source"]:
                raise PriceError(f"prices: {name} has no source")
        else:
            _check(value, name + ".")


def price(prices: dict, key: str) -> float:
    node = prices
    for part in key.split("."):
        if part not in node:
            raise PriceError(f"no price for {key!r}")
        node = node[part]
    return float(node["usd"])


def _speed(gbps: float) -> str:
    return f"{gbps:g}"


@dataclass
class Cost:
    switches: float
    optics: float
    fiber: float
    ocs: float

    @property
    def total(self) -> float:
        return self.switches + self.optics + self.fiber + self.ocs


def network_cost(counts: FabricCounts, prices: dict) -> Cost:
    switches = sum(
        n * (price(prices, "eps.chassis") + counts.switch_ports[role][0]
             * price(prices, f"eps.port.{_speed(counts.switch_ports[role][1])}"))
        for role, n in counts.switches.items())
    optics = sum(n * price(prices, f"optics.module.{_speed(g)}")
                 for g, n in counts.optical_modules.items())
    fiber = counts.total_cables * price(prices, "optics.fiber")
    ocs = counts.ocs_ports * price(prices, "ocs.port") + counts.ocs * price(prices, "ocs.chassis")
    return Cost(switches, optics, fiber, ocs)


def cost_row(name: str, counts: FabricCounts, prices: dict, radix: int,
             gpu_price: Optional[float] = None) -> dict:
    cost = network_cost(counts, prices)
    gpu_price = price(prices, "gpu.price") if gpu_price is None else gpu_price
    return {
        "fabric": name, "label": LABELS.get(name, name), "gpus": counts.gpus, "radix": radix,
        "switches": counts.total_switches, "cables": counts.total_cables,
        "optical_modules": sum(counts.optical_modules.values()), "ocs_ports": counts.ocs_ports,
        "diameter": counts.diameter, "bisection_tbps": (counts.bisection_gbps or 0) / 1000,
        **{f"cost_{k}": v for k, v in asdict(cost).items()}, "cost_total": cost.total,
        "cost_per_gpu": cost.total / counts.gpus,
        "share_of_gpu_cost": cost.total / (counts.gpus * gpu_price),
    }


def rfabric_rows(gpu_counts: Iterable[int] = GPU_COUNTS, radices: Iterable[int] = RADICES,
                 fabrics: Iterable[str] = RFABRIC_FABRICS, prices: Optional[dict] = None,
                 gpu_price: Optional[float] = None,
                 performance: Optional[Mapping[str, float]] = None) -> List[dict]:
    """One row per (radix, GPU count, fabric).  ``cost_efficiency`` is
    (throughput / cost) over FT's at the same scale; throughput comes from
    `performance` (fabric -> normalized throughput, default 1.0 for all, i.e.
    a pure cost ratio; feed in emulation results to weigh it)."""
    prices = load_prices() if prices is None else prices
    performance = dict(performance or {})
    rows = []
    for radix in radices:
        for gpus in gpu_counts:
            scale_rows = [cost_row(name, catalog.counts_at_scale(name, gpus, radix), prices,
                                   radix, gpu_price) for name in fabrics]
            baseline = _baseline(scale_rows, performance)
            for row in scale_rows:
                row["throughput"] = performance.get(row["fabric"], 1.0)
                row["cost_efficiency"] = (row["throughput"] / row["cost_total"] / baseline
                                          if baseline else None)
            rows += scale_rows
    return rows


def _baseline(rows: List[dict], performance: Mapping[str, float]) -> Optional[float]:
    for row in rows:
        if row["fabric"] == "clos":
            return performance.get("clos", 1.0) / row["cost_total"]
    return None


def table6_rows(prices: Optional[dict] = None) -> List[dict]:
    """ZCube Table 6 at 16,384 GPUs: our counts and cost next to the text's."""
    prices = load_prices() if prices is None else prices
    rows = []
    for name, target in TABLE6.items():
        counts = catalog.counts_at_scale(name, TABLE6_GPUS, TABLE6_RADIX)
        row = cost_row(name, counts, prices, TABLE6_RADIX)
        row.update(cables_by_speed=dict(sorted(counts.cables.items(), reverse=True)),
                   text_switches=target["switches"], text_cables=target["cables"],
                   text_cost=target["usd"], cost_error=row["cost_total"] / target["usd"] - 1)
        rows.append(row)
    return rows


def rfabric_ratio(rows: List[dict], radix: int, gpus: int) -> Optional[float]:
    """FT cost / RFabric cost (throughput-weighted) at one scale: the text's 1.81x."""
    for row in rows:
        if row["fabric"] == "rfabric" and row["radix"] == radix and row["gpus"] == gpus:
            return row["cost_efficiency"]
    return None


def with_overrides(prices: dict, overrides: Mapping) -> dict:
    """A copy of `prices` with dotted-key overrides applied (scenario sweeps)."""
    result = copy.deepcopy(prices)
    for key, value in _flatten(overrides).items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise PriceError(f"override {key}={value!r} is not a number of dollars")
        node = result
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = {"usd": float(value), "source": "scenario override"}
    return result
