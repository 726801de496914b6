"""RFabric Figures 6 and 7 at the text's scale, on the flow-level model.

The RFabric text (section 5) compares FT, FT-OS 3:1, rail-optimized (ROFT),
SiP-OCS and RFabric at 2,048 and 4,096 H800 GPUs on 400 Gbit/s links with
3D MEMS circuits (10 ms), running Qwen2-MoE (Qwen2-57B-A14B) RL, and finds
RFabric close to the non-blocking fat-tree at 1.81x its cost-efficiency.
No machine can emulate that, so this kind runs the *same* RL iteration
(`traffic.workload.qwen2_moe`, laid out by `traffic.phases`, one modelled
flow per flow of each phase's DAG) on the *same* fabric builders at full
scale, on the flow-level model (`traffic.model.rl`), with the same RFabric
control proxy (`controllers.proxy_core`) driving the OCS: iteration 1
profiles (on demand, exposed), later iterations reconfigure ahead.

Reported, per GPU count and fabric: iteration time (real seconds), the
normalized throughput (FT's steady iteration time / the fabric's: Figure 6),
the same for the network-bound phases alone (the DP all-reduce and the
weight sync, where the fabrics differ; compute spreads the other phases'
operations), exposed and hidden reconfiguration per iteration, and the
network cost at that scale (`topologies.cost`) as a share of the GPUs' cost
with the throughput-weighted cost-efficiency against the text's 1.81x
(Figure 7).  A sweep runs RFabric under every Table 2 technology at the
first GPU count and shows where the delay stops being hidden.

The text gives no compute times, so by default they are estimated from the
model and the GPUs (`compute_times`, our assumption, stated in every run):
Train takes 6 x active parameters x tokens of FLOPs at ``mfu`` of an H800's
989 dense BF16 TFLOP/s on the Train GPUs; Gen decodes ``response_len`` steps,
each reading the active weights once from the HBM (3.35 TB/s) of a TP group,
plus the prefill at the same FLOP rate; the optimizer step reads and writes
the Train shards once (16 bytes per parameter, Adam in FP32).  Set
``train_s`` / ``gen_s`` / ``optimizer_s`` to use other times.  The per-flow
rows are aggregated per phase (``phase_flows.csv``: 1.3 million flows a
fabric at 4,096 GPUs).
"""

from __future__ import annotations

import csv
import gc
import itertools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from controllers.ocs_core import TECHNOLOGIES, delay_ms_for
from controllers.proxy_core import MODES, ControlProxy
from emu.experiments.base import Context, Experiment, Network, Outcome
from emu.schema import Field
from topologies import cost, registry
from topologies.fabric import FabricError
from traffic.model import calibration
from traffic.model.phase_arrays import ScheduleArrays
from traffic.iterations import steady_time
from traffic.model.rl import ModelIterationRunner
from traffic.phases import build_phases
from traffic.scale import Scale
from traffic.workload import ComputeTimes, WorkloadError, build_iteration, qwen2_moe

SECTION = "rfabric_scale"
SUMMARY = ("RFabric Figures 6 and 7 at 2,048 and 4,096 GPUs on the flow-level model: "
           "normalized throughput, exposed reconfiguration, cost-efficiency; no emulation")
FABRICS = ("clos", "fattree-os", "roft", "sip-ocs", "rfabric")
FT = "clos"                                   # the non-blocking fat-tree at any GPU count
NETWORK_BOUND = ("train-dp", "weight-sync")
TEXT_COST_EFFICIENCY = 1.81
H800_FLOPS = 989e12           # dense BF16, per GPU
H800_HBM_BPS = 3.35e12        # bytes per second, per GPU

