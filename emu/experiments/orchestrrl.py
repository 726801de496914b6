"""OrchestrRL's rhythms: generation that switches parallelism and rebalances, on RFabric.

OrchestrRL (the third source text, only its abstract) changes the generation
instances' tensor parallelism inside a generation step and moves requests off
stragglers, and RFabric reconfigures its circuits for generation under each
parallelism configuration.  This kind replays one-step asynchronous RL
iterations whose generation step is `traffic.generation.simulate`'s, under
each scheduling policy of ``policies``:

* ``static``: every instance keeps its TP for the whole step;
* ``switch``: when the running sequences fall below a share of the batch,
  instances merge into wider TP groups (one server each -> two servers), and
  the in-flight requests' KV moves to the new groups' lanes;
* ``switch+rebalance``: also moves requests off stragglers (KV migration).

The policy, the decode-time formula and the response-length distribution are
the testbed's own assumptions, fixed before any network run in
``traffic/decode.toml`` and quoted in every result.  Each switch opens a
``gen-config`` phase (its KV moves, then its instances' decode TP all-reduces
across servers); each rebalance is a ``gen-migrate`` phase.  On ``rfabric``
the control proxy (`controllers.proxy_core`) gives each TP configuration its
own circuit template on the Gen PoD's aggregation OCS, profiles them in
iteration 1 (on demand, exposed) and puts them in place ahead of each switch
from iteration 2.

``af`` (default ``"1:1"``, the testbed's assumption) splits every instance
into attention lanes (the KV, attention) and FFN lanes (the experts):
`traffic.generation` (module docstring) keeps the decode time and the lane
roles across a widening, moves KV between attention lanes only, and turns
each segment's decode traffic into the attention lanes' all-reduce and the
M2N between the two roles, a ``gen-af{k}-tp{t}`` phase after the
segment's ``gen-config``.  The experts living on the FFN lanes, there is no
expert all-to-all (gen-ep) then.  ``af = "off"`` gives the whole-instance
TP and Qwen2-57B-A14B's gen-ep all-to-all instead.  gen-af, gen-ep and the
rebalance's KV moves have Small windows: they ride whatever is lit.

With ``layerwise``, training runs layer by layer (RFabric section 4.3:
`traffic.phases.build_phases`): ring attention's CP and the MoE block's EP
alternate through the forward and backward passes, and the proxy gives each
layer type circuits sized to it on the Train PoD's aggregation OCS
(`controllers.rfabric_templates`, ``train-layer``), profiled in iteration 1
and put in ahead of each layer from iteration 2; reported per layer-type
change (``metrics.layers``) and drawn in ``orchestrrl_layers.png``.  On by
default; ``layerwise = false`` replays Train's phases whole.  On the emulator a
change per layer takes the live control plane longer than a layer's compute,
so the layers' reconfiguration stays exposed in every iteration there
(README, "Layer-wise training").

Reported per fabric and policy: step and iteration time, throughput relative
to ``static`` on the same fabric next to the text's "up to 1.40x", the
compute-only gain of the same policy (an infinitely fast network: the
generation model's own step time), the share of that gain the network keeps,
the bytes moved by switches and rebalances, and the reconfiguration exposed
and hidden per switch.  ``model_gpus`` runs the same workload rule (one
server per instance, widened to two; the same sequences per Gen GPU) on the
flow-level model at the texts' scale, Qwen2-57B-A14B on 8-GPU servers,
non-blocking fat-tree (Clos) and RFabric.

Runs (as root)::

  .venv/bin/python -m emu.run orchestrrl
  .venv/bin/python -m emu.run orchestrrl --set orchestrrl.policies=static,switch+rebalance
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from controllers.ocs_core import TECHNOLOGIES
from controllers.proxy_core import MODES, ControlProxy
from emu.experiments.base import (Context, Experiment, Network, Outcome, build_fabric,
                                  model_calibration, model_kernel_keys)
from emu.experiments.rfabric import fabric_specs, throughput_series
from emu.schema import Field
from topologies import registry
from topologies.rfabric import shape_of as rfabric_shape
from traffic import generation as gen
from traffic.iterations import IterationRun, steady_time
from traffic.phases import LAYER_KINDS, Schedule, build_phases
from traffic.ranks import Parallelism
from traffic.workload import (QWEN2_57B_A14B, ComputeTimes, RLConfig, WorkloadError,
                              build_iteration)

SECTION = "orchestrrl"
SUMMARY = ("OrchestrRL's dynamic generation (TP switches, straggler rebalancing) on RFabric "
           "and a fat-tree: throughput per policy, compute-only vs with the network, "
           "exposed reconfiguration per switch")
FABRICS = ("fattree", "clos", "rfabric")
FT = ("fattree", "clos")
TEXT_GAIN = 1.40               # OrchestrRL's abstract: "up to 1.40x throughput"
SCALE_FABRICS = ("clos", "rfabric")

FIELDS = {
    "fabrics": Field(list, ["fattree", "rfabric"], "fabrics to compare; the first of "
                     "fattree/clos is the non-blocking reference", item=str, choices=FABRICS),
    "policies": Field(list, list(gen.POLICIES), "generation scheduling policies; static is "
                      "the reference", item=str, choices=list(gen.POLICIES)),
    "iterations": Field(int, 2, "RL iterations per fabric and policy (1: profiling only)",
                        minimum=1, maximum=10),
    "preset": Field(str, "mems", "OCS technology of rfabric (Table 2)",
                    choices=list(TECHNOLOGIES)),
    "mode": Field(str, "proactive", "control proxy mode on rfabric", choices=list(MODES)),
    "batch_per_gpu": Field(int, 4, "sequences per Gen GPU in a generation step", minimum=1,
                           maximum=64),
    "seed": Field(int, 0, "seed of the response lengths", minimum=0),
    "af": Field(str, "1:1", "attention:FFN lanes of each generation instance (A/F "
                "disaggregation inside an instance, the testbed's assumption; its M2N, "
                "gen-af, replaces gen-ep and rides); 'off' or '0': whole-instance TP",
                check=lambda text: gen.parse_af(text) and None),
    "prompt_len": Field(int, 256, "prompt tokens per sequence", minimum=1),
    "train_s": Field(float, 0.5, "Train compute per iteration, real s (x tdf)", minimum=0.0),
    "optimizer_s": Field(float, 0.05, "optimizer step, real s (x tdf)", minimum=0.0),
    "max_ops": Field(int, 4, "replayed operations per communication (coalesced); also "
                     "the layer blocks of the layer-wise Train phases", minimum=1, maximum=16),
    "layerwise": Field(bool, True, "Train's CP ring and EP all-to-all layer by layer, "
                       "with circuits per layer type on rfabric (RFabric section 4.3); false: "
                       "Train's phases whole"),
    "model_gpus": Field(list, [2048, 4096], "GPU counts of the flow-level model runs "
                        "(empty: none)", item=int, minimum=64),
    "model_radix": Field(int, 64, "EPS radix at the model's scale", choices=[64, 128]),
    "coalesce": Field(float, 0.01, "the model's rate coalescing at scale", minimum=0.0),
    "mfu": Field(float, 0.4, "model FLOP utilisation for Train compute at scale", minimum=0.01,
                 maximum=1.0),
    "lock_wait_s": Field(float, 600.0, "how long a later fabric waits for the run lock",
                         minimum=0.0),
}


# ---------------------------------------------------------------- set-up (pure)
def policy_params(gpus_per_server: int) -> gen.PolicyParams:
    """The data file's policy with the testbed's TP rule: an instance starts as
    one server and widens to two, so that a switch crosses servers at any scale."""
    _, _, params = gen.load_defaults()
    return dataclasses.replace(params, tp=gpus_per_server, switch_tp=2 * gpus_per_server)


def emulated_config(settings, gpus: int, gpus_per_server: int,
                    compute: Optional[ComputeTimes] = None) -> RLConfig:
    """Qwen2-57B-A14B (its 14B active parameters are what the decode model's
    weights read stands for; MoE, so both clusters have an expert all-to-all).

    Half Train: TP = a server, PP = 2, DP = EP = 2 (the MoE block's
    all-to-all between the two replicas), and context parallelism over the
    rest with ring attention (``cp_comm = "p2p"``): at 48 GPUs both of
    section 4.3's layer types cross ToRs, each with its own partners (a CP
    ring runs through three servers of a stage, EP pairs a server with its
    twin in the other replica); at 32 a CP pair shares its ToR and rides.
    CP is there for its traffic pattern: at these sequence lengths it saves
    no memory.  Ring attention, because Ulysses would need the 14 heads of
    a TP rank to divide by CP (3 at 48 GPUs).  Half Gen:
    TP = a server, EP = 2: its expert all-to-all has Small windows and rides.
    Attention-FFN disaggregation is not set here (``af_attention`` splits
    whole replicas, which cannot switch TP one instance at a time): the
    scenario's ``af`` splits each instance's lanes instead, in the
    generation step (`generation_step`), and its M2N replaces the
    all-to-all there.
    """
    if gpus % (8 * gpus_per_server):
        raise WorkloadError(f"orchestrrl: {gpus} GPUs must split into Train and Gen halves "
                            f"of whole groups of four {gpus_per_server}-GPU servers (Train: "
                            "PP 2 x DP 2)")
    half = gpus // 2
    lengths, _, _ = gen.load_defaults()
    train = Parallelism(tp=gpus_per_server, pp=2, cp=half // (4 * gpus_per_server), ep=2,
                        dp=2)
    return RLConfig(model=QWEN2_57B_A14B, train=train, cp_comm="p2p",
                    gen=Parallelism(tp=gpus_per_server, ep=2, dp=0), train_gpus=half,
                    gen_gpus=half, gpus_per_server=gpus_per_server,
                    batch_prompts=half * settings["batch_per_gpu"], responses_per_prompt=1,
                    prompt_len=settings["prompt_len"], response_len=lengths.median,
                    compute=compute or ComputeTimes(train_s=settings["train_s"],
                                                    optimizer_s=settings["optimizer_s"],
                                                    gen_s=0.0))


def af_split(settings) -> Optional[gen.AFSplit]:
    """The settings' ``af`` (None: no A/F), its errors naming ``orchestrrl.af``."""
    return gen.parse_af(settings["af"], f"{SECTION}.af")


