"""A single ToR failure at the ZCube text's scale (4,096 GPUs), training collectives,
on the flow-level model.

The ZCube text reports the throughput lost to one ToR failure in a 4K-GPU
cluster: ROFT 46.9%, HPN 9.0%, ZCube 2.8%.  `pd-failure` measures it for
the P/D stream on 16 emulated GPUs (and, with ``engine = "model"`` and a
4,096-GPU ``fabric.spec``, on the model: scenario ``pd-failure-scale``).
This kind measures it for the training collectives of the ZCube text's
setting, at full scale: each GPU's rail (its local rank in its 8-GPU
server) runs a DP ring all-reduce over ``dp`` servers, and every group of
``ep`` servers runs an EP all-to-all on each rail, one after the other::

    iteration = ring all-reduce (DP, per rail, ``dp_bytes`` per GPU)
              -> all-to-all (EP, per rail, ``ep_bytes`` per pair)

A GPU with several NIC ports (ZCube's two layers, HPN's two planes) sends
on port ``local rank mod ports``, as the text splits by TP rank.  On HPN it
sends to the same port of its peer (the planes never meet); on ZCube to the
peer's *other* port, which is one of ZCube's own two paths (port 0 -> A ->
B -> port 1, or port 1 -> B -> A -> port 0: one fixed A-B link a pair).
Same port to same port there would take B -> A -> B, three switches, and
collide on the hashed A-B links (the ring ran 2.7x slower).

The failure takes the busiest ToR (`failover.busiest_tor`) down for the
whole failed iteration (the steady state after the controller rerouted):
its links have no capacity, routes avoid it, and every NIC port
behind it hands its flows to the port `traffic.failover` names (the GPU's
other port on ZCube and HPN, a server mate's NIC over NVLink on ROFT).  A
flow's other end follows where it must (`failover.FlowEnds`, as in
pd-failure): on HPN, whose planes never meet, to its GPU's port in the
plane taking over; on ZCube to its port one A-B link away.
Reported per fabric: iteration time healthy and failed (real seconds) and
the throughput degradation 1 - healthy / failed, next to the text's.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Tuple

from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import registry
from topologies.fabric import FabricError
from traffic import collectives as coll
from traffic import failover
from traffic.flows import FlowDag, ring_allreduce
from traffic.model import calibration
from traffic.model.dag import replay_dag
from traffic.model.network import ModelNetwork
from traffic.placement import PlacementError, Topology

SECTION = "failure_scale"
SUMMARY = ("one ToR failure at 4,096 GPUs on ROFT, HPN and ZCube under DP ring all-reduce "
           "+ EP all-to-all, on the flow-level model: iteration time healthy vs failed")
FABRICS = ("roft", "hpn", "zcube")
TEXT_DEGRADATION_PCT = {"roft": 46.9, "hpn": 9.0, "zcube": 2.8}
GPUS_PER_SERVER = 8

FIELDS = {
    "gpus": Field(int, 4096, "GPUs of every fabric", minimum=64),
    "fabrics": Field(list, list(FABRICS), "fabrics to compare", item=str,
                     choices=list(FABRICS)),
    "dp": Field(int, 32, "servers per DP ring (one ring per rail)", minimum=2),
    "ep": Field(int, 8, "servers per EP all-to-all group (one per rail)", minimum=2),
    "dp_bytes": Field(float, 1e9, "gradient bytes each GPU all-reduces per iteration",
                      minimum=1.0),
    "ep_bytes": Field(float, 16e6, "bytes each GPU sends each peer of its EP group",
                      minimum=1.0),
    "radix": Field(int, 64, "EPS radix where the fabric takes one", choices=[64, 128]),
    "failed_switch": Field(str, "auto", "the ToR that fails ('auto': the busiest)"),
    "coalesce": Field(float, 0.01, "a flow within this share of its own transfer of the "
                      "next drain drains with it (0: exact; traffic.model.engine)",
                      minimum=0.0, maximum=0.1),
}


def fabric_spec(name: str, settings) -> str:
    return registry.spec_at(name, settings["gpus"], radix=settings["radix"],
                            gpus_per_server=GPUS_PER_SERVER)


def check(scenario) -> None:
    s = scenario.section
    servers = s["gpus"] // GPUS_PER_SERVER
    if s["gpus"] % GPUS_PER_SERVER:
        raise ValueError(f"failure_scale.gpus must be a multiple of {GPUS_PER_SERVER}")
    for key in ("dp", "ep"):
        if servers % s[key]:
            raise ValueError(f"failure_scale.{key} = {s[key]} must divide the {servers} "
                             "servers")
    if not s["fabrics"] or len(set(s["fabrics"])) != len(s["fabrics"]):
        raise ValueError(f"failure_scale.fabrics must name distinct fabrics; allowed: "
                         f"{', '.join(FABRICS)}")
    for name in s["fabrics"]:
        try:
            registry.build(fabric_spec(name, s))
        except FabricError as exc:
            raise ValueError(f"failure_scale.fabrics: {name!r} does not build at "
                             f"{s['gpus']} GPUs: {exc}") from None


def gpu_ports(fabric) -> Dict[int, Tuple[str, ...]]:
    """GPU -> its NIC-port hosts in port order."""
    try:
        return Topology(fabric).gpu_hosts
    except PlacementError as exc:
        raise ValueError(f"{fabric.name}: {exc}") from None


def workload(ports: Dict[int, Tuple[str, ...]], settings, scale_bytes=1.0,
             other_port: bool = False) -> FlowDag:
    """The iteration's DAG on the fabric's hosts: DP rings, then EP all-to-alls.
    With ``other_port`` (ZCube) a flow goes to its peer's other NIC port."""
    gpus = sorted(ports)
    servers = len(gpus) // GPUS_PER_SERVER
    gpu_of = {nic: gpu for gpu, nics in ports.items() for nic in nics}

    def port(gpu: int) -> int:
        return (gpu % GPUS_PER_SERVER) % len(ports[gpu])

    def host(gpu: int) -> str:
        return ports[gpu][port(gpu)]

    dags: List[FlowDag] = []
    for rail in range(GPUS_PER_SERVER):
        for first in range(0, servers, settings["dp"]):
            ring = [host(s * GPUS_PER_SERVER + rail) for s in range(first, first + settings["dp"])]
            dags.append(ring_allreduce(ring, int(settings["dp_bytes"] * settings["dp"]),
                                       group=f"dp-r{rail}-s{first}"))
    sinks = tuple(fid for d in dags for fid in coll.sinks(d))
    for rail in range(GPUS_PER_SERVER):
        for first in range(0, servers, settings["ep"]):
            group = [host(s * GPUS_PER_SERVER + rail) for s in range(first, first + settings["ep"])]
            dags.append(coll.all_to_all(group, int(settings["ep_bytes"]),
                                        f"ep-r{rail}-s{first}", start_after=sinks))
    dag = FlowDag.merge(*dags)
    if not other_port:
        return dag

    def receiving(nic: str) -> str:
        gpu = gpu_of[nic]
        return ports[gpu][(port(gpu) + 1) % len(ports[gpu])]

    # Ids and dependencies unchanged: the merged DAG's order still holds.
    return FlowDag([f._replace(dst=receiving(f.dst)) for f in dag.flows])