FIELDS = {
    "gpus": Field(list, [2048, 4096], "GPU counts (half Train, half Gen)", item=int,
                  minimum=64),
    "fabrics": Field(list, list(FABRICS), "fabrics to compare; clos is FT, the reference",
                     item=str, choices=list(FABRICS)),
    "preset": Field(str, "mems", "OCS technology of rfabric and sip-ocs (Table 2)",
                    choices=list(TECHNOLOGIES)),
    "sweep": Field(list, list(TECHNOLOGIES), "technologies RFabric is also run with, at the "
                   "first GPU count (empty: no sweep)", item=str, choices=list(TECHNOLOGIES)),
    "mode": Field(str, "proactive", "control proxy mode on rfabric", choices=list(MODES)),
    "iterations": Field(int, 2, "RL iterations per fabric (1: profiling only)", minimum=1,
                        maximum=5),
    "link_gbps": Field(float, 400.0, "line rate of every GPU link, Gbit/s", minimum=1.0),
    "radix": Field(int, 64, "EPS radix of the builds and of the cost model", choices=[64, 128]),
    "max_ops": Field(int, 4, "replayed operations per communication (as the emulator)",
                     minimum=1, maximum=16),
    "train_s": Field(float, 0.0, "Train compute per iteration, s (0: estimated, see "
                     "compute_times)", minimum=0.0),
    "gen_s": Field(float, 0.0, "Gen compute per iteration, s (0: estimated)", minimum=0.0),
    "optimizer_s": Field(float, 0.0, "optimizer step, s (0: estimated)", minimum=0.0),
    "mfu": Field(float, 0.4, "model FLOP utilisation of the compute estimate", minimum=0.01,
                 maximum=1.0),
    "coalesce": Field(float, 0.01, "a flow within this share of its own transfer of the "
                      "next drain drains with it: fewer events, each flow at most this "
                      "share early (0: exact; traffic.model.engine)", minimum=0.0,
                      maximum=0.1),
    "jobs": Field(int, 0, "fabrics modelled at once, one process each (0: one per CPU "
                  "core; 1: in this process)", minimum=0),
}


def compute_times(cfg, mfu: float) -> ComputeTimes:
    """Compute per iteration, estimated (see the module docstring), real seconds."""
    model = cfg.model
    active = model.dense_params + (model.expert_params * model.top_k / model.experts
                                   if model.moe else 0.0)
    tokens = cfg.seqs * cfg.seq_len
    train = 6 * active * tokens / (cfg.train_gpus * H800_FLOPS * mfu)
    prefill = 2 * active * cfg.seqs * cfg.prompt_len / (cfg.gen_gpus * H800_FLOPS * mfu)
    step = active * cfg.bytes_per_param / (cfg.gen.tp * H800_HBM_BPS)
    gen = prefill + cfg.response_len * step
    optimizer = 16 * model.params / cfg.train_gpus / H800_HBM_BPS
    return ComputeTimes(train_s=train, gen_s=gen, optimizer_s=optimizer)


def _config(settings, gpus: int):
    estimate = compute_times(qwen2_moe(gpus), settings["mfu"])
    compute = ComputeTimes(train_s=settings["train_s"] or estimate.train_s,
                           gen_s=settings["gen_s"] or estimate.gen_s,
                           optimizer_s=settings["optimizer_s"] or estimate.optimizer_s)
    return qwen2_moe(gpus, compute=compute)


def fabric_spec(name: str, gpus: int, settings, technology: Optional[str] = None) -> str:
    ocs = {"technology": technology or settings["preset"]} \
        if "technology" in registry.parameters(name) else {}
    return registry.spec_at(name, gpus, radix=settings["radix"], gpus_per_server=8, **ocs)