def check_af(af: Optional[gen.AFSplit], gpus_per_server: int) -> None:
    """Both TPs of `policy_params` must split into whole attention and FFN lanes."""
    if af is None:
        return
    params = policy_params(gpus_per_server)
    for name in ("tp", "switch_tp"):
        af.lanes(getattr(params, name), f"{SECTION}.af",
                 f" ({name}: {gpus_per_server}-GPU servers)")


def generation_step(cfg: RLConfig, policy: str, seed: int,
                    af: Optional[gen.AFSplit] = None) -> gen.GenerationStep:
    """The step of ``policy``; ``af`` splits the instances into attention and
    FFN lanes (None: whole-instance TP)."""
    lengths, decode, _ = gen.load_defaults()
    check_af(af, cfg.gpus_per_server)
    return gen.simulate(cfg.gen.world, cfg.seqs, policy, policy_params(cfg.gpus_per_server),
                        decode, lengths, cfg.model, seed=seed, prompt_len=cfg.prompt_len,
                        act_bytes=cfg.act_bytes, bytes_per_param=cfg.bytes_per_param, af=af)


def schedule_for(cfg: RLConfig, step: gen.GenerationStep, hosts, scale, max_ops: int,
                 pod_of=None, layerwise: bool = False) -> Schedule:
    return build_phases(build_iteration(cfg), cfg.rank_map(list(hosts)), scale,
                        max_ops=max_ops, generation=step, pod_of=pod_of, layerwise=layerwise)


