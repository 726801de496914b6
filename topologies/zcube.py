"""ZCube(n, 2): two switch layers, GPU (i, j) on A_i and B_j, A and B fully bipartite.

The ZCube(128, 2) construction of the 002 text (section 2, "concrete
construction"; Table 6: 256 switches, 49,152 x 200G cables for 16,384 GPUs)
and its cell table (section 5: 1,024 GPUs -> 64 switches of 64 ports,
4,096 -> 128 of 128, 16,384 -> 256 of 256)::

        A_0      A_1    ...   A_(n-1)         layer A: n switches
         | \\  \\ /  | \\ ...  /  |             A_i -- B_j for every i, j (n^2 links)
         |   \\ X   |   \\ .. /   |
        B_0      B_1    ...   B_(n-1)         layer B: n switches
     GPU (i, j): NIC port 0 -> A_i, NIC port 1 -> B_j   (n^2 GPUs, 2n ports per switch)

Port plan: A_i ports 1..n are GPUs (i, 0..n-1) and ports n+1..2n go to
B_0..B_(n-1); B_j ports 1..n are GPUs (0..n-1, j), ports n+1..2n go to A_*.

Which figure it matches, and which it does not: the text's recursive
definition (Figure 8a: ZCube(n, k) holds n^(k+1) GPUs, k+1 switch layers)
would give ZCube(n, 2) n^3 GPUs and three layers, which contradicts the
concrete ZCube(128, 2) = 16,384 GPUs, 256 switches, two ports per GPU, and
the cell table.  We build the concrete construction (n^2 GPUs, 2n switches,
diameter 2 switch hops).  The RailFly table's "ZCube bipartite links" column
(15,876 / 250,000 / 1,000,000 for 1K / 4K / 8K GPUs) is (GPUs / 8)^2, a
server-level count; here the bipartite links number n^2 = GPUs.

How it is modelled: one host per NIC port (single-homed hosts; the two
hosts of a GPU share ``gpu`` = i*n + j and carry ``nic_port`` 0 / 1).  The
text's two P -> D paths are then chosen by which ports a flow uses:
path 1 leaves on port 0 (P -> A_p -> B_d -> D's port 1), path 2 on port 1
(P -> B_p -> A_d -> D's port 0); plain shortest-path routing realises either.
`paths` lists them and `select_path` picks one per TP rank or per request,
never per packet.

Parameters: ``n`` (switches per layer), ``gbps`` (every link, 200 = a 400G
NIC split into 2 x 200G), ``gpus_per_server`` (GPU g is rank g % 8 of server
g // 8, so a server's GPUs share A_i and spread over the B layer).
"""

from __future__ import annotations

import zlib
from typing import List, Optional, Tuple

from topologies.counts import FabricCounts, cable_modules
from topologies.fabric import Fabric, FabricError

PORTS_PER_GPU = 2


