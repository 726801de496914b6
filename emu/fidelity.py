"""Was the emulator, rather than the emulated fabric, the bottleneck?

A run whose data plane ran out of CPU measures the emulator, not the fabric,
so every testbed is sampled while it runs (`emu.live.cpu`) and every flow is
checked:

* :func:`fidelity_rows` turns measured flows into what the check needs: each
  flow's time span, goodput, the configured rate of its path and the links
  it may have used;
* :func:`assess` turns the CPU summary and those rows into warnings: a flow
  that had its links to itself but fell short of its path's configured
  rate, or a saturated CPU, means the numbers should not be trusted.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Mapping, Optional, Sequence

from topologies import routing
from topologies.fabric import Fabric
from traffic.scale import Scale


# Frozen before the data-plane comparisons were measured (README, "Fidelity"):
# the kernel's forwarding is softirq time, and a sample where it took this
# share of all cores is a machine that cannot forward more.
SOFTIRQ_PCT = 50.0


# Flows --------------------------------------------------------------------------

def path_links(fabric: Fabric, src: str, dst: str) -> List[str]:
    """Links on any current shortest path (ECMP may pick any of them), each in
    the direction from ``src`` to ``dst`` and named as `directed_links` names
    them; of parallel links, every one."""
    logical = fabric.logical_graph()
    return sorted({link for path in routing.shortest_paths(logical, src, dst)
                   for u, v in zip(path, path[1:]) for link in _hop_links(fabric, u, v)})


def _hop_links(fabric: Fabric, u: str, v: str, port: Optional[int] = None) -> List[str]:
    """The directed link(s) from u to v: the one on ``port``, or, not knowing the
    port, every one.  Parallel links are told apart by u's port; a single
    link (or a circuit through an OCS) is just ``u->v``."""
    graph = fabric.graph
    parallel = graph.number_of_edges(u, v) if graph.has_edge(u, v) else 0
    if parallel < 2:
        return [f"{u}->{v}"]
    ports = [port] if port is not None else sorted(
        data["ports"][u] for data in graph.get_edge_data(u, v).values())
    return [f"{u}->{v} (port {p})" for p in ports]


def path_cap_mbps(fabric: Fabric, scale: Scale, src: str, dst: str) -> Optional[float]:
    """Emulated Mbit/s of the fastest shortest path's slowest link."""
    logical = fabric.logical_graph()
    caps = []
    for path in routing.shortest_paths(logical, src, dst):
        caps.append(min(min(d["gbps"] for d in logical[u][v].values())
                        for u, v in zip(path, path[1:])))
    return scale.emu_mbps(max(caps)) if caps else None


def directed_links(path: Sequence[str], fabric: Optional[Fabric] = None,
                   ports: Optional[Sequence[int]] = None) -> List[str]:
    """The links a packet crosses along a node path, each in its direction;
    with the ``fabric`` and each node's out ``ports``, parallel links are told
    apart (``s1->s4 (port 7)``)."""
    if fabric is None:
        return [f"{u}->{v}" for u, v in zip(path, path[1:])]
    ports = list(ports) if ports else [None] * (len(path) - 1)
    return [link for (u, v), port in zip(zip(path, path[1:]), ports)
            for link in _hop_links(fabric, u, v, port)]


def fidelity_rows(fabric: Fabric, scale: Scale, flows, prefix: str = "",
                  paths: Optional[Mapping[int, Sequence[str]]] = None,
                  ports: Optional[Mapping[int, Sequence[int]]] = None) -> List[Dict]:
    """One row per finished flow (`emu.live.replay.FlowResult`) for `assess`;
    ``prefix`` tells links of different testbeds apart (``"zcube:"``).  Where
    ``paths`` knows the nodes a flow's data crossed (the data plane's own ECMP
    choice), its links are those, each in its direction; otherwise every link
    of every shortest path between its hosts (any of them may have carried it).
    ``paths`` and ``ports`` are keyed by the flow's position in ``flows`` (flow
    ids may repeat: one testbed can replay the same stream several times);
    ``ports`` (each node's out port) tells parallel links apart."""
    rows = []
    for index, flow in enumerate(flows):
        if flow.status != "ok":
            continue
        path = (paths or {}).get(index)
        links = directed_links(path, fabric, (ports or {}).get(index)) if path \
            else path_links(fabric, flow.src, flow.dst)
        row = {"id": flow.id, "start": flow.start, "end": flow.end,
               "goodput_mbps": flow.goodput_mbps, "bytes": flow.bytes,
               "retransmits": flow.retransmits,
               "connection": _connection(flow),
               "cap_mbps": path_cap_mbps(fabric, scale, flow.src, flow.dst),
               "links": [prefix + link for link in links]}
        if path:
            row["path"] = list(path)
        rows.append(row)
    return rows