def iteration_compute_s(cfg: RLConfig, step: gen.GenerationStep) -> float:
    """The iteration with an infinitely fast network: Gen's step beside Train
    and its optimizer step (one-step asynchronous), the weight sync free."""
    return max(cfg.compute.train_s + cfg.compute.optimizer_s, step.compute_s)


def check(scenario) -> None:
    s = scenario.section
    for key in ("fabrics", "policies"):
        if not s[key]:
            raise ValueError(f"orchestrrl.{key} is empty")
        if len(set(s[key])) != len(s[key]):
            raise ValueError(f"orchestrrl.{key} repeats an entry: {s[key]}")
    if "static" not in s["policies"]:
        raise ValueError("orchestrrl.policies must include 'static' (the reference); "
                         f"allowed: {', '.join(gen.POLICIES)}")
    fabric = build_fabric(scenario)
    if fabric.name != "rfabric":
        raise ValueError(f"fabric.spec must be an rfabric spec (the fabric under test), got "
                         f"{fabric.name!r}")
    shape = rfabric_shape(fabric)
    if shape.tors > 2 and shape.agg < 2:
        # A TP configuration's circuits keep one agg uplink per ToR to join the PoD.
        raise ValueError(f"fabric.spec: the Gen PoD's {shape.tors} ToRs have {shape.agg} agg "
                         "uplink each; orchestrrl needs 2 or more (fewer core_uplinks, or a "
                         "larger radix)")
    specs = fabric_specs(scenario.config["fabric"]["spec"], s["fabrics"], s["preset"],
                         f"{SECTION}.fabrics", FABRICS)
    per_server = fabric.params["gpus_per_server"]
    try:
        af = af_split(s)
        if s["model_gpus"]:
            check_af(af, 8)               # the model's scale: 8-GPU servers (`scale_config`)
        cfg = emulated_config(s, len(fabric.hosts), per_server)
        for policy in s["policies"]:
            generation_step(cfg, policy, s["seed"], af)
    except (WorkloadError, gen.GenerationError) as exc:
        raise ValueError(f"orchestrrl: {exc}") from None
    for name, spec in specs.items():
        if len(registry.build(spec).hosts) != len(fabric.hosts):
            raise ValueError(f"orchestrrl.fabrics: {name!r} ({spec}) does not build at "
                             f"{len(fabric.hosts)} GPUs; allowed: {', '.join(FABRICS)}")


