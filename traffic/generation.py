"""One generation step of OrchestrRL: TP switching and request rebalancing, as compute and moves.

OrchestrRL's compute scheduler changes the tensor parallelism (TP) of the Gen
instances during a generation step and moves requests away from stragglers.
Its text is only an abstract, so everything quantitative here is this
testbed's own assumption, kept as a parameter (defaults in ``decode.toml``
beside this module, read by `load_defaults`): the response-length
distribution (`LengthDist`), the decode-time formula (`DecodeModel`) and the
policy (`PolicyParams`).  `simulate` turns them into a `GenerationStep`: the
decode segments between events (compute time, TP all-reduce payload) and the
events' network transfers (`Move`), which the phases downstream replay.

Symbols: G Gen GPUs (ranks 0..G-1, Gen-local), t TP size of an instance,
n = G / t instances, b running sequences of an instance, B the batch,
L layers, h hidden size, beta bytes per activation/KV element
(``act_bytes``), beta_w bytes per weight (``bytes_per_param``), P parameters,
kv = 2 x L x h_kv x beta KV bytes per token (`kv_bytes_per_token`), p the
prompt length.

Response lengths (`LengthDist`), long-tailed:
  len = clip(round(exp(N(ln median, sigma^2))), min_len, max_len), seeded
  (numpy ``default_rng(seed)``).

Decode time (`DecodeModel`), real seconds of one decode step (one token for
each of the b running sequences) at TP t:
  T(t, b) = fixed_s + weights_s / t + seq_s x b / t + comm_s x b x (t - 1) / t,
  T(t, 0) = 0.
  A cluster of t' = m x t GPUs running B sequences as one TP-t' instance beats
  m TP-t instances of B/m sequences each below the crossover batch
  B* = weights_s / (t x comm_s) (`DecodeModel.crossover_batch`): the fixed
  and sequence terms are equal per token, the wide instance reads 1/m of the
  weights per token and pays comm_s x B x (t' - t) / t' more all-reduce.

Execution (`simulate`): sequence j goes to instance j mod n, instance i being
ranks i*t .. i*t+t-1.  Each instance has its own clock: a step with b running
sequences lasts T(t, b) and gives each of them one token; a sequence of length
len finishes at the end of its len-th step.  Between events every instance
starts together, so an instance whose running sequences have r_1 <= ... <= r_b
tokens left is at local time C(k) = sum_{j<=k} T(t, b_j) after k steps, b_j
being its sequences with more than j-1 tokens left: piecewise linear between
the r's.  The step's compute time is the last finish (an infinitely fast
network: moves take no time here).

Barrier (before every event): each instance with work finishes the step it is
in; the event happens at the latest of those step ends.

Policies (`POLICIES`):
  * ``static``: no events.
  * ``switch``: the first time (checked after every instance step) the running
    sequences of the cluster are <= switch_below x B, a barrier, then the
    instances merge m = switch_tp / t at a time into ones of TP switch_tp, the
    busiest with the idlest (`merge_groups`, a snake draft by running count),
    once per step (switch_tp == t: nothing to switch, no event).  Rank order of the
    new instance (`merge_order`), lane-major: position q = l x m + i holds lane
    l of merged instance i.  A TP shard [l/t, (l+1)/t) split m ways gives the
    m new shards [(l m + i)/t', (l m + i + 1)/t'), i < m, and exactly m GPUs --
    lane l of each merged instance -- hold it, so each GPU's new shard lies
    inside the shard it holds and the widening moves 0 weight bytes.
  * ``switch+rebalance``: the switch, plus a straggler check every
    rebalance_every decode steps, counted in steps of the slowest instance at
    the segment start: at S + k x rebalance_every x T(t, b_max), b_max the
    largest running count when the segment (the time since the last event, S)
    began; deterministic, no event without a straggler.  A straggler: an
    instance with running > imbalance x mean running of the instances with
    work, some instance below that mean, and the counts differing by more
    than 1 (otherwise there is nothing to move).  Then a barrier, and requests
    go from the most loaded instances to the least loaded (idle ones
    included) until the counts differ by at most 1: the most loaded keep the
    one extra; donors give their sequences with the fewest generated tokens
    first (smallest KV).  At most max_rebalances per step.  If the barrier
    itself brought the running sequences to the switch threshold, the switch
    happens there instead (a switch merges the instances anyway; the next
    check rebalances the wide ones).  A rebalance whose counts evened out
    during its barrier moves nothing but is kept: its barrier happened.
  The scheduler sees only running counts and generated tokens, never the
  lengths still to come.

Moves (Gen-local ranks; one `Move` per source, destination and kind of bytes):
  * Weight resharding (`weight_reshard`), weights P x beta_w: GPU at position
    q of a TP-t' instance needs [q/t', (q+1)/t') of them, holds its old
    [l/t, (l+1)/t) and fetches the rest from the old lane holding it,
    preferring a holder inside its new instance, then its old instance, then
    the lowest rank.  With `merge_order` a widening moves 0 bytes; a
    narrowing t -> t' (splitting) in `split_order`, the inverse order, moves
    P x beta_w x (1/t' - 1/t) per GPU.  Rank order costs more: (0, 1), (2, 3)
    -> (0, 1, 2, 3) moves 1/4 to GPUs 1 and 2, and (0, 1, 2, 3) -> (0, 1),
    (2, 3) moves 1/4 to GPUs 0 and 3 and 1/2 to GPUs 1 and 2 (their old
    shard lies outside the new one).
  * KV of a running sequence: (p + generated) x kv bytes, sharded by KV heads
    over the lanes like the weights (uniform slices).  `kv_reshard` moves each
    new lane's uncovered part from the old lane holding it: a widening by m
    moves (m - 1)/m of every running sequence's KV.
  * Rebalance: a moved sequence's KV goes lane l -> lane l of the receiving
    instance (equal TP), (p + generated) x kv / t per lane.

Segments (`Segment`, between events): per instance, the TP all-reduce
payload of its decode steps, 2 per layer per step, each of b_step x h x beta:
  tp_bytes = sum over its steps of 2 x L x b_step x h x beta
           = 2 x L x h x beta x tokens it generated in the segment
  (0 when t = 1), tp_ops = 2 x L x its steps in the segment.

Attention-FFN disaggregation inside an instance (`AFSplit`, ``af`` of
`simulate`; None: off, everything above unchanged).  This layout is the
testbed's own assumption (OrchestrRL's abstract says nothing of it;
`traffic.workload`'s A/F splits whole replicas instead, which cannot switch
TP one instance at a time): an instance of TP t holds A = t x a/(a+f)
attention lanes, its positions 0..A-1, which hold the KV and run attention
(TP over the A lanes, KV heads sharded over them), and F = t - A FFN lanes,
positions A..t-1, which hold the experts/FFN weights.  A and F must be whole
and >= 1 for t = tp and for switch_tp (`AFSplit.lanes`).
  * Lane roles survive a widening: with `merge_order`, position q = l x m + i
    is lane l of merged instance i, and q < t' x a/(a+f) = m x A exactly when
    l < A (A whole, i < m), so the new attention lanes are the old ones.  Each
    role's weights are sharded over its own lanes, and the containment above
    holds per role: a widening still moves 0 weight bytes.
  * KV moves only between attention lanes: `kv_reshard` runs on the
    attention lanes (old A -> new m x A): a widening by m moves (m - 1)/m of
    every running sequence's KV, each new attention lane l x m + i fetching
    the KV/(m x A) it lacks from old attention lane l.  A rebalance moves a
    sequence's KV attention lane l -> attention lane l, (p + generated) x kv /
    A per lane, l < A.
  * Decode time: T(t, b) unchanged.  Assumption: the split moves the same
    work to other GPUs of the instance, and the dispatch/combine overlap
    with compute (ping-pong micro-batches, as MegaScale-Infer).
  * Decode traffic, per instance per segment: instead of the all-reduce over
    all t lanes, the M2N between its attention and FFN lanes -- per layer
    per decode step a dispatch (attention -> FFN) and a combine (FFN ->
    attention) of the step's tokens' activations, b_step x h x beta each way
    in total, split evenly over the A x F lane pairs:
      af_bytes = L x h x beta x tokens it generated in the segment, each way,
      per (attention lane, FFN lane) pair and direction af_bytes / (A x F),
      af_ops = L x its steps;
    plus the attention lanes' own TP all-reduce, one per layer per step
    (attention's output projection; the FFN's all-reduce is the combine's
    reduction): tp_bytes = L x h x beta x tokens when A > 1 (0 when A = 1),
    tp_ops = L x its steps, over the attention lanes only.  The experts
    live on the FFN lanes, so the decode has no expert all-to-all between
    instances (gen-ep, `traffic.phases.build_phases`, is left out).  Prefill
    is left out as without A/F: the step is decode.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from traffic.workload import Model

if sys.version_info >= (3, 11):
    import tomllib
else:                                   # Ubuntu 22.04's Python 3.10
    import tomli as tomllib

DATA = Path(__file__).with_name("decode.toml")

POLICIES = ("static", "switch", "switch+rebalance")


class GenerationError(ValueError):
    """A generation-step parameter is invalid; the message names it and what is allowed."""


# ---------------------------------------------------------------- validation
@dataclass(frozen=True)
class _Rule:
    """What one parameter may be: an integer or a number, in a range."""

    integer: bool
    low: float
    low_open: bool = False            # low excluded
    high: float = math.inf
    high_open: bool = True

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if math.isinf(self.high):
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return (f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.high_open else ']'}")

    def allows(self, value) -> bool:
        if isinstance(value, bool):
            return False
        if not isinstance(value, int if self.integer else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


# The data file's sections, each the fields of one dataclass.
_RULES: Dict[str, Dict[str, _Rule]] = {
    "lengths": {"median": _Rule(True, 1), "sigma": _Rule(False, 0),
                "min_len": _Rule(True, 1), "max_len": _Rule(True, 1)},
    "decode": {"fixed_s": _Rule(False, 0), "weights_s": _Rule(False, 0),
               "seq_s": _Rule(False, 0), "comm_s": _Rule(False, 0)},
    "policy": {"tp": _Rule(True, 1), "switch_tp": _Rule(True, 1),
               "switch_below": _Rule(False, 0, high=1), "rebalance_every": _Rule(True, 1),
               "imbalance": _Rule(False, 1), "max_rebalances": _Rule(True, 0)},
}


def _validate(section: str, values: dict, label: Callable[[str], str]) -> None:
    """Check one section's values; ``label(key)`` names a key in the message."""
    for key, rule in _RULES[section].items():
        if key in values and not rule.allows(values[key]):
            raise GenerationError(f"{label(key)} must be {rule.describe()}, "
                                  f"got {values[key]!r}")
    if section == "lengths" and values["min_len"] > values["max_len"]:
        raise GenerationError(f"{label('max_len')} must be >= {label('min_len')}="
                              f"{values['min_len']}, got {values['max_len']}")
    if section == "decode" and values["fixed_s"] + values["weights_s"] + values["seq_s"] <= 0:
        raise GenerationError(f"{label('fixed_s')}, {label('weights_s')} and "
                              f"{label('seq_s')} must not all be 0 (a step takes time)")
    if section == "policy" and values["switch_tp"] % values["tp"]:
        raise GenerationError(f"{label('switch_tp')} must be a multiple of {label('tp')}="
                              f"{values['tp']}, got {values['switch_tp']}")