def _connection(flow) -> Optional[str]:
    """The TCP connection that carried a flow, where its ports are known: flows a
    kept connection carries one after another queue behind each other on it,
    they never compete for a link."""
    if not (flow.sport and flow.dport):
        return None
    return f"{flow.src}:{flow.sport}->{flow.dst}:{flow.dport}"


def _compete(a: Mapping, b: Mapping) -> bool:
    """Whether two flows ran at once on separate connections (the ECMP hash
    placed them; one connection's flows queue on it whatever the hash)."""
    same = a.get("connection") is not None and a.get("connection") == b.get("connection")
    return not same and a["start"] < b["end"] and b["start"] < a["end"]


def shared_links(flows: Sequence[Mapping], limit: int = 50) -> List[dict]:
    """Links that carried two or more flows at once, among flows whose actual
    path is known (``path`` in the row): with flow-hashed multipath, two flows
    may meet on one link, which slows both, and that is the fabric's behaviour,
    not the emulator's.  Flows of one ``connection`` (a kept connection's
    consecutive flows) do not count.  One row per link, the longest shared
    time first: ``{"link", "flows", "overlap_s"}``."""
    users = defaultdict(list)
    for flow in flows:
        if flow.get("path"):
            for link in flow["links"]:
                users[link].append(flow)
    rows = []
    for link, on_link in users.items():
        overlap, sharing = 0.0, set()
        for i, a in enumerate(on_link):
            for b in on_link[i + 1:]:
                common = min(a["end"], b["end"]) - max(a["start"], b["start"])
                if _compete(a, b):
                    overlap += common
                    sharing |= {a["id"], b["id"]}
        if sharing:
            rows.append({"link": link, "flows": sorted(sharing), "overlap_s": overlap})
    rows.sort(key=lambda row: (-row["overlap_s"], row["link"]))
    return rows[:limit]


# Assessment --------------------------------------------------------------------

# A flow is held to its rate only if it is long enough to show one: at its cap
# it lasts this long at least (shorter ones are mostly TCP's slow start and
# iperf3's per-flow set-up, a few milliseconds).
MIN_CHECKED_S = 0.2

_FLOW_KEYS = ("id", "start", "end", "goodput_mbps", "cap_mbps", "links")


def _check_flows(flows: Sequence[Mapping]) -> None:
    for index, flow in enumerate(flows):
        missing = [key for key in _FLOW_KEYS if key not in flow]
        if missing:
            raise ValueError(f"flow #{index} ({flow.get('id', '?')}) lacks "
                             f"key(s) {missing}; each flow needs {list(_FLOW_KEYS)}")
        if flow["end"] < flow["start"]:
            raise ValueError(f"flow {flow['id']}: end ({flow['end']}) is before "
                             f"start ({flow['start']})")


def _alone(flows: Sequence[Mapping]) -> List[bool]:
    """For each flow: did no other flow use one of its links while it ran?"""
    users = defaultdict(list)
    for index, flow in enumerate(flows):
        for link in set(flow["links"]):
            users[link].append(index)
    alone = []
    for index, flow in enumerate(flows):
        others = {other for link in set(flow["links"]) for other in users[link]
                  if other != index}
        # Strict inequalities: a flow that starts as another ends did not
        # share the link with it.  A kept connection's next flow that queued
        # behind the one before it did share it, with that one.
        overlapping = [other for other in others
                       if flows[other]["start"] < flow["end"]
                       and flows[other]["end"] > flow["start"]]
        alone.append(not overlapping)
    return alone