def build(n: int = 4, gbps: float = 200.0, gpus_per_server: int = 8) -> Fabric:
    if n < 2:
        raise FabricError(f"zcube: n must be >= 2, got {n}")
    fabric = Fabric("zcube", params={"n": n, "gbps": gbps, "gpus_per_server": gpus_per_server})
    a_layer = [fabric.add_switch("zcube-a", layer="A", index=i, radix=2 * n, port_gbps=gbps)
               for i in range(n)]
    b_layer = [fabric.add_switch("zcube-b", layer="B", index=j, radix=2 * n, port_gbps=gbps)
               for j in range(n)]
    for i in range(n):
        for j in range(n):
            gpu = i * n + j
            for port, switch in enumerate((a_layer[i], b_layer[j])):
                host = fabric.add_host("gpu", gpu=gpu, nic_port=port, row=i, col=j,
                                       server=gpu // gpus_per_server, rail=gpu % gpus_per_server)
                fabric.add_link(host, switch, gbps)
    for i in range(n):
        for j in range(n):
            fabric.add_link(a_layer[i], b_layer[j], gbps)
    return fabric


def counts(n: int = 4, gbps: float = 200.0, gpus_per_server: int = 8) -> FabricCounts:
    if n < 2:
        raise FabricError(f"zcube: n must be >= 2, got {n}")
    gpus = n * n
    cables, modules = cable_modules({gbps: PORTS_PER_GPU * gpus + n * n}, {})
    return FabricCounts(
        fabric="zcube", gpus=gpus, nic_ports=PORTS_PER_GPU * gpus,
        switches={"zcube-a": n, "zcube-b": n},
        switch_ports={"zcube-a": (2 * n, gbps), "zcube-b": (2 * n, gbps)},
        cables=cables, optical_modules=modules, diameter=2,
        # Non-blocking: a GPU's 2 ports both leave its half through A or B at line rate.
        bisection_gbps=gpus // 2 * PORTS_PER_GPU * gbps)


def cell(gpus: int) -> dict:
    """Switches and ports per switch of a ZCube cell of `gpus` GPUs (cell table)."""
    n = int(round(gpus ** 0.5))
    if n * n != gpus:
        raise FabricError(f"zcube: a cell holds a square number of GPUs, got {gpus}")
    return {"n": n, "switches": 2 * n, "ports_per_switch": 2 * n, "gpus_per_switch": n}


def bisection_half(fabric: Fabric) -> List[int]:
    """GPUs of the first n/2 rows (A switches), a cut through the bipartite mesh."""
    n = fabric.params["n"]
    return list(range(n * n // 2))


# ------------------------------------------------------------------ dual paths
def _gpu_hosts(fabric: Fabric, gpu: int) -> Tuple[str, str]:
    ports = {}
    for host in fabric.hosts:
        data = fabric.graph.nodes[host]
        if data["gpu"] == gpu:
            ports[data["nic_port"]] = host
    if len(ports) != PORTS_PER_GPU:
        n = fabric.params["n"]
        raise FabricError(f"zcube: no GPU {gpu} in a {n}x{n} cube")
    return ports[0], ports[1]


def paths(fabric: Fabric, src_gpu: int, dst_gpu: int) -> List[List[str]]:
    """The two node paths P -> D: [via A_p then B_d, via B_p then A_d].

    When P and D share A_i (or B_j), that path is the one-switch path through it.
    """
    (src_a, src_b), (dst_a, dst_b) = _gpu_hosts(fabric, src_gpu), _gpu_hosts(fabric, dst_gpu)
    a_p, b_p = fabric.host_port(src_a)[0], fabric.host_port(src_b)[0]
    a_d, b_d = fabric.host_port(dst_a)[0], fabric.host_port(dst_b)[0]
    path1 = [src_a, a_p, dst_a] if a_p == a_d else [src_a, a_p, b_d, dst_b]
    path2 = [src_b, b_p, dst_b] if b_p == b_d else [src_b, b_p, a_d, dst_a]
    return [path1, path2]


def select_path(fabric: Fabric, src_gpu: int, dst_gpu: int, tp_rank: Optional[int] = None,
                request_id: Optional[str] = None) -> List[str]:
    """Path for one flow: even TP ranks take path 1 and odd ranks path 2 (the
    text's rank 0,2,4,6 / 1,3,5,7 split), or a stable hash of the request id.
    The flow's endpoints are the first and last hosts of the returned path."""
    if (tp_rank is None) == (request_id is None):
        raise FabricError("zcube.select_path: give exactly one of tp_rank or request_id")
    index = tp_rank % 2 if tp_rank is not None else zlib.crc32(str(request_id).encode()) % 2
    return paths(fabric, src_gpu, dst_gpu)[index]


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """The cell of ``gpus`` GPUs: its switch radix follows from the GPU count
    (2*sqrt(gpus) ports), so ``radix`` does not apply."""
    return {"n": cell(gpus)["n"], "gpus_per_server": gpus_per_server}
