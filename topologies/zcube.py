"""ZCube(n, k): k switch layers of n^(k-1) switches, n^k GPUs with one NIC port per layer.

The 002 text's recursion (section 2, "Recursive definition", paper Figure 8a)::

    ZCube(n, 1)   = 1 switch + n GPUs
    ZCube(n, k+1) = n x ZCube(n, k) + n^k new switches (one new layer)

Each new switch takes one GPU from each of the n copies (as in BCube), and
is wired to the n switches of the layer below that hold those GPUs.  A GPU
is then the k base-n digits of its id, ``gpu = sum(d_l * n^l)``; the layer-l
switch of a GPU holds the n GPUs that differ from it in digit l only (its
index is the id with digit l taken out), and a layer-l and a layer-(l+1)
switch are linked when they share a GPU (one link per GPU per adjacent
layer pair)::

     layer 0 (A)  S_0(x)  n GPUs + n up                   = 2n ports
                    |  one link per shared GPU
     layer 1 (B)  S_1(x)  n GPUs + n down + n up          = 3n ports
       ...          |
     layer k-1    S_k-1   n GPUs + n down                 = 2n ports
     GPU x: NIC port l -> its layer-l switch (k ports per GPU)

Counts (tested against these formulas): n^k GPUs, k layers of n^(k-1)
switches, end layers 2n ports and middle layers 3n (the text's "first and
last layer switches require 2n ports, while intermediate layers require 3n
ports"), k * n^k GPU links and (k-1) * n^k switch links, diameter k switch
hops (the text's Theorem 1): climb from the source's layer-0 switch to the
top, fixing one digit per layer.

Which figure it matches, and which it does not: the text says ZCube(n, k)
"contains n^(k+1) GPUs, k+1 layers of switches (n^k per layer), and each GPU
has (k+1) NIC ports", which is off by one against its own recursion
(ZCube(n, 1) is one switch, one layer, n GPUs) and against its concrete
ZCube(128, 2) = 16,384 GPUs, 256 switches, two ports per GPU, and the cell
table.  We count as the recursion and the example do: n^k GPUs, k layers of
n^(k-1) switches, k ports per GPU.

ZCube(n, 2), the deployed construction (Table 6: 256 switches, 49,152 x
200G cables for 16,384 GPUs; cell table, section 5: 1,024 GPUs -> 64
switches of 64 ports, 4,096 -> 128 of 128, 16,384 -> 256 of 256)::

        A_0      A_1    ...   A_(n-1)         layer A: n switches
         | \\  \\ /  | \\ ...  /  |             A_i -- B_j for every i, j (n^2 links)
         |   \\ X   |   \\ .. /   |
        B_0      B_1    ...   B_(n-1)         layer B: n switches
     GPU (i, j): NIC port 0 -> A_i, NIC port 1 -> B_j   (n^2 GPUs, 2n ports per switch)

Port plan: A_i ports 1..n are GPUs (i, 0..n-1) and ports n+1..2n go to
B_0..B_(n-1); B_j ports 1..n are GPUs (0..n-1, j), ports n+1..2n go to A_*.
For any k a switch's ports 1..n are its GPUs (in id order), then n ports to
the layer below (middle layers), then n to the layer above.  Names and
dpids: the layers' switches in layer order, then per GPU its k hosts.  The
RailFly table's "ZCube bipartite links" column (15,876 / 250,000 /
1,000,000 for 1K / 4K / 8K GPUs) is (GPUs / 8)^2, a server-level count; here
the bipartite links of ZCube(n, 2) number n^2 = GPUs.

How it is modelled: one host per NIC port (single-homed hosts; the k hosts
of a GPU share ``gpu`` and carry ``nic_port`` 0..k-1, ``row`` = gpu // n
and ``col`` = gpu % n, i.e. (i, j) for k = 2).  The text's two P -> D paths
are chosen by which ports a flow uses: path 1 climbs from P's port 0
(P -> A_p -> B_d -> D's port 1 for k = 2), path 2 descends from P's port
k-1 (P -> B_p -> A_d -> D's port 0); plain shortest-path routing between
those two hosts realises either.  `paths` lists them and `select_path` picks
one per TP rank or per request, never per packet.

Parameters: ``n`` (switches per layer for k = 2; GPUs per switch),
``k`` (layers, NIC ports per GPU; 1 .. 26), ``gbps`` (every link, 200 = a
400G NIC split into 2 x 200G), ``gpus_per_server`` (GPU g is rank g % 8 of
server g // 8, so a server's GPUs share A_i and spread over the B layer).
"""