# ---------------------------------------------------------------- results (pure)
@dataclass
class PolicyRecord:
    fabric: str
    spec: str
    policy: str
    step: gen.GenerationStep
    cfg: RLConfig
    iterations: List[IterationRun]
    proxy: Optional[ControlProxy] = None
    dark: List[dict] = field(default_factory=list)
    base: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.fabric}/{self.policy}"

    def times(self) -> List[float]:
        return [it.duration_s for it in self.iterations]

    def steady_s(self) -> float:
        return steady_time(self.times())

    def step_times(self) -> List[float]:
        """Per iteration: from its start to the weight sync being ready (the
        generation step done, or Train and its optimizer step if later)."""
        out = []
        for it in self.iterations:
            sync = [p for p in it.phases if p.kind == "weight-sync"]
            out.append((sync[0].ready if sync else it.end) - it.start)
        return out


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _reconfig_rows(record: PolicyRecord, kinds) -> List[dict]:
    """Per occurrence of a phase of ``kinds`` (the kind the proxy got with the
    phase) that got new circuits: the reconfiguration exposed and hidden."""
    if record.proxy is None:
        return []
    count = len(record.iterations)
    return [{"fabric": record.fabric, "policy": record.policy, "iteration": o["iteration"],
             "phase": o["phase"], "kind": o["kind"], "ocs": o.get("ocs", []),
             "template": o["template"], "mode": o["mode"], "reconfig_s": o["reconfig_s"],
             "exposed_s": o["exposed_s"], "hidden_s": o["hidden_s"]}
            for o in record.proxy.occurrences()
            if o["iteration"] <= count and o["kind"] in kinds]


def switch_rows(record: PolicyRecord) -> List[dict]:
    """Per switch (a gen-config phase occurrence that got new circuits)."""
    return _reconfig_rows(record, ("gen-config",))


def layer_rows(record: PolicyRecord) -> List[dict]:
    """Per layer-type change of the Train circuits (a layer-wise train-cp or
    train-ep phase occurrence that got new circuits)."""
    return _reconfig_rows(record, LAYER_KINDS)


def _per_iteration(rows: List[dict], count: int) -> Dict[int, float]:
    return {i: sum(r["exposed_s"] for r in rows if r["iteration"] == i)
            for i in range(1, count + 1)}