def _iteration_s(results) -> float:
    ok = [r for r in results if r.status == "ok"]
    if len(ok) != len(results):
        raise RuntimeError(f"{len(results) - len(ok)} flows never finished")
    return max(r.end for r in ok) - min(r.start for r in ok)


def model_fabric(name: str, settings, cal, log) -> dict:
    spec = fabric_spec(name, settings)
    fabric = registry.build(spec)
    ports = gpu_ports(fabric)
    dag = workload(ports, settings, other_port=fabric.name == "zcube")
    started = time.time()
    healthy = _iteration_s(replay_dag(fabric, dag, lambda g: g * 1e9, cal,
                                      coalesce=settings["coalesce"]))
    switch = settings["failed_switch"]
    if switch == "auto":
        switch = failover.busiest_tor(fabric, [(f.src, f.dst, f.bytes) for f in dag.flows])
    moves = failover.failover_map(fabric, [switch])
    stranded = sorted(h for h, to in moves.items() if to is None)
    if stranded:
        raise ValueError(f"{name}: {len(stranded)} NIC ports behind {switch} have no "
                         f"failover port ({stranded[:3]} ...)")
    # Both ends of a flow move together (as pd-failure's): an end alone on
    # the other plane of HPN would leave the flow no path (the blackhole).
    ends = failover.FlowEnds(fabric, moves)
    moved = {f.id: ends(f.src, f.dst) for f in dag.flows if f.src in moves or f.dst in moves}
    cut = sorted(fid for fid, (src, dst) in moved.items() if src is None or dst is None)
    if cut:
        raise ValueError(f"{name}: {len(cut)} flows with an end behind {switch} are cut off: "
                         f"an end has no port in the network the other fails over to "
                         f"({cut[:3]} ...)")
    failed_dag = FlowDag([dataclasses.replace(f, src=moved[f.id][0], dst=moved[f.id][1])
                          if f.id in moved else f for f in dag.flows])
    net = ModelNetwork(fabric, lambda g: g * 1e9)
    net.fail_node(switch)
    failed = _iteration_s(replay_dag(fabric, failed_dag, lambda g: g * 1e9, cal, net=net,
                                     coalesce=settings["coalesce"]))
    degradation = (1 - healthy / failed) * 100
    row = {"fabric": name, "spec": spec, "failed_switch": switch,
           "ports_moved_count": len(moves), "flows_count": len(dag.flows),
           "iteration_healthy_s": healthy, "iteration_failed_s": failed,
           "throughput_degradation_pct": degradation,
           "text_degradation_pct": TEXT_DEGRADATION_PCT[name],
           "model_wall_s": time.time() - started}
    log(f"  {name} ({spec}): {len(dag.flows):,} flows; {switch} fails ({len(moves)} NIC "
        f"ports move): {healthy:.3f} s -> {failed:.3f} s, {degradation:.1f}% worse "
        f"(text {TEXT_DEGRADATION_PCT[name]}%), model {row['model_wall_s']:.1f} s")
    return row


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    cal = calibration.load().for_real_world(400.0)
    rows = [model_fabric(name, s, cal, ctx.log) for name in s["fabrics"]]
    order = [r["fabric"] for r in sorted(rows, key=lambda r: r["throughput_degradation_pct"])]
    text = sorted(s["fabrics"], key=lambda n: TEXT_DEGRADATION_PCT[n])
    metrics = {"failures": rows, "order_least_degraded": order, "text_order": text,
               "same_order_as_text": order == text}
    for row in rows:
        metrics[f"{row['fabric']}_degradation_pct"] = row["throughput_degradation_pct"]
    return Outcome(metrics=metrics)


EXPERIMENT = Experiment(kind="failure-scale", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.NONE)