def check(scenario) -> None:
    s = scenario.section
    if not s["gpus"] or not s["fabrics"]:
        raise ValueError("rfabric_scale.gpus and rfabric_scale.fabrics must not be empty")
    if len(set(s["fabrics"])) != len(s["fabrics"]):
        raise ValueError(f"rfabric_scale.fabrics repeats a fabric: {s['fabrics']}")
    for gpus in s["gpus"]:
        try:
            _config(s, gpus).validate()
        except (WorkloadError, ValueError) as exc:
            raise ValueError(f"rfabric_scale.gpus: {gpus}: {exc}") from None
        sweep = ["rfabric"] if s["sweep"] and gpus == s["gpus"][0] else []
        for name in list(dict.fromkeys(list(s["fabrics"]) + sweep)):
            try:
                fabric = registry.build(fabric_spec(name, gpus, s))
            except FabricError as exc:
                raise ValueError(f"rfabric_scale.fabrics: {name!r} does not build at {gpus} "
                                 f"GPUs with radix {s['radix']}: {exc}; allowed: "
                                 f"{', '.join(FABRICS)}") from None
            if len(fabric.hosts) != gpus:
                raise ValueError(f"rfabric_scale.gpus: {name!r} builds {len(fabric.hosts)} "
                                 f"GPUs, not {gpus}, with radix {s['radix']} (a Train and a "
                                 "Gen PoD of whole radix/2 x 8-GPU servers: at least 512 "
                                 "GPUs at radix 64)")


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def model_fabric(fabric, sched, cfg, settings, cal, log,
                 arrays: Optional[ScheduleArrays] = None) -> dict:
    """One fabric's iterations on the model; a row of figures (real seconds).
    ``arrays``: the schedule's flows as arrays, when several fabrics share them."""
    proxy = (ControlProxy(fabric, mode=settings["mode"], tdf=1.0,
                          layerwise=settings.get("layerwise", False))
             if fabric.name == "rfabric" else None)
    started = time.time()
    runner = ModelIterationRunner(fabric, sched, lambda gbps: gbps * 1e9, cal,
                                  optimizer_s=cfg.compute.optimizer_s, proxy=proxy,
                                  tdf=1.0, log=log, keep_flows=False,
                                  coalesce=settings["coalesce"], arrays=arrays)
    runner.run(settings["iterations"])
    times = [it.duration_s for it in runner.iterations]
    exposed = [it.exposed_s for it in runner.iterations]
    phase_s: Dict[str, float] = {}
    for kind in NETWORK_BOUND:
        durations = [p.duration_s for it in runner.iterations[1:] or runner.iterations
                     for p in it.phases if p.kind == kind]
        if durations:
            phase_s[kind] = sum(durations) / len(durations)
    hidden = None
    if proxy is not None:
        rows = {i: r for i, r in proxy.summary().items() if i <= len(runner.iterations)}
        hidden = _mean(r["hidden_s"] for i, r in rows.items() if i > 1)
    phases = [{"iteration": it.iteration, "phase": p.name, "ready_s": p.ready - it.start,
               "start_s": p.start - it.start, "duration_s": p.duration_s,
               "stall_s": p.stall_s, "flows_count": p.flows_count}
              for it in runner.iterations for p in it.phases]
    return {"iteration_s": steady_time(times), "iteration_first_s": times[0],
            "exposed_first_s": exposed[0], "exposed_later_s": _mean(exposed[1:]),
            "hidden_later_s": hidden, "network_phase_s": sum(phase_s.values()),
            "phase_s": phase_s, "flows_count": runner.sim.n_flows,
            "events_count": runner.sim.events_processed,
            "model_wall_s": time.time() - started, "phases": phases}


# Each fabric's modelling time at 4,096 GPUs, in seconds (bench/model --perf,
# 2026-11-27 afternoon, the medians of three runs of the five fabrics in two
# processes: SiP-OCS 22.3, ROFT 18.2, RFabric 17.3, FT 9.1, FT-OS 8.7; the VM's
# speed drifts by up to twice within an hour, the ratios less): the order the
# worker processes take the fabrics in is chosen by them.  A fabric not listed
# counts as the median.
MODEL_COST_S = {"sip-ocs": 22.5, "roft": 18.0, "rfabric": 17.5, "clos": 9.0,
                "fattree-os": 8.5}