def _check_dataclass(obj, section: str) -> None:
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    _validate(section, values, lambda key: f"{section}.{key}")


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise GenerationError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_positive(name: str, value) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise GenerationError(f"{name} must be a finite number > 0, got {value!r}")


# ---------------------------------------------------------------- parameters
@dataclass(frozen=True)
class LengthDist:
    """Response lengths in tokens: log-normal around ``median``, clipped."""

    median: int = 512
    sigma: float = 1.0
    min_len: int = 16
    max_len: int = 4096

    def __post_init__(self):
        _check_dataclass(self, "lengths")

    def sample(self, count: int, seed: int) -> List[int]:
        """``count`` lengths; the same seed gives the same list."""
        _check_int("count", count, 0)
        _check_int("seed", seed, 0)
        rng = np.random.default_rng(seed)
        raw = rng.lognormal(math.log(self.median), self.sigma, size=count)
        return np.clip(np.rint(raw), self.min_len, self.max_len).astype(np.int64).tolist()


@dataclass(frozen=True)
class DecodeModel:
    """Real seconds of one decode step (one token for every running sequence) of an
    instance with TP size t carrying b running sequences:
        T(t, b) = fixed_s + weights_s / t + seq_s * b / t + comm_s * b * (t - 1) / t
    fixed_s: launch/sampling overhead; weights_s: reading all weights on one GPU
    (memory bound, split over TP); seq_s: per sequence KV read and compute (split over TP);
    comm_s: per sequence TP all-reduce cost, growing with the group ((t-1)/t of a ring).
    Large batches favour many narrow instances (the comm term), the long tail favours
    few wide ones (the weights term)."""

    # Defaults: ``decode.toml`` says why (a ~14B model on H800-class GPUs).
    fixed_s: float = 0.0015
    weights_s: float = 0.0095
    seq_s: float = 0.00012
    comm_s: float = 0.0008

    def __post_init__(self):
        _check_dataclass(self, "decode")

    def step_s(self, tp: int, batch: int) -> float:
        """T(tp, batch); 0.0 with no running sequence."""
        _check_int("tp", tp, 1)
        _check_int("batch", batch, 0)
        if batch == 0:
            return 0.0
        return (self.fixed_s + self.weights_s / tp + self.seq_s * batch / tp
                + self.comm_s * batch * (tp - 1) / tp)

    def _step_array(self, tp: int, batch: np.ndarray) -> np.ndarray:
        """T(tp, b) for an array of b (the same formula, vectorised)."""
        batch = np.asarray(batch, dtype=float)
        steps = (self.fixed_s + self.weights_s / tp + self.seq_s * batch / tp
                 + self.comm_s * batch * (tp - 1) / tp)
        return np.where(batch > 0, steps, 0.0)

    def crossover_batch(self, tp: int, wide_tp: int) -> float:
        """Running sequences B on a group of ``wide_tp`` GPUs below which one TP-``wide_tp``
        instance decodes them all faster than m = wide_tp / tp TP-``tp`` instances of B/m
        each (both give B tokens per step):

            T(tp, B/m) - T(wide_tp, B) = (wide_tp - tp) / wide_tp x (weights_s / tp - comm_s x B)

        (fixed_s and the seq_s term are the same per token), so B* = weights_s /
        (tp x comm_s), whatever wide_tp; infinite when comm_s = 0 (wide always wins)."""
        _check_int("tp", tp, 1)
        _check_int("wide_tp", wide_tp, tp + 1)
        if wide_tp % tp:
            raise GenerationError(f"wide_tp must be a multiple of tp={tp}, got {wide_tp}")
        if self.comm_s == 0:
            return math.inf
        return self.weights_s / (tp * self.comm_s)


