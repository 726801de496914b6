"""One flow DAG on the flow-level model: what `emu.live.replay.Replayer` does on a
testbed, with `FlowSim` instead of iperf3.

Every flow of the DAG is one modelled flow, released when the DAG says
(``at_s`` after the start, or after the flows it waits for), routed by the
testbed's rule over the fabric (`traffic.model.network`), its ECMP draw keyed
by its id.  The result is one `FlowResult` per flow, times in model seconds
from 0.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from traffic.flows import FlowDag
from traffic.model.calibration import Calibration
from traffic.model.engine import FlowSim
from traffic.model.network import ModelNetwork, key_of
from traffic.results import FlowResult


def replay_dag(fabric, dag: FlowDag, bps_of: Callable[[float], float],
               calibration: Calibration, ecmp_seed: int = 1, key_prefix: str = "",
               progress=None, net: Optional[ModelNetwork] = None,
               coalesce: float = 0.0) -> List[FlowResult]:
    """Model ``dag`` on ``fabric``; one `FlowResult` per flow, in the DAG's order."""
    net = net or ModelNetwork(fabric, bps_of, ecmp_seed=ecmp_seed)
    flows = dag.flows
    src = np.array([net.index[f.src] for f in flows], dtype=np.int64)
    dst = np.array([net.index[f.dst] for f in flows], dtype=np.int64)
    keys = np.array([key_of(key_prefix + f.id) for f in flows], dtype=np.uint64)

    def route(ids: np.ndarray):
        return net.paths_indexed(src[ids], dst[ids], keys[ids])

    sim = FlowSim(net.capacity_bps, route, efficiency=calibration.efficiency,
                  hop_latency_s=calibration.hop_latency_s, startup_s=calibration.startup_s,
                  progress=progress, coalesce=coalesce)
    local = {f.id: i for i, f in enumerate(flows)}
    caps = np.array([f.rate_mbps * 1e6 if f.rate_mbps else np.inf for f in flows])
    sim.add_flows(np.array([f.bytes for f in flows], dtype=float),
                  delay_s=np.array([f.at_s for f in flows]),
                  after=[[local[d] for d in f.after] for f in flows], base_s=0.0, cap_bps=caps)
    sim.run()
    results = []
    for i, flow in enumerate(flows):
        start, end = float(sim.released_s[i]), float(sim.end_s[i])
        done = np.isfinite(end) and end >= start
        results.append(FlowResult(
            id=flow.id, src=flow.src, dst=flow.dst, bytes=flow.bytes, step=flow.step,
            group=flow.group, start=start, end=end if done else start,
            bytes_received=flow.bytes if done else 0,
            goodput_mbps=flow.bytes * 8 / (end - start) / 1e6 if done and end > start else 0.0,
            status="ok" if done else "failed",
            error="" if done else "no path: the flow never finished in the model"))
    return results