from __future__ import annotations

import string
import weakref
import zlib
from typing import Dict, List, Optional, Tuple

from topologies.counts import FabricCounts, cable_modules
from topologies.fabric import Fabric, FabricError

PORTS_PER_GPU = 2            # of the deployed ZCube(n, 2); ZCube(n, k) has k
MAX_LAYERS = len(string.ascii_uppercase)
ROFT_THROUGHPUT_GAIN = 1.15  # section 2: GLM-5.1 cluster moved from ROFT, +15% per GPU


def _check(n: int, k: int) -> None:
    if n < 2:
        raise FabricError(f"zcube: n must be >= 2, got {n}")
    if not 1 <= k <= MAX_LAYERS:
        raise FabricError(f"zcube: k (switch layers) must be in 1..{MAX_LAYERS}, got {k}")


def layer_name(layer: int) -> str:
    """``A``, ``B``, ``C`` ...: the layer tag; the role is ``zcube-a`` etc."""
    return string.ascii_uppercase[layer]


def switch_index(gpu: int, layer: int, n: int) -> int:
    """Index within its layer of GPU ``gpu``'s layer-``layer`` switch: the id with
    base-n digit ``layer`` taken out (A_i: i = gpu // n; B_j: j = gpu % n)."""
    low = gpu % n ** layer
    return (gpu // n ** (layer + 1)) * n ** layer + low


def layer_radix(n: int, k: int, layer: int) -> int:
    """Ports of a layer-``layer`` switch: n GPUs plus n per adjacent layer."""
    return n * (1 + (layer > 0) + (layer < k - 1))


def build(n: int = 4, k: int = 2, gbps: float = 200.0, gpus_per_server: int = 8) -> Fabric:
    _check(n, k)
    if gpus_per_server < 1:     # it numbers the servers: 0 divided by zero, < 0 made them negative
        raise FabricError(f"zcube: gpus_per_server must be >= 1, got {gpus_per_server}")
    params: Dict[str, object] = {"n": n, "gbps": gbps, "gpus_per_server": gpus_per_server}
    if k != 2:
        params["k"] = k           # ZCube(n, 2) keeps the parameters (and JSON) it always had
    fabric = Fabric("zcube", params=params)
    layers = [[fabric.add_switch(f"zcube-{layer_name(layer).lower()}", layer=layer_name(layer),
                                 index=i, radix=layer_radix(n, k, layer), port_gbps=gbps)
               for i in range(n ** (k - 1))] for layer in range(k)]
    gpus = n ** k
    for gpu in range(gpus):
        for port in range(k):
            host = fabric.add_host("gpu", gpu=gpu, nic_port=port, row=gpu // n, col=gpu % n,
                                   server=gpu // gpus_per_server, rail=gpu % gpus_per_server)
            fabric.add_link(host, layers[port][switch_index(gpu, port, n)], gbps)
    for layer in range(k - 1):
        for gpu in range(gpus):
            fabric.add_link(layers[layer][switch_index(gpu, layer, n)],
                            layers[layer + 1][switch_index(gpu, layer + 1, n)], gbps)
    return fabric


def counts(n: int = 4, k: int = 2, gbps: float = 200.0, gpus_per_server: int = 8) -> FabricCounts:
    _check(n, k)
    gpus = n ** k
    cables, modules = cable_modules({gbps: k * gpus + (k - 1) * gpus}, {})
    roles = [f"zcube-{layer_name(layer).lower()}" for layer in range(k)]
    # The cut at the top digit: for k = 2 non-blocking (a GPU's 2 ports both
    # leave its half at line rate); for k > 2 only n^k links cross it (the top
    # layer's GPU links and the links into it), less than the k ports per GPU.
    # Odd n with k > 2 splits a top-digit block; that cut is not derived here.
    odd = n % 2 and k > 2
    crossing = None if odd else gpus // 2 * min(k, 2) * gbps
    return FabricCounts(
        fabric="zcube", gpus=gpus, nic_ports=k * gpus,
        switches={role: n ** (k - 1) for role in roles},
        switch_ports={role: (layer_radix(n, k, layer), gbps) for layer, role in enumerate(roles)},
        cables=cables, optical_modules=modules, diameter=k,
        bisection_gbps=crossing,
        notes=["bisection: not derived for odd n with k > 2 (measure the built graph)"]
        if odd else [])


def cell(gpus: int) -> dict:
    """Switches and ports per switch of a ZCube(n, 2) cell of `gpus` GPUs (cell table)."""
    n = int(round(gpus ** 0.5))
    if n * n != gpus:
        raise FabricError(f"zcube: a cell holds a square number of GPUs (ZCube(n, 2), n^2), "
                          f"got {gpus}; for k > 2 layers give n and k, e.g. zcube,n=32,k=3 "
                          f"(32,768 GPUs)")
    return {"n": n, "switches": 2 * n, "ports_per_switch": 2 * n, "gpus_per_switch": n}


def bisection_half(fabric: Fabric) -> List[int]:
    """The first half of the GPUs by id (top digit < n/2 for even n): for k = 2
    the first n/2 rows (A switches), a cut through the bipartite mesh."""
    n, k = fabric.params["n"], fabric.params.get("k", 2)
    return list(range(n ** k // 2))


# ------------------------------------------------------------------ cell table (section 5)
TEXT_CELLS = {1024: {"p_nodes": 80, "d_nodes": 48, "roft_gpus": 1178},
              4096: {"p_nodes": 320, "d_nodes": 192, "roft_gpus": 4710},
              16384: {"p_nodes": 1280, "d_nodes": 768, "roft_gpus": 18842}}
TEXT_PD_RATIO = 1.5          # "With 8-GPU nodes, starting P:D ~ 3:2"
PD_BLOCKS = 8                # the P/D split is in eighths of the cell (see cell_table)


def cell_row(gpus: int, pd_ratio: float = TEXT_PD_RATIO, gpus_per_node: int = 8,
             roft_gain: float = ROFT_THROUGHPUT_GAIN, blocks: int = PD_BLOCKS) -> dict:
    """One row of the section-5 cell table, from formulas.

    Nodes = gpus / gpus_per_node; balanced k (GPUs per switch) = sqrt(gpus);
    logical ports per switch k + gpus/k; switches 2 * gpus / k (`cell`).
    P/D nodes: the share P / (P + D) of ``pd_ratio`` rounded to whole
    ``blocks``-ths of the cell (the text gives no rounding rule; 3:2 in
    eighths is 5/8 P, 3/8 D, which is every row of its table: 80P / 48D,
    320P / 192D, 1280P / 768D).  Equivalent ROFT GPUs = gpus * roft_gain
    (the text: "calculated at +15%"; conversely N_roft / 1.15 ZCube GPUs).
    """
    shape = cell(gpus)
    if gpus % gpus_per_node:
        raise FabricError(f"zcube: a cell of {gpus} GPUs is not whole nodes of "
                          f"gpus_per_node={gpus_per_node}")
    nodes = gpus // gpus_per_node
    if blocks < 1 or nodes % blocks:
        raise FabricError(f"zcube: blocks={blocks} must divide the cell's {nodes} nodes")
    p_blocks = min(blocks - 1, max(1, round(pd_ratio / (1 + pd_ratio) * blocks)))
    p_nodes = p_blocks * nodes // blocks
    row = {"gpus": gpus, "nodes": nodes, "balanced_k": shape["gpus_per_switch"],
           "ports_per_switch": shape["ports_per_switch"], "switches": shape["switches"],
           "p_nodes": p_nodes, "d_nodes": nodes - p_nodes, "roft_gpus": gpus * roft_gain,
           "zcube_gpus_for_roft": gpus / roft_gain}
    text = TEXT_CELLS.get(gpus)
    if text:
        row.update({f"text_{key}": value for key, value in text.items()})
    return row


def cell_table(cells=tuple(TEXT_CELLS), pd_ratio: float = TEXT_PD_RATIO,
               gpus_per_node: int = 8, roft_gain: float = ROFT_THROUGHPUT_GAIN,
               blocks: int = PD_BLOCKS) -> List[dict]:
    """`cell_row` per cell size: the text's 1,024 / 4,096 / 16,384-GPU table by default."""
    return [cell_row(gpus, pd_ratio, gpus_per_node, roft_gain, blocks) for gpus in cells]


# ------------------------------------------------------------------ dual paths
def _layers(fabric: Fabric) -> int:
    return int(fabric.params.get("k", 2))


class _Index:
    """What the path helpers look up, built once per fabric graph: each GPU's hosts
    by NIC port and each switch by (layer, index).  Scanning every host and node
    on each `paths` call made planning at 1,024 GPUs take minutes."""

    def __init__(self, fabric: Fabric):
        self.size = fabric.graph.number_of_nodes()
        self.ports: Dict[object, Dict[object, str]] = {}
        for host in fabric.hosts:
            data = fabric.graph.nodes[host]
            self.ports.setdefault(data["gpu"], {})[data["nic_port"]] = host
        self.switch = {(data["layer"], data["index"]): node for node, data in
                       fabric.graph.nodes(data=True)
                       if str(data.get("role", "")).startswith("zcube-")}


_INDEX: "weakref.WeakKeyDictionary[object, _Index]" = weakref.WeakKeyDictionary()


def _index(fabric: Fabric) -> _Index:
    """The fabric's `_Index`, cached by its graph (rebuilt if nodes were added or
    removed since)."""
    index = _INDEX.get(fabric.graph)
    if index is None or index.size != fabric.graph.number_of_nodes():
        index = _INDEX[fabric.graph] = _Index(fabric)
    return index


def _gpu_hosts(fabric: Fabric, gpu: int) -> Tuple[str, ...]:
    """The GPU's hosts, by NIC port (one per layer)."""
    ports = _index(fabric).ports.get(gpu, {})
    k = _layers(fabric)
    if len(ports) != k:
        n = fabric.params["n"]
        raise FabricError(f"zcube: no GPU {gpu} in ZCube({n}, {k}) (GPUs 0..{n ** k - 1})")
    return tuple(ports[port] for port in range(k))


def _digits(gpu: int, n: int, k: int) -> List[int]:
    return [gpu // n ** layer % n for layer in range(k)]


def paths(fabric: Fabric, src_gpu: int, dst_gpu: int) -> List[List[str]]:
    """The two node paths P -> D: [climbing from P's layer-0 port, descending
    from P's top-layer port]; for k = 2 [via A_p then B_d, via B_p then A_d].

    The climbing path changes one digit per layer (0, 1, ...) and stops at the
    first layer whose switch holds D (the highest digit where P and D differ),
    leaving on D's port of that layer; the descending path mirrors it.  When P
    and D share A_i (or B_j), that path is the one-switch path through it.
    The two share no switch unless P and D differ in one middle-layer digit
    only (k > 2), where both meet at the switch they share.
    """
    n, k = fabric.params["n"], _layers(fabric)
    src, dst = _gpu_hosts(fabric, src_gpu), _gpu_hosts(fabric, dst_gpu)
    a, b = _digits(src_gpu, n, k), _digits(dst_gpu, n, k)
    differ = [layer for layer in range(k) if a[layer] != b[layer]]
    # The same GPU (as it always was): each path is one port's switch and back.
    lowest, highest = (differ[0], differ[-1]) if differ else (k - 1, 0)

    switch = _index(fabric).switch

    def walk(order: List[int]) -> List[str]:
        digits, nodes = list(a), []
        for layer in order:
            gpu = sum(d * n ** i for i, d in enumerate(digits))
            nodes.append(switch[layer_name(layer), switch_index(gpu, layer, n)])
            digits[layer] = b[layer]
        return nodes

    up = walk(list(range(0, highest + 1)))
    down = walk(list(range(k - 1, lowest - 1, -1)))
    return [[src[0]] + up + [dst[highest]], [src[k - 1]] + down + [dst[lowest]]]


def select_path(fabric: Fabric, src_gpu: int, dst_gpu: int, tp_rank: Optional[int] = None,
                request_id: Optional[str] = None) -> List[str]:
    """Path for one flow: even TP ranks take path 1 and odd ranks path 2 (the
    text's rank 0,2,4,6 / 1,3,5,7 split), or a stable hash of the request id.
    The flow's endpoints are the first and last hosts of the returned path."""
    if (tp_rank is None) == (request_id is None):
        raise FabricError("zcube.select_path: give exactly one of tp_rank or request_id")
    index = tp_rank % 2 if tp_rank is not None else request_path_index(request_id)
    return paths(fabric, src_gpu, dst_gpu)[index]


def request_path_index(request_id: object) -> int:
    """Which of the two paths (0 or 1) every flow of request ``request_id`` takes:
    a stable hash of the id (`select_path` with ``request_id``)."""
    return zlib.crc32(str(request_id).encode()) % 2


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """The ZCube(n, 2) cell of ``gpus`` GPUs: its switch radix follows from the
    GPU count (2*sqrt(gpus) ports), so ``radix`` does not apply.  Always two
    layers, the deployed construction of the text's cell table: a rule by
    powers would make 2,048 GPUs ZCube(2, 11); give ``k`` in a spec instead."""
    return {"n": cell(gpus)["n"], "gpus_per_server": gpus_per_server}
