"""What the three P/D scenarios share: their schema, the fabrics at one GPU count,
TP nodes and placement, the request stream, and the check that a fabric fits.

pd-inference, pd-failure and pd-pairing serve the same kind of seeded
request stream (`traffic.requests`) on fabrics built at the GPU count of
``[fabric] spec``, a ZCube (`fabric_specs`, by each fabric's own rule in
`topologies.registry`), cut into nodes of ``tp`` GPUs
(`traffic.placement.Topology`) and placed in affinity tiles or zones.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

from emu.schema import Field
from topologies import registry
from topologies.fabric import FabricError, ScaleError
from traffic import kvwindow
from traffic import requests as rq
from traffic.kvflows import STRATEGIES
from traffic.pairing import PAIRINGS
from traffic.placement import TILES, Placement, PlacementError, Topology, placement

#: The fabrics a P/D scenario can compare, in the order its messages list them.
FABRICS = ("zcube", "roft", "railfly", "hpn", "rail-fabric")
#: Packet-switch ports of the fabrics built at the reference's GPU count: at
#: 16 GPUs HPN is then two tiers, one segment (every ToR pair, one per plane,
#: is a rail).
EMULATED_RADIX = 8
#: From this many GPUs the other fabrics are built as the texts build them, with
#: radix-64 switches: no machine emulates that many, only the flow-level model.
FULL_SCALE_GPUS = 256
TEXT_RADIX = 64

#: The longest stream an emulation replays (a few minutes on one machine); the
#: flow-level model (``testbed.engine = "model"``) takes more.
EMULATED_REQUESTS = 200


def nodes_text(nodes) -> str:
    """A node list for the log: whole when short, counted when long (1,024 GPUs)."""
    nodes = list(nodes)
    return str(nodes) if len(nodes) <= 12 else f"{len(nodes)} nodes"


def check_stream(scenario, section: str) -> None:
    """Refuse a stream too long to emulate, naming the key and the way out."""
    count = scenario.section["requests"]
    if not scenario.models and count > EMULATED_REQUESTS:
        raise ValueError(f"{section}.requests = {count}: an emulation replays at most "
                         f"{EMULATED_REQUESTS}; set testbed.engine = 'model' (--set "
                         "engine=model) for longer streams")


#: Settings every P/D scenario takes (each picks those it needs, by key).
FIELDS = {
    "workload": Field(str, "deep-thinking", "request profile (section 4)",
                      choices=sorted(rq.WORKLOADS)),
    "requests": Field(int, 16, "requests in the stream (at most EMULATED_REQUESTS when "
                      "emulated; the flow-level model takes up to 20,000)", minimum=1,
                      maximum=20000),
    "rate_per_s": Field(float, 30.0, "arrival rate, real requests per second", minimum=0.01),
    "seed": Field(int, 1, "stream, placement and random pairing seed"),
    "tp": Field(int, 2, "GPUs per P or D node (TP size)", minimum=1),
    "placement": Field(str, "tiles", "affinity tiles or the zone baseline",
                       choices=["tiles", "zone"]),
    "tile": Field(str, "3p2d", "tile shape (P+D per tile)", choices=sorted(TILES)),
    "pairing": Field(str, "fixed", "P/D pairing strategy", choices=list(PAIRINGS)),
    "path_strategy": Field(str, "tp-rank", "ZCube dual-path choice", choices=list(STRATEGIES)),
    "d_credits": Field(int, 2, "KV streams (requests) a D accepts at once", minimum=1,
                       maximum=8),
    "path_credits": Field(int, 0, "KV streams a switch-to-switch link admits at once (path "
                          "credits); 0: no path credits", minimum=0, maximum=16),
    "kv_window": Field(str, kvwindow.BOUNDED, "each KV flow's TCP window: 'bounded' so "
                       "that every KV flow a D admits fits in one link queue (the texts' "
                       "lossless RDMA, `traffic.kvwindow`), or 'tcp' (autotuned; loss and "
                       "retransmission timeouts)", choices=list(kvwindow.RULES)),
    "prefill_ms_per_ktoken": Field(float, 5.0, "prefill compute, real ms per 1K new prompt "
                                   "tokens (x tdf)", minimum=0.0),
    "lock_wait_s": Field(float, 600.0, "how long a later fabric waits for the run lock if "
                         "another emulation took it between fabrics", minimum=0.0),
}


def gpu_count(fabric) -> int:
    """GPUs of a fabric: a GPU with several NIC ports (several hosts) counts once."""
    return len({fabric.graph.nodes[h].get("gpu", i) for i, h in enumerate(fabric.hosts)})


def fabric_specs(spec: str, names: Sequence[str]) -> Dict[str, str]:
    """Spec of each fabric at the GPU count and GPUs per server of ``spec`` (a ZCube),
    by each fabric's small-build rule (`topologies.registry.spec_at`); raises
    ValueError naming ``pd-inference.fabrics`` and the allowed values."""
    reference = registry.build(spec)
    if reference.name != "zcube":
        raise ValueError(f"fabric.spec must be a zcube spec (the reference GPU count), "
                         f"got {reference.name!r}")
    gpus = gpu_count(reference)
    per_server = reference.params["gpus_per_server"]
    specs = {}
    for name in names:
        if name not in FABRICS:
            raise ValueError(f"pd-inference.fabrics: unknown fabric {name!r}; allowed: "
                             f"{', '.join(FABRICS)}")
        if name == "zcube":
            specs[name] = spec                  # the reference, as the scenario wrote it
            continue
        # The texts' fabrics (radix-64 EPS, their full-scale rules) from the GPU
        # count of a cell that only the flow-level model runs.
        full = gpus >= FULL_SCALE_GPUS
        try:
            specs[name] = registry.spec_at(name, gpus,
                                           radix=TEXT_RADIX if full else EMULATED_RADIX,
                                           gpus_per_server=per_server, small=not full)
        except ScaleError as exc:
            raise ValueError(exc.naming("pd-inference.fabrics", FABRICS)) from None
    return specs


def topology(fabric, tp: int) -> Topology:
    return Topology(fabric, gpus_per_node=tp)


def make_placement(topo: Topology, settings) -> Placement:
    return placement(topo, settings["placement"], settings["tile"], seed=settings["seed"])


def check_fabric_fits(name: str, spec: str, fabric, settings, section: str,
                      key: str = "fabrics") -> None:
    """The fabric splits into TP nodes and takes the placement, or ValueError
    naming ``<section>.<key>``."""
    try:
        topo = topology(fabric, settings["tp"])
        make_placement(topo, settings)
    except (FabricError, PlacementError) as exc:
        raise ValueError(f"{section}.{key}: {name!r} ({spec}) does not work with "
                         f"{section}.tp={settings['tp']} and {section}.placement="
                         f"{settings['placement']!r}: {exc}; allowed fabrics: "
                         f"{', '.join(FABRICS)}") from None
    if any(node.tp != settings["tp"] for node in topo.nodes):
        raise ValueError(f"{section}.tp={settings['tp']} does not divide {name!r}'s "
                         f"{gpu_count(fabric)} GPUs into equal nodes")


def stream_of(settings) -> List[rq.Request]:
    """The scenario's seeded request stream."""
    return rq.generate(rq.workload(settings["workload"]), settings["rate_per_s"],
                       settings["seed"], count=settings["requests"])