@dataclass(frozen=True)
class PolicyParams:
    """OrchestrRL's scheduler as this testbed assumes it (see the module docstring)."""

    tp: int = 2                 # TP of every instance when a step starts
    switch_tp: int = 4          # TP after the switch (a multiple of tp)
    switch_below: float = 0.25  # switch when running sequences <= this share of the batch
    rebalance_every: int = 64   # decode steps (tokens) between straggler checks
    imbalance: float = 1.5      # straggler: running > imbalance x mean of instances with work
    max_rebalances: int = 8     # per step (each one is a network phase downstream)

    def __post_init__(self):
        _check_dataclass(self, "policy")


AF_OFF = ("off", "0")


@dataclass(frozen=True)
class AFSplit:
    """Attention-FFN disaggregation inside an instance, the testbed's assumption
    (module docstring): ``attention``:``ffn`` is the share of an instance's
    lanes that are attention lanes (positions first) and FFN lanes."""

    attention: int = 1
    ffn: int = 1

    def __post_init__(self):
        for name in ("attention", "ffn"):
            _check_int(f"af {name} lanes", getattr(self, name), 1)

    def __str__(self) -> str:
        return f"{self.attention}:{self.ffn}"

    def lanes(self, tp: int, key: str = "af", where: str = "") -> Tuple[int, int]:
        """(A, F): the attention and FFN lanes of a TP-``tp`` instance; both whole
        and >= 1, else `GenerationError` naming ``key`` (``where``: which TP it is)."""
        share = self.attention + self.ffn
        if (tp * self.attention) % share or tp * self.attention < share \
                or tp * self.ffn < share:
            raise GenerationError(
                f"{key}={self} does not split an instance of TP {tp}{where} into whole "
                f"attention and FFN lanes (TP x {self.attention}/{share} = "
                f"{tp * self.attention / share:g}); allowed: A:F with TP x A/(A+F) a whole "
                f"number from 1 to TP - 1 (1:1 for an even TP), or 'off'")
        attention = tp * self.attention // share
        return attention, tp - attention


def parse_af(text, key: str = "af") -> Optional[AFSplit]:
    """``"A:F"`` (attention:FFN lanes, integers >= 1) as an `AFSplit`; ``"off"`` or
    ``"0"``: None (no A/F).  Anything else raises `GenerationError` naming ``key``."""
    if isinstance(text, str) and text.strip().lower() in AF_OFF:
        return None
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) == 2 and all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        return AFSplit(int(parts[0]), int(parts[1]))
    raise GenerationError(f"{key} must be 'A:F' (attention:FFN lanes of an instance, "
                          f"integers >= 1, e.g. '1:1'), 'off' or '0', got {text!r}")


