"""One iteration of disaggregated, one-step asynchronous RL, as communication.

RFabric text (000), sections 2-3: Train and Gen run on separate GPU
clusters; Gen of batch i+1 overlaps Train of batch i (Figure 1(c)); the
weights move Train -> Gen at the iteration boundary.  `build_iteration`
turns an `RLConfig` into the communication of each Table 1 type (`TABLE1`)
as specs of `traffic.comms` (bytes, participants as GPU ranks, primitive).

Symbols: P parameters (P_d dense, P_e routed experts), L layers, h hidden
size, h_kv = KV heads x head dim, beta bytes per element (``act_bytes``),
beta_g bytes per gradient element, beta_w bytes per weight; b micro-batch
(sequences), s = prompt + response tokens, B = prompts x responses per
prompt (GRPO group) sequences per iteration; Train m = ceil(B / (DP x b))
micro-batches, L_s = ceil(L / PP) layers per stage; Gen q = ceil(B / R)
sequences per replica (R replicas), r response tokens (decode steps).

Train (Megatron):
  * DP all-reduce of gradients, once per optimizer step over the DP x CP
    group: S = P_d x beta_g / (TP x PP), so each rank sends
    2(N-1)/N x P x beta_g / (TP x PP) (ring).  MoE: the experts' gradients
    reduce over the expert-DP group (DP/EP ranks), S = P_e x beta_g /
    (TP x PP x EP).
  * TP all-reduce of activations, S = b x s/CP x h x beta, 2 per layer
    forward and 2 backward: ops = 4 x L_s x m.  In the HBD unless TP spans
    servers.
  * PP send/recv of activations b x s/CP x h x beta per micro-batch and stage
    boundary, forward and (gradients) backward, split over the TP lanes
    (Megatron scatter/gather): S = b x s/CP x h x beta / TP per lane, ops = m.
  * CP (``cp_comm``), Table 1's "P2P or All-to-All":
    ``a2a``, Ulysses all-to-all: Q, K, V in and O out, S = b x s/CP x
    (2h + 2h_kv) x beta / TP per layer, forward and backward: ops = 2 x L_s x m
    (Ulysses splits heads: h/TP heads must divide by CP).
    ``p2p``, ring attention: each rank passes its KV block, S = b x s/CP x
    2h_kv x beta / TP, to the next CP rank, CP-1 steps per layer forward and
    2(CP-1) backward (KV and its gradient): ops = 3(CP-1) x L_s x m, a third
    of them forward.  No head constraint.
  * EP all-to-all: dispatch and combine, forward and backward, of the
    routed copies of the rank's tokens: S = b x s/(CP x TP) x k x h x beta
    (top-k, sequence-parallel tokens), ops = 4 x L_s x m.

Gen (vLLM, continuous batching of q sequences per replica):
  * TP all-reduce, 2 per layer per forward: prefill S = q x prompt x h x
    beta, ops = 2L; decode S = q x h x beta, ops = 2L x r.
  * EP all-to-all, dispatch + combine per MoE layer: S = q x k x h x beta /
    TP per decode step (ops = 2L x r) and q x prompt x k x h x beta / TP at
    prefill (ops = 2L).  With A/F the M2N below is the decode's dispatch
    and combine (the experts live on the FFN replicas), so there is no
    decode all-to-all; prefill keeps its all-to-all among the prefill
    replicas of P/D (whole layers), or, without P/D, dispatches through the
    M2N as well.
  * P/D KV bursts (``pd_prefill``:``pd_decode`` replicas per block): a
    request's KV cache, prompt x 2 x L x h_kv x beta, from TP rank i of its
    prefill replica to TP rank i of its decode replica (1/TP each); one
    burst per request.  With A/F as well, A/F splits the decode replicas and
    the KV goes to the attention ones (`_gen_roles`).
  * A/F M2N (``af_attention``:``af_ffn`` replicas per block): per layer and
    decode step, every attention lane sends its tokens' hidden states
    q_a x h x beta / (TP x F) to the same lane of each FFN replica, which
    sends the result back (dispatch + combine): ops = L x r; without P/D the
    prefill's tokens take the same way, q_a x prompt x h x beta / (TP x F),
    ops = L.

Between the stages:
  * Weight sync T2G, two stages (section 3, Figure 2): the Train DP group
    sends the weights (P x beta_w) once to the DP-0 replica of each Gen PoD
    -- Train rank (tp, pp) sends the overlap of its shard with Gen rank tp's
    shard, split over the DP x CP ranks holding it -- then each DP-0 rank
    broadcasts its shard P x beta_w / TP_gen to the same TP rank of the other
    replicas of its PoD over a ``sync_fanout``-ary tree.  Shards are taken
    as uniform slices (layers by PP, tensors by TP), experts included.
  * Response stream G2T: each Gen replica's TP rank 0 sends every finished
    sequence, (prompt + response) x ``response_token_bytes`` (token ids and
    log-probs), to stage 0 of Train DP replica (replica mod DP); one message
    per sequence.

One-step asynchronous execution and compute times (`ComputeTimes`, real
seconds) are laid out as phases by `traffic.phases`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from traffic.comms import (AllReduce, AllToAll, Bipartite, Comm, Pipeline, RingP2P, Transfer,
                           Transfers, WeightSync)
from traffic.ranks import Parallelism, RankError, RankMap, gen_grid, replica_rank, train_grid


CP_COMMS = ("a2a", "p2p")        # Train CP: Ulysses all-to-all, ring attention


class WorkloadError(ValueError):
    """A workload config is inconsistent; the message names the field."""


@dataclass(frozen=True)
class CommType:
    """One row of Table 1 of the RFabric text."""

    stage: str            # train, inter, gen
    label: str
    volume: str
    frequency: str
    primitive: str
    domain: str
    window: str           # reconfiguration window: Small, Medium, Large


# Table 1: communication profiles of disaggregated RL, keyed by phase kind.
TABLE1: Dict[str, CommType] = {
    "train-dp": CommType("train", "DP", "High", "Low", "AllReduce", "ToR-Agg-Core", "Large"),
    "train-tp": CommType("train", "TP", "Medium", "High", "AllReduce", "HBD", "Medium"),
    "train-pp": CommType("train", "PP", "Low", "Low", "P2P", "ToR-Agg", "Large"),
    "train-cp": CommType("train", "CP", "Medium", "High", "P2P or All-to-All", "ToR-Agg",
                         "Medium"),
    "train-ep": CommType("train", "EP", "Medium", "High", "All-to-All", "ToR-Agg", "Medium"),
    "weight-sync": CommType("inter", "Weight-Sync", "High", "Low", "T2G", "ToR-Agg-Core",
                            "Large"),
    "response": CommType("inter", "Response-Stream", "Low", "Medium", "G2T", "ToR-Agg-Core",
                         "Large"),
    "gen-tp": CommType("gen", "TP", "Medium", "High", "AllReduce", "HBD", "Small"),
    "gen-ep": CommType("gen", "EP", "Medium", "High", "All-to-All", "ToR-Agg", "Small"),
    "gen-pd": CommType("gen", "P/D", "Medium", "Low", "M2N (Bipartite)", "ToR-Agg", "Large"),
    "gen-af": CommType("gen", "A/F", "Low", "High", "M2N (Bipartite)", "ToR-Agg", "Small"),
    # Not rows of Table 1: OrchestrRL's dynamic generation (`traffic.generation`).
    # A parallelism configuration holds for a stretch of the step, so its
    # circuits are set once at the switch (Large); a rebalance comes when a
    # straggler shows and is over in one burst, so it rides the circuits in
    # place (Small).
    "gen-config": CommType("gen", "Gen under one TP configuration (switch, decode TP)",
                           "Medium", "High", "M2N + AllReduce", "ToR-Agg", "Large"),
    "gen-migrate": CommType("gen", "KV migration off stragglers", "Medium", "Low", "P2P",
                            "ToR-Agg", "Small"),
}
KINDS = tuple(TABLE1)


@dataclass(frozen=True)
class Model:
    name: str
    params: float                 # all parameters
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    experts: int = 0              # routed experts per layer (0: dense)
    top_k: int = 0
    expert_params: float = 0.0    # parameters of the routed experts, all layers

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def dense_params(self) -> float:
        return self.params - self.expert_params

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, bytes_per_elem: float) -> float:
        """K and V of every layer: 2 x L x h_kv x beta."""
        return 2 * self.layers * self.kv_dim * bytes_per_elem


# Hugging Face configs: Qwen2.5-14B (hidden 5120, 48 layers, 40 heads, 8 KV heads)
# and Qwen2-57B-A14B (hidden 3584, 28 layers, 28 heads, 4 KV heads, 64 experts of
# intermediate size 2560, top-8, plus a shared expert counted as dense).
QWEN25_14B = Model("Qwen2.5-14B", 14.7e9, 48, 5120, 40, 8)
QWEN2_57B_A14B = Model("Qwen2-57B-A14B", 57.4e9, 28, 3584, 28, 4, experts=64, top_k=8,
                       expert_params=64 * 28 * 3 * 3584 * 2560)


@dataclass(frozen=True)
class ComputeTimes:
    """Real seconds of compute per iteration (dilated by tdf when replayed)."""

    train_s: float = 600.0        # Train forward + backward of the batch (micro-batches)
    optimizer_s: float = 10.0     # after the DP all-reduce, before the weights can go
    gen_s: float = 1140.0         # Gen of the next batch, overlapping Train

    def check(self) -> None:
        for name in ("train_s", "optimizer_s", "gen_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or math.isinf(value):
                raise WorkloadError(f"compute.{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class RLConfig:
    """An RL job: model, the two clusters' parallelism, batch and lengths."""

    model: Model
    train: Parallelism
    gen: Parallelism
    train_gpus: int = 0           # 0: train.world; else checked (dp=0 derives DP)
    gen_gpus: int = 0
    gpus_per_server: int = 8      # HBD size
    gen_pods: int = 1             # Gen replicas are split over this many PoDs
    batch_prompts: int = 128
    responses_per_prompt: int = 8  # GRPO group size
    prompt_len: int = 1024
    response_len: int = 4096
    micro_batch: int = 1
    act_bytes: float = 2.0        # activations, KV (bf16)
    grad_bytes: float = 2.0       # gradients in the DP all-reduce
    bytes_per_param: float = 2.0  # weights sent in the weight sync
    optimizer_steps: int = 1
    sync_fanout: int = 2
    response_token_bytes: float = 8.0   # int32 token id + fp32 log-prob
    pd_prefill: int = 0
    pd_decode: int = 0
    af_attention: int = 0
    af_ffn: int = 0
    cp_comm: str = "a2a"          # Train CP: "a2a" (Ulysses) or "p2p" (ring attention)
    compute: ComputeTimes = field(default_factory=ComputeTimes)

    def __post_init__(self):
        for name, gpus in (("train", self.train_gpus), ("gen", self.gen_gpus)):
            par = getattr(self, name)
            if par.dp == 0 and gpus:
                per_replica = par.tp * par.pp * par.cp
                if gpus % per_replica:
                    raise WorkloadError(f"{name}_gpus={gpus} is not a multiple of "
                                        f"tp x pp x cp = {per_replica}")
                object.__setattr__(self, name, dataclasses.replace(par, dp=gpus // per_replica))
        self.validate()

    @property
    def seqs(self) -> int:
        return self.batch_prompts * self.responses_per_prompt

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def world(self) -> int:
        return self.train.world + self.gen.world

    def validate(self) -> None:
        try:
            self.train.check("train")
            self.gen.check("gen")
            gen_grid(self.gen)
        except RankError as exc:
            raise WorkloadError(str(exc)) from None
        for name in ("train", "gen"):
            world, given = getattr(self, name).world, getattr(self, f"{name}_gpus")
            if given and given != world:
                raise WorkloadError(f"{name}_gpus={given} but {name} parallelism gives "
                                    f"tp x pp x dp x cp = {world}")
            if world % self.gpus_per_server:
                raise WorkloadError(f"{name}: {world} GPUs is not a whole number of servers "
                                    f"of gpus_per_server={self.gpus_per_server}")
        positive = ("gpus_per_server", "gen_pods", "batch_prompts", "responses_per_prompt",
                    "prompt_len", "response_len", "micro_batch", "optimizer_steps",
                    "sync_fanout")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkloadError(f"{name} must be an integer >= 1, got {value!r}")
        if self.gen_pods > self.gen.dp:
            raise WorkloadError(f"gen_pods={self.gen_pods} exceeds the {self.gen.dp} Gen replicas")
        if self.cp_comm not in CP_COMMS:
            raise WorkloadError(f"cp_comm must be one of {', '.join(CP_COMMS)}, "
                                f"got {self.cp_comm!r}")
        if self.model.layers % self.train.pp:
            raise WorkloadError(f"train.pp={self.train.pp} must divide the model's "
                                f"{self.model.layers} layers")
        for a, b in (("pd_prefill", "pd_decode"), ("af_attention", "af_ffn")):
            x, y = getattr(self, a), getattr(self, b)
            if (x > 0) != (y > 0) or x < 0 or y < 0:
                raise WorkloadError(f"{a} and {b} must both be 0 (off) or both >= 1, "
                                    f"got {x} and {y}")
        if self.pd_prefill and self.gen.dp % (self.pd_prefill + self.pd_decode):
            raise WorkloadError(f"pd_prefill + pd_decode = {self.pd_prefill + self.pd_decode} "
                                f"must divide gen.dp={self.gen.dp}")
        if self.af_attention:
            block = self.af_attention + self.af_ffn
            pool = len(_gen_roles(self).get("decode", range(self.gen.dp)))
            if pool % block:
                where = (f"the {pool} decode replicas (A/F splits the decode side of P/D)"
                         if self.pd_prefill else f"gen.dp={self.gen.dp}")
                raise WorkloadError(f"af_attention + af_ffn = {block} must divide {where}")
        self.compute.check()

    def rank_map(self, hosts, gen_hosts=None) -> RankMap:
        """Place this job's ranks on fabric hosts (`traffic.ranks.RankMap.build`)."""
        return RankMap.build(self.train.world, self.gen.world, self.gpus_per_server, hosts,
                             gen_hosts)


@dataclass
class Iteration:
    config: RLConfig
    comms: List[Comm]

    def kinds(self) -> List[str]:
        return [k for k in KINDS if any(c.kind == k for c in self.comms)]

    def of_kind(self, kind: str) -> List[Comm]:
        return [c for c in self.comms if c.kind == kind]

    def network_bytes(self, rank_map: RankMap, kind: Optional[str] = None) -> float:
        return sum(c.network_bytes(rank_map) for c in self.comms
                   if kind is None or c.kind == kind)


# ---------------------------------------------------------------- formulas
def _train(cfg: RLConfig) -> List[Comm]:
    m, par = cfg.model, cfg.train
    grid = train_grid(par)
    beta, tokens = cfg.act_bytes, cfg.micro_batch * cfg.seq_len / par.cp
    micro = math.ceil(cfg.seqs / (par.dp * cfg.micro_batch))
    stage_layers = m.layers // par.pp
    comms: List[Comm] = []
    if par.tp > 1:
        comms.append(AllReduce(
            kind="train-tp", groups=tuple(grid.groups("tp")), bytes=tokens * m.hidden * beta,
            ops=4 * stage_layers * micro,
            formula="S = b x s/CP x h x beta; 2 per layer fwd + 2 bwd: ops = 4 x L/PP x m"))
    if par.pp > 1:
        comms.append(Pipeline(
            kind="train-pp", chains=tuple(grid.groups("pp")),
            bytes=tokens * m.hidden * beta / par.tp, ops=micro,
            formula="S = b x s/CP x h x beta / TP per lane; fwd + bwd per micro-batch: ops = m"))
    if par.cp > 1 and cfg.cp_comm == "p2p":
        comms.append(RingP2P(
            kind="train-cp", groups=tuple(grid.groups("cp")),
            bytes=tokens * 2 * m.kv_dim * beta / par.tp,
            ops=3 * (par.cp - 1) * stage_layers * micro, forward_share=1 / 3,
            formula="ring attention: S = b x s/CP x 2h_kv x beta / TP to the next CP rank; "
                    "CP-1 steps fwd + 2(CP-1) bwd: ops = 3(CP-1) x L/PP x m"))
    elif par.cp > 1:
        comms.append(AllToAll(
            kind="train-cp", groups=tuple(grid.groups("cp")),
            bytes=tokens * (2 * m.hidden + 2 * m.kv_dim) * beta / par.tp,
            ops=2 * stage_layers * micro,
            formula="Ulysses: S = b x s/CP x (2h + 2h_kv) x beta / TP; ops = 2 x L/PP x m"))
    if m.moe and par.ep > 1:
        comms.append(AllToAll(
            kind="train-ep", groups=tuple(grid.groups("ep")),
            bytes=tokens / par.tp * m.top_k * m.hidden * beta, ops=4 * stage_layers * micro,
            formula="S = b x s/(CP x TP) x k x h x beta; dispatch + combine, fwd + bwd: "
                    "ops = 4 x L/PP x m"))
    dense = m.dense_params if m.moe else m.params
    dp_groups = tuple(g for g in grid.groups("cp", "ep", "edp") if len(g) > 1)
    if dp_groups:
        comms.append(AllReduce(
            kind="train-dp", groups=dp_groups, bytes=dense * cfg.grad_bytes / (par.tp * par.pp),
            ops=cfg.optimizer_steps,
            formula="S = P_dense x beta_g / (TP x PP); sent per rank 2(N-1)/N x S"))
    expert_groups = tuple(g for g in grid.groups("cp", "edp") if len(g) > 1)
    if m.moe and expert_groups:
        comms.append(AllReduce(
            kind="train-dp", groups=expert_groups,
            bytes=m.expert_params * cfg.grad_bytes / (par.tp * par.pp * par.ep),
            ops=cfg.optimizer_steps,
            formula="experts: S = P_e x beta_g / (TP x PP x EP) over the expert-DP group"))
    return comms


def _replica_ranks(grid, replicas, lane: Optional[int] = None) -> Tuple[int, ...]:
    tp = dict(grid.dims)["tp"]
    lanes = range(tp) if lane is None else [lane]
    return tuple(replica_rank(grid, r, t) for r in replicas for t in lanes)


def _gen_roles(cfg: RLConfig) -> Dict[str, List[int]]:
    """Replica indices by role: prefill/decode (P/D), attention/ffn (A/F), or all.

    P/D blocks of ``pd_prefill + pd_decode`` replicas, the prefill ones first.
    A/F splits the replicas that decode -- all of them, or the decode side of
    P/D (prefill runs whole layers, as in MegaScale-Infer's A/F for decode) --
    in blocks of ``af_attention + af_ffn``, attention first.  With both, a
    request's KV goes from its prefill replica to an attention replica, which
    keeps it, and the responses leave from the attention replicas.
    """
    replicas = list(range(cfg.gen.dp))
    roles: Dict[str, List[int]] = {"all": replicas}
    if cfg.pd_prefill:
        block = cfg.pd_prefill + cfg.pd_decode
        roles["prefill"] = [r for r in replicas if r % block < cfg.pd_prefill]
        roles["decode"] = [r for r in replicas if r % block >= cfg.pd_prefill]
    if cfg.af_attention:
        block = cfg.af_attention + cfg.af_ffn
        pool = roles.get("decode", replicas)
        roles["attention"] = [r for i, r in enumerate(pool) if i % block < cfg.af_attention]
        roles["ffn"] = [r for i, r in enumerate(pool) if i % block >= cfg.af_attention]
    return roles


def _gen(cfg: RLConfig) -> List[Comm]:
    m, par = cfg.model, cfg.gen
    grid = gen_grid(par, offset=cfg.train.world)
    beta, steps = cfg.act_bytes, cfg.response_len
    roles = _gen_roles(cfg)
    prefill = roles.get("prefill", roles.get("attention", roles["all"]))
    decode = roles.get("attention", roles.get("decode", roles["all"]))     # hold the KV
    q_pre, q_dec = math.ceil(cfg.seqs / len(prefill)), math.ceil(cfg.seqs / len(decode))
    comms: List[Comm] = []
    if par.tp > 1:
        tp_groups = {r: tuple(_replica_ranks(grid, [r])) for r in roles["all"]}
        comms.append(AllReduce(
            kind="gen-tp", groups=tuple(tp_groups[r] for r in prefill),
            bytes=q_pre * cfg.prompt_len * m.hidden * beta, ops=2 * m.layers,
            formula="prefill: S = q x prompt x h x beta; ops = 2L"))
        comms.append(AllReduce(
            kind="gen-tp", groups=tuple(tp_groups[r] for r in decode),
            bytes=q_dec * m.hidden * beta, ops=2 * m.layers * steps,
            formula="decode: S = q x h x beta; ops = 2L x r"))
    if m.moe and par.ep > 1 and not cfg.af_attention:
        ep_groups = tuple(grid.groups("ep"))
        comms.append(AllToAll(
            kind="gen-ep", groups=ep_groups,
            bytes=q_pre * cfg.prompt_len * m.top_k * m.hidden * beta / par.tp, ops=2 * m.layers,
            formula="prefill: S = q x prompt x k x h x beta / TP; ops = 2L"))
        comms.append(AllToAll(
            kind="gen-ep", groups=ep_groups,
            bytes=q_dec * m.top_k * m.hidden * beta / par.tp, ops=2 * m.layers * steps,
            formula="decode: S = q x k x h x beta / TP; dispatch + combine: ops = 2L x r"))
    elif m.moe and par.ep > 1 and cfg.pd_prefill:
        # A/F's M2N carries the decode's expert traffic; the prefill replicas run
        # whole layers, their experts split over EP groups of prefill replicas.
        chunks = [prefill[i:i + par.ep] for i in range(0, len(prefill), par.ep)]
        groups = tuple(_replica_ranks(grid, chunk, lane) for chunk in chunks if len(chunk) > 1
                       for lane in range(par.tp))
        if groups:
            comms.append(AllToAll(
                kind="gen-ep", groups=groups,
                bytes=q_pre * cfg.prompt_len * m.top_k * m.hidden * beta / par.tp,
                ops=2 * m.layers,
                formula="prefill, among prefill replicas (A/F carries the decode): "
                        "S = q x prompt x k x h x beta / TP; ops = 2L"))
    if cfg.pd_prefill:
        block = cfg.pd_prefill + cfg.pd_decode
        items = []
        for d in decode:
            p = (d // block) * block + (d % block - cfg.pd_prefill) % cfg.pd_prefill
            for lane in range(par.tp):
                items.append((replica_rank(grid, p, lane), replica_rank(grid, d, lane),
                              cfg.prompt_len * m.kv_bytes_per_token(beta) / par.tp))
        comms.append(Transfers(
            kind="gen-pd", items=tuple(items), ops=q_dec,
            formula="KV per request = prompt x 2L x h_kv x beta, 1/TP per lane; "
                    "one burst per request: ops = q"))
    if cfg.af_attention:
        block = cfg.af_attention + cfg.af_ffn
        pool = roles.get("decode", roles["all"])
        pairs = []
        for start in range(0, len(pool), block):
            attn = pool[start:start + cfg.af_attention]
            ffn = pool[start + cfg.af_attention:start + block]
            for lane in range(par.tp):
                pairs.append((_replica_ranks(grid, attn, lane), _replica_ranks(grid, ffn, lane)))
        comms.append(Bipartite(
            kind="gen-af", pairs=tuple(pairs), combine=True,
            bytes=q_dec * m.hidden * beta / (par.tp * cfg.af_ffn), ops=m.layers * steps,
            formula="S = q_a x h x beta / (TP x F) per pair; dispatch + combine: ops = L x r"))
        if not cfg.pd_prefill:
            comms.append(Bipartite(
                kind="gen-af", pairs=tuple(pairs), combine=True,
                bytes=q_dec * cfg.prompt_len * m.hidden * beta / (par.tp * cfg.af_ffn),
                ops=m.layers,
                formula="prefill through the M2N: S = q_a x prompt x h x beta / (TP x F) "
                        "per pair; ops = L"))
    return comms


def gen_pod_replicas(cfg: RLConfig) -> List[List[int]]:
    """Gen replicas of each Gen PoD: contiguous, sizes differing by at most one."""
    n, pods = cfg.gen.dp, cfg.gen_pods
    bounds = [i * n // pods for i in range(pods + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(pods)]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _weight_sync(cfg: RLConfig) -> WeightSync:
    tpar, gpar = cfg.train, cfg.gen
    tgrid, ggrid = train_grid(tpar), gen_grid(gpar, offset=tpar.world)
    weights = cfg.model.params * cfg.bytes_per_param
    holders = tpar.dp * tpar.cp            # Train ranks holding each (tp, pp) shard
    stage1: List[Transfer] = []
    trees = []
    for replicas in gen_pod_replicas(cfg):
        dp0 = replicas[0]
        for lane in range(gpar.tp):
            dst = replica_rank(ggrid, dp0, lane)
            for rank in tgrid.ranks:
                c = tgrid.coords(rank)
                share = _overlap(c["tp"] / tpar.tp, (c["tp"] + 1) / tpar.tp,
                                 lane / gpar.tp, (lane + 1) / gpar.tp) / tpar.pp
                if share > 0:
                    stage1.append((rank, dst, weights * share / holders))
            members = tuple(replica_rank(ggrid, r, lane) for r in replicas[1:])
            if members:
                trees.append((dst, members, weights / gpar.tp))
    return WeightSync(kind="weight-sync", stage1=tuple(stage1), trees=tuple(trees),
                      fanout=cfg.sync_fanout, ops=1,
                      formula="stage 1: P x beta_w once per Gen PoD, Train (tp, pp) shard "
                              "overlaps split over DP x CP; stage 2: P x beta_w / TP_gen per "
                              "tree edge inside the PoD")


def _response(cfg: RLConfig) -> Transfers:
    tgrid, ggrid = train_grid(cfg.train), gen_grid(cfg.gen, offset=cfg.train.world)
    roles = _gen_roles(cfg)
    out = roles.get("attention", roles.get("decode", roles["all"]))
    items = []
    for r in out:
        d = r % cfg.train.dp
        dst = tgrid.rank(tp=0, cp=0, ep=d % cfg.train.ep, edp=d // cfg.train.ep, pp=0)
        items.append((replica_rank(ggrid, r, 0), dst, cfg.seq_len * cfg.response_token_bytes))
    return Transfers(kind="response", items=tuple(items), ops=math.ceil(cfg.seqs / len(out)),
                     formula="(prompt + response) x token bytes per sequence; ops = q")


def build_iteration(cfg: RLConfig) -> Iteration:
    """Every communication of one RL iteration (Train i, Gen i+1, weight sync)."""
    return Iteration(cfg, _train(cfg) + _gen(cfg) + [_response(cfg), _weight_sync(cfg)])


# ---------------------------------------------------------------- presets
def qwen25_14b(**overrides) -> RLConfig:
    """RFabric section 3, the measured setup: Qwen-2.5 14B on 64 H800 GPUs,
    24 Train (Megatron PP=3, TP=8, so DP=1) + 40 Gen (vLLM TP=8, DP=5), GRPO.

    The text gives no batch, lengths or timings; the defaults here (128
    prompts x 8 responses, 1K prompt + 4K response tokens, an iteration of
    about 20 min -- the weight-sync inter-arrival of section 3) are ours.
    With DP=1 Train has no DP all-reduce.
    """
    base = dict(model=QWEN25_14B, train=Parallelism(tp=8, pp=3, dp=1),
                gen=Parallelism(tp=8, dp=5), train_gpus=24, gen_gpus=40, gpus_per_server=8)
    return RLConfig(**_merge(base, overrides))


def qwen2_moe(gpus: int = 2048, **overrides) -> RLConfig:
    """Qwen2-57B-A14B (MoE) for the section 5 comparison, half the GPUs for
    Train and half for Gen (as `topologies.rfabric.params_at` splits PoDs).

    The text gives no parallelism for it; ours: Train TP=4, PP=2, EP=4, DP
    from the GPU count; Gen TP=4, EP=4, DP from the GPU count (2048 GPUs:
    Train DP=128, Gen DP=256).
    """
    if gpus % 2:
        raise WorkloadError(f"qwen2_moe: gpus={gpus} must be even (half Train, half Gen)")
    half = gpus // 2
    base = dict(model=QWEN2_57B_A14B, train=Parallelism(tp=4, pp=2, dp=0, ep=4),
                gen=Parallelism(tp=4, dp=0, ep=4), train_gpus=half, gen_gpus=half,
                gpus_per_server=8)
    return RLConfig(**_merge(base, overrides))


PRESETS = {"qwen2.5-14b": qwen25_14b, "qwen2-57b-a14b": qwen2_moe}


def preset(name: str, **overrides) -> RLConfig:
    if name not in PRESETS:
        raise WorkloadError(f"unknown workload preset {name!r}; allowed: {sorted(PRESETS)}")
    return PRESETS[name](**overrides)


def _merge(base: dict, overrides: dict) -> dict:
    allowed = {f.name for f in dataclasses.fields(RLConfig)}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise WorkloadError(f"unknown workload keys {unknown}; allowed: {sorted(allowed)}")
    merged = dict(base, **overrides)
    if "train" in overrides and "train_gpus" not in overrides:
        merged["train_gpus"] = 0
    if "gen" in overrides and "gen_gpus" not in overrides:
        merged["gen_gpus"] = 0
    return merged