def summarize(records: List[PolicyRecord], scale, flows, scale_rows: Optional[List[dict]] = None,
              bin_s: float = 0.5) -> Outcome:
    outcome = Outcome(flows=list(flows))
    if not records:
        return outcome
    t0 = min(r.base for r in records)
    outcome.t0 = t0
    static = {r.fabric: r for r in records if r.policy == "static"}
    rows, switches, layers, spans, dark, steps_rows = [], [], [], [], [], []
    metrics: Dict = {}
    for record in records:
        ref = static.get(record.fabric)
        steady = record.steady_s()
        gain = ref.steady_s() / steady if ref and steady else None
        compute = iteration_compute_s(record.cfg, record.step)
        compute_gain = (iteration_compute_s(ref.cfg, ref.step) / compute) if ref else None
        kept = ((gain - 1.0) / (compute_gain - 1.0)
                if gain is not None and compute_gain and abs(compute_gain - 1.0) > 1e-9
                else None)
        step_times = record.step_times()
        own, own_layers = switch_rows(record), layer_rows(record)
        switches += own
        layers += own_layers
        exposed = _per_iteration(own, len(record.iterations))
        layer_exposed = _per_iteration(own_layers, len(record.iterations))
        row = {"fabric": record.fabric, "policy": record.policy,
               "iteration_first_s": record.times()[0], "iteration_s": steady,
               "step_s": _mean(step_times[1:] or step_times),
               "iteration_real_ms": scale.real_seconds(steady) * 1000,
               "throughput_vs_static_ratio": gain,
               "compute_only_gain_ratio": compute_gain,
               "gain_kept_by_network_ratio": kept,
               "step_compute_real_s": record.step.compute_s,
               "switches_count": sum(e.kind == "switch" for e in record.step.events),
               "rebalances_count": sum(e.kind == "rebalance" for e in record.step.events),
               "switch_moved_real_mb": record.step.moved_bytes("switch") / 1e6,
               "rebalance_moved_real_mb": record.step.moved_bytes("rebalance") / 1e6,
               "af_m2n_real_mb": record.step.af_bytes() / 1e6,
               "exposed_switch_first_s": exposed.get(1, 0.0),
               "exposed_switch_later_s": _mean(exposed[i] for i in exposed if i > 1),
               "layer_reconfigs_first_count": sum(r["iteration"] == 1 for r in own_layers),
               "exposed_layers_first_s": layer_exposed.get(1, 0.0),
               "exposed_layers_later_s": _mean(layer_exposed[i] for i in layer_exposed
                                               if i > 1),
               "exposed_first_s": record.iterations[0].exposed_s,
               "exposed_later_s": _mean(it.exposed_s for it in record.iterations[1:])}
        rows.append(row)
        metrics[record.label] = {k: v for k, v in row.items()
                                 if v is not None and k not in ("fabric", "policy")}
        for it in record.iterations:
            outcome.steps.append({"label": f"{record.label} it{it.iteration}",
                                  "duration_s": it.duration_s})
            for p in it.phases:
                spans.append({"fabric": record.label, "iteration": it.iteration,
                              "phase": p.name, "kind": p.kind, "ready": p.ready - t0,
                              "start": p.start - t0, "end": p.end - t0})
        for window in record.dark:
            dark.append({"start": window["torn"] - t0, "end": window["lit"] - t0,
                         "label": f"{record.label} {window['ocs']}"})
        steps_rows.append({"fabric": record.fabric, "policy": record.policy,
                           **record.step.to_dict()})
    metrics["policies"] = rows
    if switches:
        metrics["switches"] = switches
    if layers:
        metrics["layers"] = layers
    metrics["generation"] = steps_rows
    metrics["text_gain_ratio"] = TEXT_GAIN
    lengths, decode, _ = gen.load_defaults()
    params = policy_params(records[0].cfg.gpus_per_server)     # as the runs used it
    metrics["assumptions"] = {"lengths": dataclasses.asdict(lengths),
                              "decode": dataclasses.asdict(decode),
                              "policy": dataclasses.asdict(params),
                              "af": None if records[0].step.af is None
                              else str(records[0].step.af),
                              "source": "traffic/decode.toml (the testbed's assumptions: "
                                        "OrchestrRL's text gives none)"}
    if scale_rows:
        metrics["at_scale"] = scale_rows
    outcome.metrics = metrics
    series = throughput_series(flows, t0, bin_s)
    outcome.timeline = {"t0": t0,
                        "series": [{"label": g, "points": pts} for g, pts in series.items()],
                        "dark_windows": dark, "phase_spans": spans,
                        "fabric_spans": [{"fabric": r.label, "start": r.base - t0,
                                          "end": r.iterations[-1].end - t0} for r in records]}
    return outcome