def _held_to_rate(flow: Mapping, cap_mbps: float) -> Optional[str]:
    """Why a lone flow is not held to its rate (None: it is).

    Too short to show a rate; or it retransmitted: alone on its links, it lost
    packets only where it overran its own bottleneck queue (TCP's slow start
    overshooting it), which is transport behaviour that queue produces.
    Packets the machine dropped (veth and backlog drops, ovs-vswitchd's send
    failures) are caught by their own counters, whatever flow lost them.
    """
    if flow.get("bytes") and flow["bytes"] * 8 / (cap_mbps * 1e6) < MIN_CHECKED_S:
        return f"shorter than {MIN_CHECKED_S:g} s at its rate"
    if flow.get("retransmits"):
        return f"{flow['retransmits']} retransmissions at its own queue"
    return None


def _pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0f} %"


def _cpu_warnings(cpu_summary: Optional[Mapping], saturation_pct: float,
                  softirq_pct: float, kernel_forwarding: bool = False) -> List[str]:
    if not cpu_summary:
        return []
    warnings = []
    softirq = cpu_summary.get("softirq_pct") or {}
    if (softirq.get("max") or 0) >= softirq_pct:
        warnings.append(
            f"kernel forwarding saturated: softirq took {_pct(softirq.get('max'))} (mean "
            f"{_pct(softirq.get('mean'))}) of all {cpu_summary.get('cores')} cores, at or above "
            f"{softirq_pct:.0f} %; rates may reflect the emulator, not the fabric")
    machine = cpu_summary.get("machine_cpu_pct") or {}
    mean, peak = machine.get("mean"), machine.get("max")
    cores = cpu_summary.get("cores")
    # Where the kernel forwards, softirq pre-empts processes: a peak of process
    # start-ups (iperf3 servers, agents' forks) does not hold packets back, a
    # machine busy on average does.  A userspace datapath competes with them.
    if (mean is not None and mean >= saturation_pct) or \
            (not kernel_forwarding and peak is not None and peak >= saturation_pct):
        warnings.append(
            f"datapath saturated: machine CPU reached {_pct(peak)} "
            f"(mean {_pct(mean)}) of all {cores} cores, at or above "
            f"{saturation_pct:.0f} %; rates may reflect the emulator, not the fabric")
    ovs = (cpu_summary.get("processes") or {}).get("ovs-vswitchd") or {}
    ovs_peak = ovs.get("max_pct_of_core")
    if ovs_peak is not None and ovs_peak >= saturation_pct:
        warnings.append(
            f"datapath saturated: ovs-vswitchd reached {_pct(ovs_peak)} of one "
            f"core (mean {_pct(ovs.get('mean_pct_of_core'))}), at or above "
            f"{saturation_pct:.0f} %; "
            f"its userspace datapath forwards on one thread, so rates may "
            f"reflect the emulator, not the fabric")
    return warnings


def _server_cpu_warnings(servers_cpu: Optional[Mapping[str, Optional[float]]],
                         saturation_pct: float) -> List[str]:
    return [f"datapath saturated: server {server} used {pct:.0f} % of its cores over the "
            f"run, at or above {saturation_pct:.0f} %; rates may reflect the emulator, not "
            "the fabric"
            for server, pct in sorted((servers_cpu or {}).items())
            if pct is not None and pct >= saturation_pct]


def _drop_warnings(drops: Optional[Mapping]) -> List[str]:
    """Losses outside the emulated queues (`emu.live.drops`): the machine ran short."""
    if not drops:
        return []
    warnings = []
    early = drops.get("veth_drops", 0) + drops.get("softnet_drops", 0)
    if early:
        warnings.append(
            f"datapath saturated: the kernel dropped {early} packet(s) before any emulated "
            "queue (a receive backlog was full: softirq could not keep up); rates may "
            "reflect the emulator, not the fabric")
    if drops.get("vswitchd_hidden", 0):
        warnings.append(
            f"datapath saturated: ovs-vswitchd could not send at least "
            f"{drops['vswitchd_hidden']} packet(s) (\"Resource temporarily unavailable\" on "
            "its shared send socket), drops no counter shows; rates may reflect the "
            "emulator, not the fabric")
    return warnings