# ---------------------------------------------------------------- results
@dataclass(frozen=True)
class Move:
    """One network transfer between Gen-local GPU ranks."""

    src: int
    dst: int
    bytes: float


@dataclass
class Event:
    kind: str                   # "switch" or "rebalance"
    at_s: float                 # compute time (real s) from the step start at which it happens
    tp_from: int
    tp_to: int
    moves: List[Move]           # lane by lane; never src == dst; bytes > 0
    weight_bytes: float         # resharding (sum of weight moves)
    kv_bytes: float             # KV of in-flight requests moved
    requests_moved: int

    def moved_bytes(self) -> float:
        return sum(move.bytes for move in self.moves)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "at_s": self.at_s, "tp_from": self.tp_from,
                "tp_to": self.tp_to, "moves": len(self.moves),
                "moved_bytes": self.moved_bytes(), "weight_bytes": self.weight_bytes,
                "kv_bytes": self.kv_bytes, "requests_moved": self.requests_moved}


@dataclass
class Segment:
    index: int
    tp: int
    instances: List[Tuple[int, ...]]   # Gen-local GPU ranks of each instance, in TP-lane order
    start_s: float              # compute time from the step start (real s)
    compute_s: float            # decode time of the segment (up to the next event or the end)
    steps: int                  # decode steps of the slowest instance in it
    running_at_start: int       # running sequences at its start
    tp_bytes: List[float]       # per instance: sum over its steps of 2 x L x b_step x h x beta
    tp_ops: List[int]           # per instance: 2 x L x its decode steps in the segment
    # With A/F (module docstring): the first ``attention_lanes`` positions of
    # each instance are its attention lanes (0: no A/F); tp_bytes and tp_ops
    # are then their all-reduce's, L x b_step x h x beta per step (0 with one
    # attention lane), and af_bytes / af_ops the M2N's.
    attention_lanes: int = 0
    af_bytes: List[float] = field(default_factory=list)   # per instance, each way
    af_ops: List[int] = field(default_factory=list)       # per instance: L x its steps

    def tp_group(self, index: int) -> Tuple[int, ...]:
        """The lanes of instance ``index`` that all-reduce: its attention lanes
        with A/F, else all of them."""
        instance = self.instances[index]
        return tuple(instance[:self.attention_lanes]) if self.attention_lanes else instance

    def af_pairs(self, index: int) -> List[Tuple[int, int, float]]:
        """The M2N of instance ``index`` in the segment: (attention lane, FFN lane,
        bytes) for the dispatch and (FFN lane, attention lane, bytes) for the
        combine, af_bytes / (A x F) each; [] without A/F."""
        if not self.attention_lanes or not self.af_bytes or not self.af_bytes[index]:
            return []
        instance = self.instances[index]
        attention, ffn = instance[:self.attention_lanes], instance[self.attention_lanes:]
        share = self.af_bytes[index] / (len(attention) * len(ffn))
        return ([(a, f, share) for a in attention for f in ffn]
                + [(f, a, share) for a in attention for f in ffn])

    def to_dict(self) -> dict:
        out = {"index": self.index, "tp": self.tp, "instances": len(self.instances),
               "start_s": self.start_s, "compute_s": self.compute_s, "steps": self.steps,
               "running_at_start": self.running_at_start,
               "tp_bytes": _summary(self.tp_bytes), "tp_ops": _summary(self.tp_ops)}
        if self.attention_lanes:
            out.update(attention_lanes=self.attention_lanes, af_bytes=_summary(self.af_bytes),
                       af_ops=_summary(self.af_ops))
        return out


@dataclass
class GenerationStep:
    policy: str
    gpus: int
    lengths: List[int]
    segments: List[Segment]     # consecutive; segment k+1 starts at event k
    events: List[Event]         # event k sits between segment k and k+1
    compute_s: float            # total compute-only time (infinitely fast network)
    tokens: int                 # sum(lengths)
    af: Optional[AFSplit] = None   # A/F inside each instance (None: off)

    def af_bytes(self) -> float:
        """The M2N's bytes over the step, both ways, every instance (0 without A/F)."""
        return 2 * sum(sum(segment.af_bytes) for segment in self.segments)

    def throughput(self) -> float:
        """Tokens per real second of compute."""
        return self.tokens / self.compute_s if self.compute_s > 0 else 0.0

    def moved_bytes(self, kind: Optional[str] = None) -> float:
        return sum(event.moved_bytes() for event in self.events
                   if kind is None or event.kind == kind)

    def to_dict(self) -> dict:
        """A JSON-able summary: lists of more than 100 entries become statistics."""
        return {"policy": self.policy, "gpus": self.gpus, "batch": len(self.lengths),
                "tokens": self.tokens, "compute_s": self.compute_s,
                "throughput_tokens_s": self.throughput(), "lengths": _summary(self.lengths),
                "segments": [segment.to_dict() for segment in self.segments],
                "events": [event.to_dict() for event in self.events],
                "moved_bytes": {kind: self.moved_bytes(kind) for kind in ("switch", "rebalance")},
                "af": None if self.af is None else str(self.af), "af_bytes": self.af_bytes()}


