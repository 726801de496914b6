"""Network cost of the fabrics: RFabric's Figure 7 and ZCube's Table 6.

No emulation: counts come from each fabric's analytic model
(topologies/catalog.py) and prices from topologies/prices.toml, with the
scenario's ``[cost.prices]`` overrides.  The run folder gets cost.csv and
cost.md; result.json holds the Table 6 comparison at 16,384 GPUs, RFabric's
cost-efficiency over FT against the text's 1.81x, and one row per (radix, GPU
count, fabric) in ``network_cost``, from which the run report draws
cost_vs_gpus.png (cost against GPU count per fabric, Figure 7's analogue),
cost_per_gpu.png and cost_share_of_gpu.png (network cost as a share of the
GPUs' cost at ``gpu_price``, Figure 7's main claim; FT and ROFT coincide and
are drawn so both stay visible).
"""

from __future__ import annotations

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import catalog, cost, report
from topologies.fabric import FabricError


def _price_keys(table: dict, prefix: str = ""):
    for key, value in table.items():
        if "usd" in value:
            yield prefix + key
        else:
            yield from _price_keys(value, f"{prefix}{key}.")


DEFAULT_PRICES = cost.load_prices()
GPU_PRICE_KEY = "gpu.price"         # set by cost.gpu_price, not by cost.prices
PRICE_KEYS = sorted(set(_price_keys(DEFAULT_PRICES)) - {GPU_PRICE_KEY})
FABRICS = catalog.names()
TEXT_SCALE = f"{cost.TABLE6_GPUS:,} GPUs, radix {cost.TABLE6_RADIX}"

SECTION = "cost"
SUMMARY = "network cost per fabric vs GPU count (RFabric Fig. 7) and ZCube Table 6; no emulation"
FIELDS = {
    "gpus": Field(list, list(cost.GPU_COUNTS), "GPU counts of the cost table", item=int,
                  minimum=1),
    "radices": Field(list, list(cost.RADICES), "EPS radices, one plot panel each", item=int,
                     minimum=2),
    "fabrics": Field(list, list(cost.RFABRIC_FABRICS), "fabrics of the cost table", item=str,
                     choices=FABRICS),
    "gpu_price": Field(float, cost.price(DEFAULT_PRICES, GPU_PRICE_KEY),
                       "US$ per GPU, for the network's share of the GPU cost", minimum=1.0),
    "prices": Field(dict, {}, "US$ overrides of topologies/prices.toml by dotted key, "
                    "e.g. ocs.port = 800 (the GPU price is cost.gpu_price)",
                    item=float, choices=PRICE_KEYS, minimum=0.0),
    "performance": Field(dict, {}, "normalized throughput per fabric for the cost-efficiency "
                         "(default 1.0: a pure cost ratio)", item=float, choices=FABRICS,
                         minimum=0.0),
}


def _overrides(settings: dict) -> dict:
    return {**settings["prices"], GPU_PRICE_KEY: settings["gpu_price"]}


def check(scenario) -> None:
    settings = scenario.section
    for key in ("gpus", "radices", "fabrics"):
        if not settings[key]:
            raise ValueError(f"cost.{key} is empty")
    for radix in settings["radices"]:
        for gpus in settings["gpus"]:
            for name in settings["fabrics"]:
                try:
                    catalog.counts_at_scale(name, gpus, radix)
                except FabricError as error:
                    raise ValueError(f"cost.fabrics has {name!r}, which cannot be built with "
                                     f"cost.gpus {gpus} and cost.radices {radix}: {error}") from None


def run(ctx: Context) -> Outcome:
    settings = ctx.settings
    overrides = _overrides(settings)
    performance = settings["performance"]
    rows = report.cost_table(ctx.run_dir, gpu_counts=settings["gpus"],
                             radices=settings["radices"], fabrics=settings["fabrics"],
                             overrides=overrides, gpu_price=settings["gpu_price"],
                             performance=performance)
    prices = cost.load_prices(overrides=overrides)
    table6 = [{"fabric": row["fabric"], "label": row["label"],
               "switches_count": row["switches"], "text_switches_count": row["text_switches"],
               "cost_million_usd": row["cost_total"] / 1e6,
               "text_million_usd": row["text_cost"] / 1e6,
               "error_pct": 100 * row["cost_error"]} for row in cost.table6_rows(prices)]
    reference = cost.rfabric_rows([cost.TABLE6_GPUS], [cost.TABLE6_RADIX], ["clos", "rfabric"],
                                  prices, settings["gpu_price"], performance)
    ratio = cost.rfabric_ratio(reference, cost.TABLE6_RADIX, cost.TABLE6_GPUS)
    ratio_error = 100 * (ratio / cost.RFABRIC_TEXT_RATIO - 1)
    # What the report's cost plots are drawn from (emu.report.fabric_plots).
    network_cost = [{"radix": row["radix"], "gpus": row["gpus"], "fabric": row["fabric"],
                     "label": row["label"], "cost_million_usd": row["cost_total"] / 1e6,
                     "cost_per_gpu_usd": row["cost_per_gpu"],
                     "share_of_gpu_cost_pct": 100 * row["share_of_gpu_cost"],
                     "gpu_price_usd": settings["gpu_price"]} for row in rows]
    efficiency = [{"radix": radix, "gpus": gpus, "cost_efficiency_ratio": value}
                  for radix in settings["radices"] for gpus in settings["gpus"]
                  if (value := cost.rfabric_ratio(rows, radix, gpus)) is not None]

    ctx.log(f"cost table: {len(rows)} rows ({len(settings['fabrics'])} fabrics x "
            f"{len(settings['gpus'])} GPU counts x {len(settings['radices'])} radices) -> "
            f"cost.csv, cost.md, cost_vs_gpus.png, cost_per_gpu.png, cost_share_of_gpu.png")
    ctx.log(f"ZCube Table 6 at {TEXT_SCALE} (text in brackets):")
    for row in table6:
        ctx.log(f"  {row['label']:<10} ${row['cost_million_usd']:5.1f}M "
                f"(${row['text_million_usd']:.0f}M, {row['error_pct']:+.1f}%)")
    ctx.log(f"RFabric cost-efficiency over FT at {TEXT_SCALE}: {ratio:.2f}x "
            f"(text {cost.RFABRIC_TEXT_RATIO}x, {ratio_error:+.1f}%)")
    if settings["prices"]:
        ctx.log("price overrides: " + ", ".join(f"{k} = ${v:,g}"
                                                for k, v in settings["prices"].items()))
    return Outcome(metrics={
        "rows_count": len(rows),
        "table6_max_abs_error_pct": max(abs(row["error_pct"]) for row in table6),
        "rfabric_over_ft_ratio": ratio,
        "rfabric_over_ft_text_ratio": cost.RFABRIC_TEXT_RATIO,
        "rfabric_over_ft_error_pct": ratio_error,
        "table6": table6,
        "rfabric_over_ft": efficiency,
        "network_cost": network_cost,
    })


EXPERIMENT = Experiment(kind="cost", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.NONE)