def assess(flows: Sequence[Mapping], cpu_summary: Optional[Mapping], *,
           saturation_pct: float = 90.0, goodput_floor: float = 0.9,
           softirq_pct: float = SOFTIRQ_PCT, drops: Optional[Mapping] = None,
           kernel_forwarding: bool = False,
           servers_cpu: Optional[Mapping[str, Optional[float]]] = None) -> dict:
    """Fidelity warnings for one run.

    ``flows``: dicts with ``id``, ``start`` and ``end`` (epoch s),
    ``goodput_mbps``, ``cap_mbps`` (the configured bottleneck rate of the
    flow's path, emulated Mbit/s, or None) and ``links`` (ids of the links
    its path used).  A flow is *alone* if no other flow used any of its
    links during an overlapping time.  An alone flow with a cap should reach
    nearly all of it: TCP goodput over 1500-byte frames is about 95 % of the
    line rate, so the default floor is 90 %.  Falling short means the
    emulator (CPU, datapath) limited it, and gives a warning, unless the flow
    is too short to show a rate or lost packets at its own queue
    (`_held_to_rate`: optional ``bytes`` and ``retransmits`` keys; the row
    then says why in ``not_held``).

    ``cpu_summary`` is :meth:`CpuSampler.stop`'s result or None.  Machine
    CPU mean or max (only the mean where the kernel forwards,
    ``kernel_forwarding``), or ovs-vswitchd's max (percent of one core), at
    or above ``saturation_pct``, or softirq's max (the kernel forwarding, as
    a share of all cores) at or above ``softirq_pct``, marks the run saturated.
    So do ``drops`` (`emu.live.drops` counts) outside the emulated queues:
    veth and backlog drops, or ovs-vswitchd's hidden send failures.  Drops
    at the emulated queues are congestion, fabric behaviour: reported, not
    warned about.

    ``servers_cpu`` (cluster mode): each server's CPU over the run, in
    percent of all its cores; one at or above ``saturation_pct`` marks the
    run saturated too, since the flows it forwards share its cores.

    Flows whose actual path is known (``path``) are also checked for links
    they shared while they ran (`shared_links`): an explanation of a
    slowdown, not a warning.

    Returns ``{"cpu", "drops", "paths_known_count", "shared_links",
    "flows_sharing_a_link_count", "flows_checked", "alone_flows", "warnings",
    "saturated", "thresholds"}``; ``flows_checked`` counts the flows given,
    ``alone_flows`` has one row per alone flow with a cap and a goodput.
    """
    if not 0 < goodput_floor <= 1:
        raise ValueError(f"goodput_floor must be in (0, 1], got {goodput_floor!r}")
    if not 0 < saturation_pct <= 100:
        raise ValueError(f"saturation_pct must be in (0, 100], got {saturation_pct!r}")
    _check_flows(flows)
    warnings = []
    rows = []
    for flow, alone in zip(flows, _alone(flows)):
        cap, goodput = flow["cap_mbps"], flow["goodput_mbps"]
        if not alone or cap is None or cap <= 0 or goodput is None:
            continue
        ratio = goodput / cap
        held = _held_to_rate(flow, cap)
        ok = ratio >= goodput_floor or held is not None
        rows.append({"id": flow["id"], "goodput_mbps": goodput,
                     "cap_mbps": cap, "ratio": ratio, "ok": ok, "not_held": held})
        if not ok:
            warnings.append(
                f"flow {flow['id']} had its links to itself but reached "
                f"{goodput:.1f} Mbit/s of its {cap:.1f} Mbit/s cap "
                f"(ratio {ratio:.2f} < {goodput_floor:.2f}): the emulator, "
                f"not the fabric, limited it")
    saturation = _cpu_warnings(cpu_summary, saturation_pct, softirq_pct,
                               kernel_forwarding) + \
        _drop_warnings(drops) + _server_cpu_warnings(servers_cpu, saturation_pct)
    shared = shared_links(flows)
    resolved = sum(1 for flow in flows if flow.get("path"))
    return {"cpu": cpu_summary,
            "servers_cpu_pct": dict(servers_cpu) if servers_cpu else None,
            "drops": dict(drops) if drops else None,
            "paths_known_count": resolved,
            "shared_links": shared,
            "flows_sharing_a_link_count": len({f for row in shared for f in row["flows"]}),
            "flows_checked": len(flows),
            "alone_flows": rows,
            "warnings": saturation + warnings,
            "saturated": bool(saturation),
            "thresholds": {"saturation_pct": saturation_pct, "softirq_pct": softirq_pct,
                           "goodput_floor": goodput_floor,
                           "machine_cpu": "mean" if kernel_forwarding else "mean or max"}}
