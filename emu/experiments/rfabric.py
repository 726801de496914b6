"""Disaggregated RL on several fabrics: the RFabric Figure 6 comparison, emulated.

One small RL workload (`WORKLOADS`: ``toy-moe-16``, the default, a 0.5
B-parameter toy MoE on 16 GPUs, Train TP=2 x PP=2 x DP=2 in one PoD, Gen
TP=2 x DP=4 x EP=2 with 1:1 P/D and, on the decode side, 1:1 A/F in the
other, one-step asynchronous, answering in 32 tokens; or ``toy-16``, a
dense toy of the same size with 1K-token answers and no A/F) is laid out as
phases by `traffic.phases` and replayed for ``iterations`` on each fabric of
``fabrics``, one testbed at a time (``OWNS_TESTBEDS``: `emu.live.series`).
Phases that overlap in the layout run concurrently (`emu.live.rlreplay`).
Every fabric gets the same flows: the ranks land on hosts h1..h16 in the
same order (Train first), and the DAGs do not depend on the fabric (flat
rings, no PoD-aware all-reduce).

The fabric under test is ``[fabric] spec`` (an ``rfabric`` spec); the others
are built at its GPU count, radix and GPUs per server (`fabric_specs`):
``fattree`` (k-ary, when k^3/4 matches), ``clos`` (non-blocking folded Clos,
the cost model's FT), ``fattree-os`` (3:1), ``roft``, ``sip-ocs`` (static
ring-with-chords circuits: no proxy drives it, its GPUs forward).  On
``rfabric`` the RFabric control proxy (`controllers.proxy_core`, mode
``mode``) reconfigures the OCS per phase with ``preset``'s Table 2 delay x
tdf: profiling (on demand) in iteration 1, ahead of time from iteration 2.
gen-ep and gen-af have Small windows (Table 1): the proxy sets no circuits
for them, they ride what is lit.

Reported (emulated seconds, real ones = emulated / tdf): iteration time per
fabric and iteration; time per phase; normalized throughput = FT iteration
time / the fabric's (steady state: the mean of iterations 2 and later), the
analogue of Figure 6; reconfiguration time the phases waited for (exposed:
the gap between a phase being ready and its flows starting) and what the
proxy hid, per iteration; the network cost and cost-efficiency at
``cost_gpus`` GPUs with radix-``cost_radix`` EPS from `topologies.cost`,
weighted by the measured normalized throughput.  The timeline has one
throughput series per phase kind over the whole run and the circuits' dark
windows (torn to lit, from the controller's replies); ``phase_spans`` lists
every phase occurrence.

Runs (as root)::

  .venv/bin/python -m emu.run rfabric                      # FT and RFabric, 3D MEMS
  .venv/bin/python -m emu.run rfabric --set rfabric.preset=piezo
  .venv/bin/python -m emu.run rfabric --set fabrics=fattree,clos,fattree-os,roft,sip-ocs,rfabric
  .venv/bin/python -m emu.run rfabric --set rfabric.mode=reactive

Each fabric takes about a minute for two iterations of ``toy-moe-16`` (sip-ocs
two: its GPUs forward, over 100G ports; the flow-level model puts the five
default fabrics' ten iterations at 289 emulated seconds, ``toy-16``'s at
223).  Results: ``<run>/<fabric>/`` holds each testbed's controller.log,
dumps/ and per-flow iperf3 JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from controllers.ocs_core import TECHNOLOGIES
from controllers.proxy_core import MODES, ControlProxy
from emu.experiments.base import (Context, Experiment, Network, Outcome, build_fabric,
                                  model_calibration, model_kernel_keys)
from emu.schema import Field
from topologies import cost, registry
from topologies.fabric import Fabric, FabricError, ScaleError
from traffic.iterations import steady_time
from traffic.phases import Schedule, build_phases
from traffic.ranks import Parallelism
from emu.live.rlreplay import IterationRun, IterationRunner
from traffic.workload import ComputeTimes, Model, RLConfig, build_iteration

SECTION = "rfabric"
SUMMARY = "RL iterations on FT, RFabric (and FT-OS, ROFT, SiP-OCS): normalized throughput, " \
          "exposed reconfiguration"
FABRICS = ("fattree", "clos", "fattree-os", "roft", "sip-ocs", "rfabric")
FT = ("fattree", "clos")                       # the reference, first one listed
COST_NAME = {"fattree": "clos"}                # the cost model's FT is the folded Clos

TOY = Model("toy-0.5B", params=0.5e9, layers=16, hidden=2048, heads=16, kv_heads=4,
            head_dim=128)
# A small MoE model: 16 layers, hidden 2048, 16 query heads and 4 KV heads of 128;
# 8 routed experts per layer of intermediate size 384 (SwiGLU: gate, up and down
# projections, 3 x 2048 x 384 each), top-2.  Routed experts: 8 x 16 x 3 x 2048 x 384
# = 0.302e9, 60 % of the 0.5e9 parameters; the dense rest, 0.198e9, is attention
# (16 x 2048 x (2 x 2048 + 2 x 512) = 0.168e9) plus embeddings, norms and routers.
TOY_MOE = Model("toy-moe-0.5B", params=0.5e9, layers=16, hidden=2048, heads=16, kv_heads=4,
            head_dim=128, experts=8, top_k=2, expert_params=8 * 16 * 3 * 2048 * 384)


def toy_16(compute: ComputeTimes) -> RLConfig:
    """16 GPUs, 2 per server: Train TP=2 x PP=2 x DP=2 (8 GPUs), Gen TP=2 x DP=4
    (8 GPUs) as 2 prefill + 2 decode replicas; 16 prompts x 4 responses of
    1K + 1K tokens.  TP stays in the server; on the network: PP send/recv, DP
    all-reduce, P/D KV bursts, the response stream and the weight sync."""
    return RLConfig(model=TOY, train=Parallelism(tp=2, pp=2, dp=2),
                    gen=Parallelism(tp=2, dp=4), gpus_per_server=2, batch_prompts=16,
                    responses_per_prompt=4, prompt_len=1024, response_len=1024,
                    pd_prefill=1, pd_decode=1, compute=compute)


def toy_moe_16(compute: ComputeTimes) -> RLConfig:
    """16 GPUs, 2 per server, `TOY_MOE` (MoE, 8 experts, top-2): Train TP=2 x PP=2 x
    DP=2 (8 GPUs, no EP: the experts' gradients reduce over the same DP pairs as
    the dense ones); Gen TP=2 x DP=4 x EP=2 (8 GPUs, one replica per server) as
    2 prefill + 2 decode replicas (P/D 1:1), the 2 decode replicas split by A/F
    1:1 into 1 attention + 1 FFN replica; 16 prompts x 4 responses of 1K + 32
    tokens.  The scenario's default.

    TP stays in the server.  On the network: PP send/recv, the DP all-reduces
    (dense and experts), the P/D KV bursts (prefill -> attention replica), the
    prefill's EP all-to-all between the two prefill replicas (``gen-ep``), the
    A/F M2N (``gen-af``: the attention replica's lanes to the FFN replica's,
    which hold the experts: it is the decode's dispatch and combine), the
    response stream and the weight sync.  gen-ep and gen-af have Small
    windows (Table 1): they ride the EPS and the circuits in place, the
    RFabric proxy sets none for them
    (`controllers.rfabric_templates.KIND_TEMPLATE`).

    Why 32 response tokens: gen-af is per decode step (2 x 16 layers of 128
    KiB per lane), so the decode steps must fit the scenario's ``gen_s``
    (0.1 s) at a decode step's real time, or generation turns network-bound
    for a reason no fabric has.  Assumed, for this toy on H800-class GPUs
    as in ``traffic/decode.toml``, about 3 ms a step: 1.5 ms of vLLM's
    per-step scheduling, sampling and launch (decode.toml's ``fixed_s``);
    0.16 ms reading the weights (64 sequences at top-2 touch all 8 experts:
    the attention side's 0.2e9 and the FFN side's 0.3e9 bf16 parameters,
    each over its 2 lanes at 3.1 TB/s, one after the other); 0.35 ms
    reading the KV (64 sequences x ~1,040 tokens x 32 KiB over 2 lanes);
    ~0.8 ms for the 32 M2N exchanges (3 us each on the wire at 400 Gbit/s,
    the rest latency and synchronisation) and the attention side's
    all-reduces in the server.  32 steps take ~0.09 s, the rest of ``gen_s``
    being the first prefill and its KV burst.  With 1K-token answers (as
    ``toy-16``) the same 0.1 s held 1,024 steps, 0.1 ms each, while their
    M2N stayed 8 GiB an iteration: the toy's artefact, not the fabrics'.
    ``gen_s`` is kept rather than derived from the steps: 1,024 x 3 ms is 3 s
    of Gen an iteration, 30 times ``gen_s``, and the scenario would run for
    about an hour instead of 6 minutes.  Train's sequences
    shrink to 1,056 tokens with ``train_s`` kept: 6 x 0.27e9 active
    parameters x 64 x 1,056 tokens = 1.1e14 FLOP on 8 GPUs is 0.07 s at
    20% of the 990 TFLOP/s bf16 peak.  The prefill's gen-ep (8 GiB, 1K
    prompts) is unchanged: 43 ms per lane at 400 Gbit/s in the 0.1 s."""
    return RLConfig(model=TOY_MOE, train=Parallelism(tp=2, pp=2, dp=2),
                    gen=Parallelism(tp=2, dp=4, ep=2), gpus_per_server=2, batch_prompts=16,
                    responses_per_prompt=4, prompt_len=1024, response_len=32,
                    pd_prefill=1, pd_decode=1, af_attention=1, af_ffn=1, compute=compute)


WORKLOADS = {"toy-moe-16": toy_moe_16, "toy-16": toy_16}

FIELDS = {
    "fabrics": Field(list, ["fattree", "rfabric"], "fabrics to compare, in order; the first "
                     "of fattree/clos is the FT reference", item=str, choices=FABRICS),
    "iterations": Field(int, 2, "RL iterations per fabric", minimum=1, maximum=20),
    "preset": Field(str, "mems", "OCS technology (Table 2) of rfabric and sip-ocs",
                    choices=list(TECHNOLOGIES)),
    "mode": Field(str, "proactive", "control proxy mode on rfabric", choices=list(MODES)),
    "workload": Field(str, "toy-moe-16", "RL workload: toy-moe-16 (MoE, EP and A/F "
                      "riding) or toy-16 (dense)", choices=sorted(WORKLOADS)),
    "train_s": Field(float, 0.08, "Train compute per iteration, real s (x tdf)", minimum=0.0),
    "gen_s": Field(float, 0.1, "Gen compute per iteration, real s (x tdf)", minimum=0.0),
    "optimizer_s": Field(float, 0.03, "optimizer step between the DP all-reduce and the "
                         "weight sync, real s (x tdf)", minimum=0.0),
    "max_ops": Field(int, 4, "replayed operations per communication (coalesced)",
                     minimum=1, maximum=16),
    "cost_gpus": Field(int, 1024, "GPU count of the cost comparison", minimum=256),
    "cost_radix": Field(int, 64, "EPS radix of the cost comparison", choices=[64, 128]),
    "lock_wait_s": Field(float, 600.0, "how long a later fabric waits for the run lock if "
                         "another emulation took it between fabrics", minimum=0.0),
}


# ---------------------------------------------------------------- set-up (pure)
def workload(settings) -> RLConfig:
    compute = ComputeTimes(train_s=settings["train_s"], optimizer_s=settings["optimizer_s"],
                           gen_s=settings["gen_s"])
    return WORKLOADS[settings["workload"]](compute)


def fabric_specs(spec: str, names, preset: str, key: str = "rfabric.fabrics",
                 allowed=FABRICS) -> Dict[str, str]:
    """Spec of each fabric at the GPU count, radix and GPUs per server of ``spec``
    (the rfabric under test), by each fabric's small-build rule
    (`topologies.registry.spec_at`), with ``preset`` as the technology of every
    fabric that has OCS; raises ValueError naming ``key`` and the ``allowed``
    fabrics."""
    reference = registry.build(spec)
    if reference.name != "rfabric":
        raise ValueError(f"fabric.spec must be an rfabric spec (the fabric under test), "
                         f"got {reference.name!r}")
    gpus, params = len(reference.hosts), reference.params
    radix, per_server = params["radix"], params["gpus_per_server"]
    specs = {}
    for name in names:
        if name == "rfabric":
            specs[name] = f"{spec},technology={preset}"
        elif name in allowed:
            ocs = {"technology": preset} if "technology" in registry.parameters(name) else {}
            try:
                specs[name] = registry.spec_at(name, gpus, radix=radix,
                                               gpus_per_server=per_server, small=True, **ocs)
            except ScaleError as exc:
                raise ValueError(exc.naming(key, allowed)) from None
        else:
            raise ValueError(f"{key}: unknown fabric {name!r}; allowed: {', '.join(allowed)}")
    return specs


def build_fabrics(scenario) -> Dict[str, Fabric]:
    s = scenario.section
    specs = fabric_specs(scenario.config["fabric"]["spec"], s["fabrics"], s["preset"])
    gpus = len(registry.build(scenario.config["fabric"]["spec"]).hosts)
    fabrics = {}
    for name, spec in specs.items():
        try:
            fabric = registry.build(spec)
        except FabricError as exc:
            raise ValueError(f"rfabric.fabrics: {name!r} does not build at {gpus} GPUs "
                             f"({spec}): {exc}; allowed: {', '.join(FABRICS)}") from None
        if len(fabric.hosts) != gpus:
            raise ValueError(f"rfabric.fabrics: {name!r} ({spec}) has {len(fabric.hosts)} "
                             f"hosts, not {gpus}; allowed: {', '.join(FABRICS)}")
        fabrics[name] = fabric
    return fabrics


def schedule_for(cfg: RLConfig, hosts: List[str], scale, max_ops: int) -> Schedule:
    """The iteration's phases on ``hosts`` (ranks in order, Train first)."""
    return build_phases(build_iteration(cfg), cfg.rank_map(list(hosts)), scale,
                        max_ops=max_ops)


def reference_ft(names) -> Optional[str]:
    return next((n for n in names if n in FT), None)


def check(scenario) -> None:
    s = scenario.section
    names = s["fabrics"]
    if not names:
        raise ValueError(f"rfabric.fabrics is empty; allowed: {', '.join(FABRICS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"rfabric.fabrics repeats a fabric: {names}")
    fabrics = build_fabrics(scenario)
    cfg = workload(s)
    reference = build_fabric(scenario)
    if len(reference.hosts) != cfg.world:
        raise ValueError(f"workload {s['workload']!r} needs {cfg.world} GPUs but fabric.spec "
                         f"has {len(reference.hosts)} hosts")
    names_seen = {tuple(f.hosts) for f in fabrics.values()}
    if len(names_seen) > 1:
        raise ValueError("rfabric.fabrics: the fabrics name their hosts differently")


# ---------------------------------------------------------------- results (pure)
@dataclass
class FabricRecord:
    name: str
    spec: str
    iterations: List[IterationRun]
    proxy: Optional[ControlProxy] = None
    dark: List[dict] = field(default_factory=list)       # rlreplay dark windows, epoch s
    base: float = 0.0                                     # epoch s of its first iteration

    def times(self) -> List[float]:
        return [it.duration_s for it in self.iterations]

    def steady_s(self) -> float:
        return steady_time(self.times())


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def proxy_rows(record: FabricRecord) -> Dict[int, dict]:
    """The proxy's summary for the iterations that ran (requests it planned for
    an iteration after the last are dropped: they were never sent)."""
    if record.proxy is None:
        return {}
    count = len(record.iterations)
    return {i: row for i, row in record.proxy.summary().items() if i <= count}


def throughput_series(flows, t0: float, bin_s: float = 0.5) -> Dict[str, List[List[float]]]:
    """Mbit/s per flow group (phase kind) per bin, each flow's bytes spread evenly
    over its duration; bins start at ``t0``."""
    bins: Dict[str, Dict[int, float]] = {}
    for flow in flows:
        if flow.status != "ok" or flow.end <= flow.start:
            continue
        per_s = flow.bytes * 8 / 1e6 / (flow.end - flow.start)
        first, last = int((flow.start - t0) // bin_s), int((flow.end - t0) // bin_s)
        series = bins.setdefault(flow.group or "flows", {})
        for index in range(first, last + 1):
            lo, hi = t0 + index * bin_s, t0 + (index + 1) * bin_s
            overlap = min(hi, flow.end) - max(lo, flow.start)
            if overlap > 0:
                series[index] = series.get(index, 0.0) + per_s * overlap / bin_s
    result = {}
    for group, values in bins.items():
        top = max(values)
        result[group] = [[round(i * bin_s, 6), round(values.get(i, 0.0), 6)]
                         for i in range(min(values), top + 2)]    # back to 0 at the end
    return result


def summarize(records: List[FabricRecord], scale, flows, costs: Optional[Dict] = None,
              bin_s: float = 0.5) -> Outcome:
    """Metrics, steps and timeline of a run (see the module docstring)."""
    outcome = Outcome(flows=list(flows))
    if not records:
        return outcome
    t0 = min(r.base for r in records)
    outcome.t0 = t0
    ft = reference_ft([r.name for r in records])
    ft_steady = next((r.steady_s() for r in records if r.name == ft), None)
    metrics: Dict = {}
    fabric_rows, iteration_rows, phase_rows, reconfig_rows = [], [], [], []
    dark, spans = [], []
    for record in records:
        proxy = proxy_rows(record)
        exposed = [it.exposed_s for it in record.iterations]
        steady = record.steady_s()
        normalized = ft_steady / steady if ft_steady and steady else None
        summary = {"iteration_s": steady, "iteration_real_ms": scale.real_seconds(steady) * 1000,
                   "iteration_first_s": record.times()[0],
                   "exposed_reconfig_first_s": exposed[0],
                   "exposed_reconfig_later_s": _mean(exposed[1:]),
                   "normalized_throughput_ratio": normalized}
        if proxy:
            summary["hidden_reconfig_later_s"] = _mean(row["hidden_s"] for i, row in
                                                       proxy.items() if i > 1)
        metrics[record.name] = {k: v for k, v in summary.items() if v is not None}
        fabric_rows.append({"fabric": record.name, "spec": record.spec,
                            "iteration_first_s": record.times()[0], "iteration_steady_s": steady,
                            "normalized_throughput_ratio": normalized,
                            "exposed_first_s": exposed[0],
                            "exposed_later_s": _mean(exposed[1:])})
        for it in record.iterations:
            row = proxy.get(it.iteration, {})
            iteration_rows.append({
                "fabric": record.name, "iteration": it.iteration, "iteration_s": it.duration_s,
                "iteration_real_ms": scale.real_seconds(it.duration_s) * 1000,
                "exposed_s": it.exposed_s, "proxy_exposed_s": row.get("exposed_s"),
                "proxy_hidden_s": row.get("hidden_s"), "reconfigs_count": row.get("reconfigs")})
            outcome.steps.append({"label": f"{record.name} it{it.iteration}",
                                  "duration_s": it.duration_s})
            for p in it.phases:
                phase_rows.append({"fabric": record.name, "iteration": it.iteration,
                                   "phase": p.name, "ready_s": p.ready - it.start,
                                   "start_s": p.start - it.start, "duration_s": p.duration_s,
                                   "stall_s": p.stall_s, "flows_count": len(p.flows)})
                spans.append({"fabric": record.name, "iteration": it.iteration,
                              "phase": p.name, "ready": p.ready - t0, "start": p.start - t0,
                              "end": p.end - t0})
        if record.proxy is not None:
            for occ in record.proxy.occurrences():
                if occ["iteration"] > len(record.iterations):
                    continue
                reconfig_rows.append({"fabric": record.name, "iteration": occ["iteration"],
                                      "phase": occ["phase"], "ocs": " ".join(occ["ocs"]),
                                      "template": occ["template"], "mode": occ["mode"],
                                      "window_s": occ["window_s"], "reconfig_s": occ["reconfig_s"],
                                      "exposed_s": occ["exposed_s"], "hidden_s": occ["hidden_s"]})
        for window in record.dark:
            dark.append({"start": window["torn"] - t0, "end": window["lit"] - t0,
                         "label": f"{record.name} {window['ocs']}"})
    metrics["fabrics"] = fabric_rows
    metrics["iterations"] = iteration_rows
    metrics["phases"] = phase_rows
    if reconfig_rows:
        metrics["reconfigurations"] = reconfig_rows
    if costs:
        metrics["cost"] = costs["rows"]
        for record in records:
            row = next((r for r in costs["rows"] if r["fabric"] == record.name), None)
            if row:
                metrics[record.name]["cost_efficiency_ratio"] = row["cost_efficiency_ratio"]
    outcome.metrics = metrics
    series = throughput_series(flows, t0, bin_s)
    outcome.timeline = {"t0": t0,
                        "series": [{"label": group, "points": points}
                                   for group, points in series.items()],
                        "dark_windows": dark, "phase_spans": spans,
                        "fabric_spans": [{"fabric": r.name, "start": r.base - t0,
                                          "end": r.iterations[-1].end - t0} for r in records]}
    return outcome


def cost_rows(names, normalized: Dict[str, Optional[float]], gpus: int, radix: int) -> Dict:
    """Cost and throughput-weighted cost-efficiency (vs FT) at full scale."""
    model = {n: COST_NAME.get(n, n) for n in names}
    wanted = list(dict.fromkeys(["clos"] + list(model.values())))
    performance: Dict[str, float] = {}
    for name in names:          # fattree and clos are both the cost model's FT: first wins
        if normalized.get(name) is not None:
            performance.setdefault(model[name], normalized[name])
    rows = cost.rfabric_rows([gpus], [radix], wanted, performance=performance)
    out = []
    for name in names:
        row = next(r for r in rows if r["fabric"] == model[name])
        out.append({"fabric": name, "cost_model": row["label"], "gpus_count": gpus,
                    "radix_count": radix, "cost_total_usd": row["cost_total"],
                    "cost_per_gpu_usd": row["cost_per_gpu"],
                    "share_of_gpu_cost_pct": row["share_of_gpu_cost"] * 100,
                    "throughput_ratio": row["throughput"],
                    "cost_efficiency_ratio": row["cost_efficiency"]})
    return {"rows": out}


# ---------------------------------------------------------------- the run
def _fabric_run_parts(spec: str, cfg, scale, settings):
    """What one fabric's iterations need, emulated or modelled: the fabric,
    its phase schedule, and on RFabric its control proxy (None elsewhere)."""
    fabric = registry.build(spec)
    sched = schedule_for(cfg, fabric.hosts, scale, settings["max_ops"])
    proxy = (ControlProxy(fabric, mode=settings["mode"], tdf=scale.tdf)
             if fabric.name == "rfabric" else None)
    return fabric, sched, proxy


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    specs = fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"], s["preset"])
    cfg = workload(s)
    link_mbps = ctx.scenario.config["scale"]["link_mbps"]
    scale = ctx.scale
    records: List[FabricRecord] = []
    flows = []
    for name in s["fabrics"]:
        fabric, sched, proxy = _fabric_run_parts(specs[name], cfg, scale, s)
        ctx.log(f"  {name} ({specs[name]}): {len(sched.phases)} phases "
                f"({', '.join(sched.names())}), planned {sched.iteration_s:.1f} s per iteration"
                + (f", proxy {s['mode']}, {s['preset']}" if proxy else ""))
        with ctx.testbeds.open(name, fabric, scale, lock_wait_s=s["lock_wait_s"]) as bed:
            runner = IterationRunner(bed, sched, ctx.run_dir / name / "flows", link_mbps,
                                     optimizer_s=scale.emu_seconds(cfg.compute.optimizer_s),
                                     proxy=proxy, log=ctx.log)
            runner.run(s["iterations"])
            fabric_flows = runner.flows(name)
            ctx.testbeds.record_flows(fabric_flows)
            dark = runner.dark_windows()
        flows += fabric_flows
        records.append(FabricRecord(name, specs[name], runner.iterations, proxy, dark,
                                    runner.base))
        if proxy is not None and proxy.warnings:
            ctx.log("  proxy: " + "; ".join(proxy.warnings))
    return conclude(records, s, scale, flows)


def conclude(records: List[FabricRecord], s, scale, flows) -> Outcome:
    """Normalized throughput, cost and warnings of the fabrics' records, however
    they were run (emulated or modelled)."""
    ft = reference_ft(s["fabrics"])
    ft_steady = next((r.steady_s() for r in records if r.name == ft), None)
    normalized = {r.name: (ft_steady / r.steady_s() if ft_steady else None) for r in records}
    costs, warnings = None, []
    try:
        costs = cost_rows(s["fabrics"], normalized, s["cost_gpus"], s["cost_radix"])
    except (FabricError, ValueError, KeyError) as exc:
        warnings.append(f"no cost comparison at {s['cost_gpus']} GPUs: {exc}")
    outcome = summarize(records, scale, flows, costs)
    outcome.warnings += warnings
    for record in records:
        if record.proxy is not None:
            outcome.warnings += [f"{record.name} proxy: {w}" for w in record.proxy.warnings]
    if ft is None:
        outcome.warnings.append("no FT (fattree or clos) in rfabric.fabrics: no normalized "
                                "throughput")
    return outcome


def model_run(ctx: Context) -> Outcome:
    """The same comparison on the flow-level model (``testbed.engine = "model"``):
    the same schedule on the same fabrics, with the same proxy, at the
    scenario's emulated scale, so that its figures sit beside an emulated
    run's (`traffic.model.rl`)."""
    from traffic.model.rl import ModelIterationRunner

    s = ctx.settings
    specs = fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"], s["preset"])
    cfg = workload(s)
    scale = ctx.scale
    cal = model_calibration(ctx)
    seed = ctx.scenario.config["testbed"]["ecmp_seed"]
    records: List[FabricRecord] = []
    flows = []
    for name in s["fabrics"]:
        fabric, sched, proxy = _fabric_run_parts(specs[name], cfg, scale, s)
        ctx.log(f"  {name} ({specs[name]}): {len(sched.phases)} phases, modelled")
        kernel_keys = model_kernel_keys(ctx, fabric)
        if kernel_keys is not None and name == s["fabrics"][0]:
            ctx.log("  paths: the kernel routers' multipath hash of each flow's ports "
                    f"(linux data plane, ECMP seed {seed}), as the emulator's")
        runner = ModelIterationRunner(fabric, sched, lambda g: scale.emu_mbps(g) * 1e6, cal,
                                      optimizer_s=scale.emu_seconds(cfg.compute.optimizer_s),
                                      proxy=proxy, ecmp_seed=seed, tdf=scale.tdf, log=ctx.log,
                                      kernel_keys=kernel_keys)
        runner.run(s["iterations"])
        flows += runner.flows(name)
        records.append(FabricRecord(name, specs[name], runner.iterations, proxy,
                                    runner.dark_windows(), runner.base))
    return conclude(records, s, scale, flows)


EXPERIMENT = Experiment(kind="rfabric", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.SERIES, model=model_run)