def hand_out_order(names: Sequence[str], jobs: int) -> List[int]:
    """The order to hand fabrics out to ``jobs`` workers, each taking the next
    one when it is free, that ends the soonest by `MODEL_COST_S` (every order
    is tried for up to 7 fabrics, the longest first otherwise; the first such
    order in the given one wins a tie).  Handing the longest out first is not
    always the best (by the times of 2026-11-27 morning it ended at 58 s where
    another order ended at 57 s); by today's it is: SiP-OCS beside FT and FT-OS,
    ROFT beside RFabric, 40 s each way."""
    known = sorted(MODEL_COST_S.values())
    cost = [MODEL_COST_S.get(n.split(",")[0], known[len(known) // 2]) for n in names]

    def makespan(order) -> float:
        free = [0.0] * max(1, jobs)
        for index in order:
            slot = free.index(min(free))
            free[slot] += cost[index]
        return max(free)

    if len(names) > 7:
        return sorted(range(len(names)), key=lambda i: -cost[i])
    return list(min(itertools.permutations(range(len(names))), key=makespan))


# What the worker processes read, set before they are forked: an iteration's
# schedule (1.4 million flows at 4,096 GPUs) is then shared copy-on-write, not
# pickled to each of them.
_SHARED: dict = {}


def _model_in_worker(spec: str) -> dict:
    sched, cfg, settings, cal, log, arrays = _SHARED["args"]
    name = spec.split(",")[0]
    return model_fabric(registry.build(spec), sched, cfg, settings, cal,
                        lambda message: log(f"    {name}: {message.strip()}"), arrays)


def model_fabrics(specs: Sequence[str], sched, cfg, settings, cal, jobs: int,
                  log) -> Iterator[Tuple[int, dict]]:
    """(index, row) of each fabric spec, as each is done: in ``jobs`` forked
    processes (the fabrics are independent), or here with ``jobs`` <= 1.
    They are handed out in the order that ends the soonest (`hand_out_order`).
    The schedule's flows are turned into arrays once, here, for all of them."""
    # The schedule is over a million objects that live as long as this call:
    # frozen, the collector no longer rescans them (here, or in the forked
    # workers, where touching each one's header would also copy every page
    # that holds one).
    frozen = gc.isenabled()
    if frozen:
        gc.freeze()
    try:
        yield from _model_fabrics(specs, sched, cfg, settings, cal, jobs, log)
    finally:
        if frozen:
            gc.unfreeze()


def _model_fabrics(specs, sched, cfg, settings, cal, jobs, log):
    arrays = ScheduleArrays(sched).prepare(settings["iterations"])
    if jobs <= 1 or len(specs) <= 1:
        for index, spec in enumerate(specs):
            yield index, model_fabric(registry.build(spec), sched, cfg, settings, cal, log,
                                      arrays)
        return
    order = hand_out_order(specs, min(jobs, len(specs)))
    _SHARED["args"] = (sched, cfg, settings, cal, log, arrays)
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(specs)),
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_model_in_worker, specs[i]): i for i in order}
            for future in as_completed(futures):
                yield futures[future], future.result()
    finally:
        _SHARED.clear()