# ---------------------------------------------------------------- the model at scale
def scale_config(gpus: int, settings) -> RLConfig:
    """Qwen2-57B-A14B at ``gpus`` (half Train, half Gen) on 8-GPU servers, with
    the emulated run's rule for Gen: instances of one server (TP 8) widening
    to two, EP 2.  Train keeps `traffic.workload.qwen2_moe`'s TP 4,
    PP 2, EP 4 without CP: a CP spanning half the replicas, as at 48 GPUs,
    would be hundreds of ranks here; its EP all-to-all is the layer type
    that gets circuits."""
    from emu.experiments.rfabric_scale import compute_times
    from traffic.workload import qwen2_moe

    lengths, _, _ = gen.load_defaults()
    base = qwen2_moe(gpus, gen=Parallelism(tp=8, ep=2, dp=0), gen_gpus=gpus // 2,
                     batch_prompts=gpus // 2 * settings["batch_per_gpu"],
                     responses_per_prompt=1, prompt_len=settings["prompt_len"],
                     response_len=lengths.median)
    estimate = compute_times(base, settings["mfu"])
    return dataclasses.replace(base, compute=ComputeTimes(train_s=estimate.train_s,
                                                          optimizer_s=estimate.optimizer_s,
                                                          gen_s=0.0))


def model_at_scale(settings, log) -> List[dict]:
    """Every policy on Clos and RFabric at each of ``model_gpus`` (real units)."""
    from emu.experiments.rfabric_scale import model_fabric
    from traffic.model import calibration
    from traffic.scale import Scale

    rows: List[dict] = []
    for gpus in settings["model_gpus"]:
        cfg = scale_config(gpus, settings)
        fabrics = {}
        for name in SCALE_FABRICS:
            ocs = {"technology": settings["preset"]} \
                if "technology" in registry.parameters(name) else {}
            spec = registry.spec_at(name, gpus, radix=settings["model_radix"],
                                    gpus_per_server=8, **ocs)
            fabrics[name] = registry.build(spec)
        cal = calibration.load().for_real_world(400.0)
        static_s: Dict[str, float] = {}
        for policy in settings["policies"]:
            step = generation_step(cfg, policy, settings["seed"], af_split(settings))
            compute = iteration_compute_s(cfg, step)
            for name, fabric in fabrics.items():
                sched = schedule_for(cfg, step, fabric.hosts, Scale(), settings["max_ops"],
                                     layerwise=settings["layerwise"])
                log(f"  model {gpus} GPUs, {name}, {policy}: {len(sched.phases)} phases")
                figures = model_fabric(fabric, sched, cfg, {"mode": settings["mode"],
                                                            "layerwise": settings["layerwise"],
                                                            "coalesce": settings["coalesce"],
                                                            "iterations": settings["iterations"]},
                                       cal, log)
                if policy == "static":
                    static_s[name] = figures["iteration_s"]
                rows.append({"gpus_count": gpus, "fabric": name, "policy": policy,
                             "iteration_s": figures["iteration_s"],
                             "compute_only_s": compute,
                             "exposed_later_s": figures["exposed_later_s"],
                             "switch_moved_gb": step.moved_bytes("switch") / 1e9,
                             "rebalance_moved_gb": step.moved_bytes("rebalance") / 1e9,
                             "af_m2n_gb": step.af_bytes() / 1e9})
        for row in rows:
            if row["gpus_count"] == gpus:
                ref = static_s.get(row["fabric"])
                row["throughput_vs_static_ratio"] = (ref / row["iteration_s"]
                                                     if ref and row["iteration_s"] else None)
                ref_compute = next((r["compute_only_s"] for r in rows
                                    if r["gpus_count"] == gpus and r["policy"] == "static"),
                                   None)
                row["compute_only_gain_ratio"] = (ref_compute / row["compute_only_s"]
                                                  if ref_compute else None)
    return rows


# ---------------------------------------------------------------- the run
def _parts(name: str, spec: str, cfg: RLConfig, step, scale, settings):
    fabric = registry.build(spec)
    sched = schedule_for(cfg, step, fabric.hosts, scale, settings["max_ops"],
                         layerwise=settings["layerwise"])
    proxy = (ControlProxy(fabric, mode=settings["mode"], tdf=scale.tdf,
                          layerwise=settings["layerwise"])
             if fabric.name == "rfabric" else None)
    return fabric, sched, proxy