def _summary(values: Sequence[float]) -> dict:
    """Count, sum, mean, p50, p99 and max of a list, and the values themselves when there
    are at most 100 (a JSON summary stays small at 2048 GPUs)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {"count": 0}
    summary = {"count": int(array.size), "sum": float(array.sum()),
               "mean": float(array.mean()), "p50": float(np.percentile(array, 50)),
               "p99": float(np.percentile(array, 99)), "max": float(array.max())}
    if array.size <= 100:
        summary["values"] = [v.item() if isinstance(v, np.generic) else v for v in values]
    return summary


# ---------------------------------------------------------------- the data file
def load_defaults(path: Optional[Path] = None) -> Tuple[LengthDist, DecodeModel, PolicyParams]:
    """The parameters in ``decode.toml`` (or ``path``); a key left out keeps the
    dataclass default.  Unknown sections or keys and bad values raise
    `GenerationError` naming the file, section and key."""
    path = Path(path or DATA)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise GenerationError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise GenerationError(f"{path}: not valid TOML: {exc}") from None
    classes = {"lengths": LengthDist, "decode": DecodeModel, "policy": PolicyParams}
    unknown = sorted(set(data) - set(classes))
    if unknown:
        raise GenerationError(f"{path}: unknown sections {unknown}; allowed: "
                              f"{', '.join(f'[{name}]' for name in classes)}")
    built = []
    for section, cls in classes.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise GenerationError(f"{path}: [{section}] must be a table")
        allowed = list(_RULES[section])
        for key in table:
            if key not in allowed:
                raise GenerationError(f"{path}: unknown key {key!r} in [{section}]; allowed: "
                                      f"{', '.join(allowed)}")
        values = {f.name: table.get(f.name, f.default) for f in fields(cls)}
        _validate(section, values, lambda key, s=section: f"{path}: [{s}] {key}")
        built.append(cls(**values))
    return tuple(built)


# ---------------------------------------------------------------- layouts and moves
def kv_bytes_per_token(model: Model, act_bytes: float) -> float:
    """K and V of every layer for one token: 2 x L x h_kv x beta."""
    return model.kv_bytes_per_token(act_bytes)


def _uniform_size(instances: Sequence[Tuple[int, ...]], name: str) -> int:
    sizes = {len(instance) for instance in instances}
    if len(sizes) != 1 or 0 in sizes:
        raise GenerationError(f"{name} instances must all have the same TP size >= 1, "
                              f"got sizes {sorted(sizes)}")
    ranks = [rank for instance in instances for rank in instance]
    if len(set(ranks)) != len(ranks):
        raise GenerationError(f"{name} instances share GPUs: {list(instances)}")
    return sizes.pop()


def merge_order(old_instances: Sequence[Tuple[int, ...]], new_tp: int) -> List[Tuple[int, ...]]:
    """Merge every m = new_tp / t consecutive instances into one, lane-major: position
    q = l x m + i holds lane l of merged instance i, so each GPU's new shard lies
    inside the one it holds (module docstring)."""
    old_tp = _uniform_size(old_instances, "old")
    _check_int("new_tp", new_tp, old_tp)
    if new_tp % old_tp:
        raise GenerationError(f"new_tp must be a multiple of the old TP {old_tp}, got {new_tp}")
    merged = new_tp // old_tp
    if len(old_instances) % merged:
        raise GenerationError(f"{len(old_instances)} instances do not merge {merged} at a time "
                              f"(new_tp={new_tp}, old TP {old_tp})")
    return [tuple(group[i][lane] for lane in range(old_tp) for i in range(merged))
            for group in (old_instances[g:g + merged]
                          for g in range(0, len(old_instances), merged))]


def merge_groups(load: Sequence[int], merged: int) -> List[int]:
    """Which instances merge: their indices in groups of ``merged`` consecutive
    entries, dealt like a snake draft over the instances sorted busiest first
    (group 0 takes the busiest, group 1 the next, ..., the last group takes two
    in a row, and back), so that each wide instance starts with about the same
    running sequences: the busiest instance merges with the idlest.  Ties keep
    rank order.  Where the instances sit is not looked at: the wide instances
    span whichever servers (and ToRs) that pairing gives, and their circuits
    follow (`controllers.rfabric_templates`, ``gen-config``)."""
    count = len(load)
    if merged < 1 or count % merged:
        raise GenerationError(f"{count} instances do not merge {merged} at a time")
    groups = count // merged
    busiest = sorted(range(count), key=lambda i: (-int(load[i]), i))
    members: List[List[int]] = [[] for _ in range(groups)]
    for place, index in enumerate(busiest):
        round_, seat = divmod(place, groups)
        members[seat if round_ % 2 == 0 else groups - 1 - seat].append(index)
    return [i for group in members for i in group]


def split_order(old_instances: Sequence[Tuple[int, ...]], new_tp: int) -> List[Tuple[int, ...]]:
    """The inverse of `merge_order`: split every instance m = t / new_tp ways, new instance
    i taking old positions i, m + i, 2m + i, ...  Each GPU's old shard [q/t, (q+1)/t),
    q = l x m + i, lies inside its new one [l/t', (l+1)/t'), so it fetches only the other
    m - 1 slices: a narrowing moves weight_bytes x (1/t' - 1/t) per GPU."""
    old_tp = _uniform_size(old_instances, "old")
    _check_int("new_tp", new_tp, 1)
    if old_tp % new_tp:
        raise GenerationError(f"new_tp must divide the old TP {old_tp}, got {new_tp}")
    split = old_tp // new_tp
    return [tuple(instance[i::split]) for instance in old_instances for i in range(split)]


def weight_reshard(old: Sequence[Tuple[int, ...]], new: Sequence[Tuple[int, ...]],
                   weight_bytes: float) -> List[Move]:
    """The transfers turning layout ``old`` into ``new`` for ``weight_bytes`` sharded over
    each instance's lanes: every GPU fetches the part of its new shard it does not hold
    from the old lane holding it, preferring a holder in its new instance, then in its
    old instance, then the lowest rank.  A GPU absent from ``old`` holds nothing."""
    if weight_bytes < 0 or not math.isfinite(weight_bytes):
        raise GenerationError(f"weight_bytes must be a finite number >= 0, got {weight_bytes!r}")
    old_tp, new_tp = _uniform_size(old, "old"), _uniform_size(new, "new")
    # Integer units: every lane boundary of both layouts is a whole number of them.
    units = math.lcm(old_tp, new_tp)
    old_width, new_width = units // old_tp, units // new_tp
    lane_of: Dict[int, int] = {}
    old_instance_of: Dict[int, int] = {}
    holders: List[List[int]] = [[] for _ in range(old_tp)]
    for index, instance in enumerate(old):
        for lane, rank in enumerate(instance):
            lane_of[rank], old_instance_of[rank] = lane, index
            holders[lane].append(rank)
    moves: List[Move] = []
    for instance in new:
        members = set(instance)
        for position, rank in enumerate(instance):
            need_start, need_end = position * new_width, (position + 1) * new_width
            for lane in range(need_start // old_width, -(-need_end // old_width)):
                if lane_of.get(rank) == lane:
                    continue                        # its own old shard covers this part
                piece = (min(need_end, (lane + 1) * old_width)
                         - max(need_start, lane * old_width))
                if piece <= 0 or weight_bytes == 0:
                    continue
                src = _pick_holder(holders[lane], members, old_instance_of.get(rank))
                moves.append(Move(src, rank, float(weight_bytes) * piece / units))
    return moves


def _pick_holder(holders: List[int], members: set, own_old: Optional[int]) -> int:
    """The GPU to fetch one old lane from: ``holders`` has that lane's GPU of every old
    instance, in old-instance order."""
    inside = [rank for rank in holders if rank in members]
    if inside:
        return inside[0]
    if own_old is not None:
        return holders[own_old]             # its own old instance (a narrowing splits it)
    return min(holders)


def kv_reshard(old_instance: Tuple[int, ...], new_instance: Tuple[int, ...],
               kv_bytes: float) -> List[Move]:
    """The transfers of ``kv_bytes`` of KV (sharded by KV heads over the lanes) from one
    instance's layout to another's: each new lane fetches what it does not hold from
    the old lane holding it."""
    return weight_reshard([tuple(old_instance)], [tuple(new_instance)], kv_bytes)


def _add_moves(total: Dict[Tuple[int, int], float], moves: List[Move]) -> None:
    for move in moves:
        total[(move.src, move.dst)] = total.get((move.src, move.dst), 0.0) + move.bytes


def _as_moves(total: Dict[Tuple[int, int], float]) -> List[Move]:
    return [Move(src, dst, float(size)) for (src, dst), size in total.items() if size > 0]


# ---------------------------------------------------------------- the decode timeline
@dataclass
class _Timeline:
    """Every instance's decode from a common start, rows = instances, columns = its running
    sequences in order of tokens left (padding, 0 tokens left, first)."""

    left: np.ndarray            # (n, w) tokens left
    left_before: np.ndarray     # (n, w) tokens left of the previous column (0 for the first)
    ends: np.ndarray            # (n, w) local time at which that sequence finishes
    step: np.ndarray            # (w,) T(t, running) while column c's sequence is the shortest
    ids: np.ndarray             # (n, w) sequence index, -1 for padding
    real: np.ndarray            # (n, w) ids >= 0

    def running_at(self, local_s: float) -> np.ndarray:
        return ((self.ends > local_s) & self.real).sum(axis=1)

    def barrier(self, local_s: float) -> Tuple[np.ndarray, np.ndarray]:
        """Per instance, the decode steps done and the local time when the step it is in
        at ``local_s`` ends (its last finish if it has no work left then)."""
        rows = np.arange(self.left.shape[0])
        width = self.left.shape[1]
        column = (self.ends < local_s).sum(axis=1)          # first finish at or after it
        done = column >= width
        column = np.minimum(column, width - 1)
        before = np.where(column > 0, self.ends[rows, np.maximum(column - 1, 0)], 0.0)
        start_left = self.left_before[rows, column]
        span = self.left[rows, column] - start_left
        step = self.step[column]
        safe = np.where(step > 0, step, 1.0)
        offset = np.ceil((local_s - before) / safe)
        # Float rounding can put the ceiling one step off either way: settle on the first
        # step end at or after local_s.
        offset = np.where(before + (offset - 1) * step >= local_s, offset - 1, offset)
        offset = np.where(before + offset * step < local_s, offset + 1, offset)
        offset = np.clip(offset, 1, np.maximum(span, 1)).astype(np.int64)
        steps = np.where(done, self.left[:, -1], start_left + offset)
        end = np.where(done, self.ends[:, -1], np.where(offset == span, self.ends[rows, column],
                                                        before + offset * step))
        return steps.astype(np.int64), end


def _timeline(left: np.ndarray, instance: np.ndarray, ids: np.ndarray, count: int, tp: int,
              decode: DecodeModel) -> _Timeline:
    order = np.lexsort((left, instance))
    left, instance, ids = left[order], instance[order], ids[order]
    per_instance = np.bincount(instance, minlength=count)
    width = max(int(per_instance.max()) if per_instance.size else 0, 1)
    first = np.cumsum(per_instance) - per_instance
    column = width - per_instance[instance] + (np.arange(left.size) - first[instance])
    grid_left = np.zeros((count, width), dtype=np.int64)
    grid_ids = np.full((count, width), -1, dtype=np.int64)
    grid_left[instance, column] = left
    grid_ids[instance, column] = ids
    left_before = np.zeros_like(grid_left)
    left_before[:, 1:] = grid_left[:, :-1]
    # While column c's sequence is the shortest still running, width - c run (padding has
    # 0 tokens left, so its columns last 0 steps).
    step = decode._step_array(tp, width - np.arange(width))
    ends = np.cumsum((grid_left - left_before) * step, axis=1)
    return _Timeline(grid_left, left_before, ends, step, grid_ids, grid_ids >= 0)


# ---------------------------------------------------------------- simulation
def _check_simulate(gpus, batch, policy, params, decode, lengths, model, seed, prompt_len,
                    act_bytes, bytes_per_param, af) -> None:
    if policy not in POLICIES:
        raise GenerationError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    _check_int("gpus", gpus, 1)
    _check_int("batch", batch, 1)
    _check_int("seed", seed, 0)
    _check_int("prompt_len", prompt_len, 0)
    _check_positive("act_bytes", act_bytes)
    _check_positive("bytes_per_param", bytes_per_param)
    for name, value, cls in (("params", params, PolicyParams), ("decode", decode, DecodeModel),
                             ("lengths", lengths, LengthDist), ("model", model, Model)):
        if not isinstance(value, cls):
            raise GenerationError(f"{name} must be a {cls.__name__}, got {type(value).__name__}")
    for name in ("tp", "switch_tp"):
        if gpus % getattr(params, name):
            raise GenerationError(f"gpus={gpus} must be a multiple of params.{name}="
                                  f"{getattr(params, name)}")
    if af is not None:
        if not isinstance(af, AFSplit):
            raise GenerationError(f"af must be an AFSplit or None, got {type(af).__name__}")
        for name in ("tp", "switch_tp"):
            af.lanes(getattr(params, name), "af", f" (params.{name})")


def simulate(gpus: int, batch: int, policy: str, params: PolicyParams, decode: DecodeModel,
             lengths: LengthDist, model: Model, seed: int = 0, prompt_len: int = 1024,
             act_bytes: float = 2.0, bytes_per_param: float = 2.0,
             lengths_list: Optional[Sequence[int]] = None,
             af: Optional[AFSplit] = None) -> GenerationStep:
    """One generation step of ``batch`` sequences on ``gpus`` Gen GPUs under ``policy``
    (module docstring).  ``lengths_list``, when given, is the batch's response lengths
    (``batch`` integers >= 1) instead of ``lengths.sample(batch, seed)``: hand-made batches.
    ``af`` splits every instance into attention and FFN lanes (None: no A/F)."""
    _check_simulate(gpus, batch, policy, params, decode, lengths, model, seed, prompt_len,
                    act_bytes, bytes_per_param, af)
    if lengths_list is None:
        sampled = lengths.sample(batch, seed)
    else:
        sampled = list(lengths_list)
        if len(sampled) != batch:
            raise GenerationError(f"lengths_list has {len(sampled)} entries for batch={batch}")
        for value in sampled:
            _check_int("lengths_list entries", value, 1)
        sampled = [int(value) for value in sampled]
    run = _Run(gpus, batch, policy, params, decode, model, prompt_len, act_bytes,
               bytes_per_param, sampled, af)
    return run.execute()


class _Run:
    """The state of one `simulate`: sequences, the current layout, what happened so far."""

    def __init__(self, gpus, batch, policy, params, decode, model, prompt_len, act_bytes,
                 bytes_per_param, sampled, af=None):
        self.gpus, self.batch, self.policy, self.params = gpus, batch, policy, params
        self.af = af
        self.decode, self.model = decode, model
        self.prompt_len, self.act_bytes = prompt_len, act_bytes
        self.weight_bytes = model.params * bytes_per_param
        self.kv_token = kv_bytes_per_token(model, act_bytes)
        self.lengths = sampled
        self.length = np.asarray(sampled, dtype=np.int64)
        self.generated = np.zeros(batch, dtype=np.int64)
        self.tp = params.tp
        self.instances = [tuple(range(i * self.tp, (i + 1) * self.tp))
                          for i in range(gpus // self.tp)]
        self.instance = np.arange(batch, dtype=np.int64) % len(self.instances)
        self.switched = policy == "static" or params.switch_tp == params.tp
        self.rebalances_left = params.max_rebalances if policy == "switch+rebalance" else 0
        # running <= switch_below x B, with running an integer
        self.switch_at_running = math.floor(params.switch_below * batch)
        self.segments: List[Segment] = []
        self.events: List[Event] = []

    def running_ids(self) -> np.ndarray:
        return np.flatnonzero(self.generated < self.length)

    def execute(self) -> GenerationStep:
        start = 0.0
        while True:
            ids = self.running_ids()
            if ids.size == 0:
                break
            timeline = _timeline(self.length[ids] - self.generated[ids], self.instance[ids],
                                 ids, len(self.instances), self.tp, self.decode)
            trigger = self._next_trigger(timeline, ids.size)
            if trigger is None:
                steps = timeline.left[:, -1]
                self._close_segment(timeline, steps, start, float(timeline.ends[:, -1].max()),
                                    ids.size)
                break
            steps, ends = timeline.barrier(trigger)
            barrier = float(ends.max())
            self._close_segment(timeline, steps, start, barrier, ids.size)
            start += barrier
            running = self.running_ids()
            if running.size == 0:
                break                               # the barrier finished the step
            if not self.switched and running.size <= self.switch_at_running:
                self._switch(start, running)
            else:
                self._rebalance(start, running)
        compute = self.segments[-1].start_s + self.segments[-1].compute_s
        return GenerationStep(self.policy, self.gpus, self.lengths, self.segments, self.events,
                              compute, int(self.length.sum()), self.af)

    def attention_lanes(self, tp: Optional[int] = None) -> int:
        """A, the attention lanes of an instance at TP ``tp`` (the current TP by
        default); 0 without A/F."""
        return self.af.lanes(tp or self.tp)[0] if self.af is not None else 0

    def kv_lanes(self, instance: Tuple[int, ...], tp: Optional[int] = None) -> Tuple[int, ...]:
        """The lanes of an instance that hold its KV: the attention lanes with A/F."""
        attention = self.attention_lanes(tp)
        return tuple(instance[:attention]) if attention else tuple(instance)

    def _next_trigger(self, timeline: _Timeline, running: int) -> Optional[float]:
        """The local time of the next event's trigger, or None: the segment runs to the end.
        A trigger at the last finish is none: its barrier would end the step."""
        last = float(timeline.ends[:, -1].max())
        switch_s = math.inf
        if not self.switched:
            # Finishes that bring the running count to the threshold: >= 1, because a
            # barrier reaching it switches at once (execute) and the step starts above it.
            need = max(running - self.switch_at_running, 1)
            finishes = timeline.ends[timeline.real]
            switch_s = float(np.partition(finishes, need - 1)[need - 1])
        if self.rebalances_left > 0:
            # rebalance_every steps of the slowest instance at the segment start.
            period = self.params.rebalance_every * float(timeline.step[0])
            check = period
            while check < min(switch_s, last):
                if self._straggler(timeline.running_at(check)):
                    return check
                check += period
        return switch_s if switch_s < last else None

    def _straggler(self, counts: np.ndarray) -> bool:
        busy = counts[counts > 0]
        if busy.size == 0 or counts.max() - counts.min() <= 1:
            return False
        mean = busy.mean()
        return bool(counts.max() > self.params.imbalance * mean and (counts < mean).any())

    def _close_segment(self, timeline: _Timeline, steps: np.ndarray, start: float,
                       duration: float, running: int) -> None:
        done = np.where(timeline.real, np.minimum(timeline.left, steps[:, None]), 0)
        self.generated[timeline.ids[timeline.real]] += done[timeline.real]
        tokens = done.sum(axis=1)
        layers = self.model.layers
        per_layer_token = self.model.hidden * self.act_bytes
        attention = self.attention_lanes()
        if attention:
            # A/F: the attention lanes' all-reduce (one per layer) and the M2N.
            per_token = layers * per_layer_token if attention > 1 else 0.0
            ops = layers * steps
            af_bytes = (tokens * layers * per_layer_token).astype(float).tolist()
            af_ops = ops.astype(int).tolist()
        else:
            per_token = 2 * layers * per_layer_token if self.tp > 1 else 0.0
            ops, af_bytes, af_ops = 2 * layers * steps, [], []
        self.segments.append(Segment(
            index=len(self.segments), tp=self.tp, instances=list(self.instances),
            start_s=start, compute_s=duration, steps=int(steps.max()),
            running_at_start=running, tp_bytes=(tokens * per_token).astype(float).tolist(),
            tp_ops=ops.astype(int).tolist(), attention_lanes=attention, af_bytes=af_bytes,
            af_ops=af_ops))

    def _kv_bytes(self, ids: np.ndarray) -> np.ndarray:
        return (self.prompt_len + self.generated[ids]) * self.kv_token

    def _switch(self, at: float, running: np.ndarray) -> None:
        old, merged = self.instances, self.params.switch_tp // self.tp
        load = np.bincount(self.instance[running], minlength=len(old))
        order = merge_groups(load, merged)
        new = merge_order([old[i] for i in order], self.params.switch_tp)
        new_of_old = np.empty(len(old), dtype=np.int64)
        new_of_old[order] = np.arange(len(old)) // merged
        weights = weight_reshard(old, new, self.weight_bytes)
        kv_per_old = np.bincount(self.instance[running], weights=self._kv_bytes(running),
                                 minlength=len(old))
        kv: Dict[Tuple[int, int], float] = {}
        for index in np.flatnonzero(kv_per_old > 0):
            # With A/F only the attention lanes hold KV, before and after.
            _add_moves(kv, kv_reshard(self.kv_lanes(old[index]),
                                      self.kv_lanes(new[new_of_old[index]],
                                                    self.params.switch_tp),
                                      kv_per_old[index]))
        kv_moves = _as_moves(kv)
        self.events.append(Event(
            kind="switch", at_s=at, tp_from=self.tp, tp_to=self.params.switch_tp,
            moves=weights + kv_moves, weight_bytes=float(sum(m.bytes for m in weights)),
            kv_bytes=float(sum(m.bytes for m in kv_moves)), requests_moved=int(running.size)))
        self.instances, self.tp, self.switched = new, self.params.switch_tp, True
        self.instance = new_of_old[self.instance]

    def _rebalance(self, at: float, running: np.ndarray) -> None:
        self.rebalances_left -= 1
        count = len(self.instances)
        load = np.bincount(self.instance[running], minlength=count)
        # Targets differing by at most 1; the most loaded keep the extra ones (fewest moves).
        target = np.full(count, running.size // count)
        by_load = np.argsort(-load, kind="stable")
        target[by_load[:running.size % count]] += 1
        receivers = [i for i in np.argsort(load, kind="stable") if load[i] < target[i]]
        free = {int(i): int(target[i] - load[i]) for i in receivers}
        donated: List[Tuple[int, int]] = []         # (sequence, from instance)
        for donor in by_load:
            excess = int(load[donor] - target[donor])
            if excess <= 0:
                continue
            mine = running[self.instance[running] == donor]
            # Fewest generated tokens first: the smallest KV to move.
            mine = mine[np.argsort(self.generated[mine], kind="stable")][:excess]
            donated.extend((int(seq), int(donor)) for seq in mine)
        kv: Dict[Tuple[int, int], float] = {}
        receiver_order = [int(i) for i in receivers for _ in range(free[int(i)])]
        kv_lanes = self.attention_lanes() or self.tp
        shares = (self._kv_bytes(np.array([seq for seq, _ in donated], dtype=np.int64))
                  / kv_lanes)
        for (seq, donor), receiver, share in zip(donated, receiver_order, shares.tolist()):
            src, dst = self.instances[donor], self.instances[receiver]
            _add_moves(kv, [Move(src[lane], dst[lane], share) for lane in range(kv_lanes)])
            self.instance[seq] = receiver
        moves = _as_moves(kv)
        self.events.append(Event(
            kind="rebalance", at_s=at, tp_from=self.tp, tp_to=self.tp, moves=moves,
            weight_bytes=0.0, kv_bytes=float(sum(m.bytes for m in moves)),
            requests_moved=len(donated)))