def run(ctx: Context) -> Outcome:
    s = ctx.settings
    cal = calibration.load().for_real_world(s["link_gbps"])
    outcome = Outcome()
    figure6, sweep, phase_rows, compute_rows = [], [], [], []
    # The sweep's run of the preset is Figure 6's RFabric run: modelled once.
    sweep_only = [tech for tech in s["sweep"]
                  if not (tech == s["preset"] and "rfabric" in s["fabrics"])]
    total = len(s["gpus"]) * len(s["fabrics"]) + len(sweep_only)
    done = 0
    for index, gpus in enumerate(s["gpus"]):
        cfg = _config(s, gpus)
        started = time.time()
        hosts = [f"h{i + 1}" for i in range(cfg.world)]
        sched = build_phases(build_iteration(cfg), cfg.rank_map(hosts), Scale(),
                             max_ops=s["max_ops"], link_gbps=s["link_gbps"])
        flows = sum(len(p.dag.flows) for p in sched.phases)
        ctx.log(f"{gpus:,} GPUs: {flows:,} flows per iteration in {len(sched.phases)} phases "
                f"(built in {time.time() - started:.1f} s); compute: Train "
                f"{cfg.compute.train_s:.2f} s, Gen {cfg.compute.gen_s:.2f} s, optimizer "
                f"{cfg.compute.optimizer_s:.3f} s")
        compute_rows.append({"gpus_count": gpus, "train_s": cfg.compute.train_s,
                             "gen_s": cfg.compute.gen_s,
                             "optimizer_s": cfg.compute.optimizer_s,
                             "estimated": not (s["train_s"] and s["gen_s"])})
        rows: Dict[str, dict] = {}
        runs = [(name, s["preset"]) for name in s["fabrics"]]
        if index == 0:
            runs += [("rfabric", tech) for tech in s["sweep"]]
        specs = [fabric_spec(name, gpus, s, tech) for name, tech in runs]
        unique = list(dict.fromkeys(specs))
        jobs = s["jobs"] or os.cpu_count() or 1
        if jobs > 1:
            ctx.log(f"  modelling {len(unique)} fabrics, {min(jobs, len(unique))} at a time")
        results: Dict[str, dict] = {}
        for position, row in model_fabrics(unique, sched, cfg, s, cal, jobs, ctx.log):
            done += 1
            ctx.log(f"  [{done}/{total}] {unique[position]}: iteration {row['iteration_s']:.2f} s "
                    f"(first {row['iteration_first_s']:.2f} s), exposed "
                    f"{row['exposed_first_s']:.3f} / {row['exposed_later_s'] or 0:.3f} s, "
                    f"{row['flows_count']:,} flows, {row['events_count']:,} events, "
                    f"model {row['model_wall_s']:.1f} s")
            results[unique[position]] = row
        for position, (name, tech) in enumerate(runs):
            spec = specs[position]
            row = dict(results[spec], gpus_count=gpus, fabric=name, spec=spec, technology=tech)
            phases = row.pop("phases")
            if specs.index(spec) == position:       # a spec's phases once
                phase_rows += [dict(phase, gpus_count=gpus, fabric=name, technology=tech)
                               for phase in phases]
            if (name, tech) in [(n, s["preset"]) for n in s["fabrics"]] and name not in rows:
                rows[name] = row
            else:
                sweep.append(row)
        ft = rows.get(FT)
        performance = {}
        for name, row in rows.items():
            row["normalized_throughput_ratio"] = (ft["iteration_s"] / row["iteration_s"]
                                                  if ft else None)
            row["normalized_network_ratio"] = (ft["network_phase_s"] / row["network_phase_s"]
                                               if ft and row["network_phase_s"] else None)
            if row["normalized_throughput_ratio"] is not None:
                performance[name] = row["normalized_throughput_ratio"]
        try:
            costs = {r["fabric"]: r for r in cost.rfabric_rows([gpus], [s["radix"]],
                                                               list(rows), performance=performance)}
        except (FabricError, ValueError, KeyError) as exc:
            costs = {}
            outcome.warnings.append(f"no cost at {gpus} GPUs: {exc}")
        for name, row in rows.items():
            c = costs.get(name, {})
            row.update(cost_total_usd=c.get("cost_total"),
                       share_of_gpu_cost_pct=(c["share_of_gpu_cost"] * 100
                                              if c.get("share_of_gpu_cost") is not None else None),
                       cost_efficiency_ratio=c.get("cost_efficiency"))
            figure6.append(row)
        for row in sweep:
            if row["gpus_count"] == gpus:
                row["normalized_throughput_ratio"] = (ft["iteration_s"] / row["iteration_s"]
                                                      if ft else None)
                row["delay_ms"] = delay_ms_for(row["technology"])
    _write_phase_csv(ctx.run_dir, phase_rows)
    # Figure 7: the network's cost as a share of the GPUs', 1K-32K GPUs, both
    # radices (drawn by the report like the cost scenario's), each fabric's
    # cost weighted by its throughput measured here at the largest scale.
    largest = {r["fabric"]: r["normalized_throughput_ratio"] for r in figure6
               if r["gpus_count"] == max(s["gpus"]) and r["normalized_throughput_ratio"]}
    network_cost = [{"radix": row["radix"], "gpus": row["gpus"], "fabric": row["fabric"],
                     "label": row["label"], "cost_million_usd": row["cost_total"] / 1e6,
                     "cost_per_gpu_usd": row["cost_per_gpu"],
                     "share_of_gpu_cost_pct": 100 * row["share_of_gpu_cost"],
                     "cost_efficiency_ratio": row["cost_efficiency"]}
                    for row in cost.rfabric_rows(performance=largest)
                    if row["fabric"] in s["fabrics"]]
    metrics = {"figure6": figure6, "sweep": sweep, "compute": compute_rows,
               "network_cost": network_cost, "text_cost_efficiency_ratio": TEXT_COST_EFFICIENCY,
               "calibration": cal.to_dict()}
    for row in figure6:
        if row["fabric"] == "rfabric" and row.get("cost_efficiency_ratio"):
            metrics[f"rfabric_{row['gpus_count']}_cost_efficiency_ratio"] = \
                row["cost_efficiency_ratio"]
    outcome.metrics = metrics
    return outcome


def _write_phase_csv(run_dir, rows: List[dict]) -> None:
    if not rows:
        return
    path = run_dir / "phase_flows.csv"
    fields = ["gpus_count", "fabric", "technology", "iteration", "phase", "flows_count",
              "ready_s", "start_s", "duration_s", "stall_s"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


EXPERIMENT = Experiment(kind="rfabric-scale", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.NONE)