def run(ctx: Context) -> Outcome:
    from emu.live.rlreplay import IterationRunner

    s = ctx.settings
    specs = fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"], s["preset"],
                         f"{SECTION}.fabrics", FABRICS)
    cfg = emulated_config(s, len(ctx.fabric.hosts), ctx.fabric.params["gpus_per_server"])
    link_mbps = ctx.scenario.config["scale"]["link_mbps"]
    scale = ctx.scale
    steps = {p: generation_step(cfg, p, s["seed"], af_split(s)) for p in s["policies"]}
    for policy, step in steps.items():
        ctx.log(f"  {policy}: generation step {step.compute_s:.3f} s real compute, "
                f"{len(step.events)} events, {step.moved_bytes() / 1e6:.1f} MB moved")
    records: List[PolicyRecord] = []
    flows = []
    for name in s["fabrics"]:
        with ctx.testbeds.open(name, registry.build(specs[name]), scale,
                               lock_wait_s=s["lock_wait_s"]) as bed:
            for policy in s["policies"]:
                fabric, sched, proxy = _parts(name, specs[name], cfg, steps[policy], scale, s)
                ctx.log(f"  {name} / {policy}: {len(sched.phases)} phases "
                        f"({', '.join(sched.names())})")
                label = f"{name}-{policy.replace('+', '-')}"
                runner = IterationRunner(bed, sched, ctx.run_dir / name / policy / "flows",
                                         link_mbps,
                                         optimizer_s=scale.emu_seconds(cfg.compute.optimizer_s),
                                         proxy=proxy, log=ctx.log)
                runner.run(s["iterations"])
                policy_flows = runner.flows(label)
                ctx.testbeds.record_flows(policy_flows)
                flows += policy_flows
                records.append(PolicyRecord(name, specs[name], policy, steps[policy], cfg,
                                            runner.iterations, proxy, runner.dark_windows(),
                                            runner.base))
    return _conclude(records, s, scale, flows, ctx.log)


def _conclude(records, s, scale, flows, log) -> Outcome:
    scale_rows = model_at_scale(s, log) if s["model_gpus"] else None
    outcome = summarize(records, scale, flows, scale_rows)
    for record in records:
        if record.proxy is not None:
            outcome.warnings += [f"{record.label} proxy: {w}" for w in record.proxy.warnings]
    return outcome


def model_run(ctx: Context) -> Outcome:
    """The same comparison on the flow-level model at the emulated scale."""
    from traffic.model.rl import ModelIterationRunner

    s = ctx.settings
    specs = fabric_specs(ctx.scenario.config["fabric"]["spec"], s["fabrics"], s["preset"],
                         f"{SECTION}.fabrics", FABRICS)
    cfg = emulated_config(s, len(ctx.fabric.hosts), ctx.fabric.params["gpus_per_server"])
    scale = ctx.scale
    cal = model_calibration(ctx)
    seed = ctx.scenario.config["testbed"]["ecmp_seed"]
    records: List[PolicyRecord] = []
    flows = []
    for name in s["fabrics"]:
        for policy in s["policies"]:
            step = generation_step(cfg, policy, s["seed"], af_split(s))
            fabric, sched, proxy = _parts(name, specs[name], cfg, step, scale, s)
            runner = ModelIterationRunner(fabric, sched, lambda g: scale.emu_mbps(g) * 1e6, cal,
                                          optimizer_s=scale.emu_seconds(cfg.compute.optimizer_s),
                                          proxy=proxy, ecmp_seed=seed, tdf=scale.tdf,
                                          log=ctx.log,
                                          kernel_keys=model_kernel_keys(ctx, fabric))
            runner.run(s["iterations"])
            flows += runner.flows(f"{name}-{policy.replace('+', '-')}")
            records.append(PolicyRecord(name, specs[name], policy, step, cfg,
                                        runner.iterations, proxy, runner.dark_windows(),
                                        runner.base))
    return _conclude(records, s, scale, flows, ctx.log)


EXPERIMENT = Experiment(kind="orchestrrl", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.SERIES, model=model_run)
