"""Run a scenario: ``sudo python -m emu.run SCENARIO [--out DIR] [--set k=v ...]``.

``--list`` shows the scenarios; ``--check`` validates a scenario without
running it.  Every run writes ``results/<scenario>-<timestamp>/`` with
result.json, flows.csv, captures/, report.md and PNG plots.  Kinds that
only compute (``cost``, ``fabrics``) need no root and no fabric, and write
their own tables, plots and exports instead of flows and captures.

Exit codes: 0 done (warnings are printed), 1 the run failed, 2 bad input,
3 another emulation is running, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional

from emu import report, results, scenario as scenarios
from emu.experiments.base import Context, Network, Outcome, build_fabric, scale_for
from emu.fidelity import assess, fidelity_rows
from emu.live.dataplane import Choice, DataplaneError, check_congestion, choose, cluster_choice
from emu.live.cluster import Cluster, ClusterError
from emu.live import interrupts
from emu.live.feed import EVENTS_FILE, RunFeed
from emu.live.state import AlreadyRunning
from emu.results_space import ResultsFolderError, check_results_folder, estimate_run_bytes
from emu.schema import ScenarioError
from topologies.partition import PlacementError, place_fabric

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUSY, EXIT_INTERRUPTED = 1, 2, 3, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m emu.run", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", help="built-in scenario name or a .toml path")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--check", action="store_true", help="validate the scenario and exit")
    parser.add_argument("--out", default="results", help="parent folder of the run's results")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a scenario key (section.key=value, or key=value "
                             "when unique); lists as a,b,c")
    parser.add_argument("--cli", action="store_true",
                        help="open the Mininet CLI with fabric commands on the scenario's "
                             "fabric instead of running the scenario")
    parser.add_argument("--web", action="store_true",
                        help="watch the run in a browser: serves a live page on 127.0.0.1 "
                             "and prints its address (with its token)")
    parser.add_argument("--web-port", type=int, default=0, metavar="PORT",
                        help="the web view's port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--cli-script", metavar="FILE",
                        help="with --cli: run the commands of FILE, then exit")
    return parser


def list_scenarios() -> str:
    names = scenarios.builtin_names()
    width = max(len(n) for n in names)
    return "\n".join(f"{name:<{width}}  {scenarios.describe(name)}" for name in names)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    # A shell starts background jobs with SIGINT ignored, and Python then
    # keeps it ignored: a run must still stop, and clean up, on SIGINT.
    signal.signal(signal.SIGINT, interrupts.raising(lambda signum: KeyboardInterrupt()))
    if args.list:
        print(list_scenarios())
        return 0
    if not args.scenario:
        print("emu.run: name a scenario (see --list)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        scenario = scenarios.load(args.scenario, args.set)
    except ScenarioError as exc:
        print(f"emu.run: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.cli_script and not Path(args.cli_script).is_file():
        print(f"emu.run: --cli-script {args.cli_script}: no such file", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.check:
        print(f"{scenario.where}: ok ({scenario.kind})")
        return 0
    experiment = scenario.experiment
    if not 0 <= args.web_port <= 65535:
        print(f"emu.run: --web-port {args.web_port}: must be 0-65535", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.web and not scenario.emulates:
        print(f"emu.run: {scenario.where}: --web watches an emulated network; this scenario "
              "builds none (its engine is the model, or it only computes)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.cli and scenario.models:
        print(f"emu.run: {scenario.where}: --cli needs a testbed; testbed.engine is 'model' "
              "(set engine=emulate)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.cli and not experiment.needs_emulation:
        print(f"emu.run: scenario {scenario.name!r} builds no network; --cli needs one "
              "(try ocs-reconfig or allreduce)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if scenario.emulates and os.geteuid() != 0:
        print(f"emu.run: scenario {scenario.name!r} builds a network and needs root: "
              f"sudo {sys.executable} -m emu.run {args.scenario}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if scenario.emulates:
        try:
            choice = dataplane_of(scenario)
        except DataplaneError as exc:
            print(f"emu.run: {scenario.where}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"{scenario.name}: {choice.describe()}; TCP {scenario.config['testbed']['congestion']}")
        if scenario.config["testbed"]["servers"]:
            try:
                check_cluster(scenario)
            except (ClusterError, PlacementError) as exc:
                print(f"emu.run: {scenario.where}: {exc}", file=sys.stderr)
                return EXIT_BAD_INPUT
    try:
        # Before the run folder, the lock or the testbed exist: a folder that
        # cannot take the run fails it now, not in the middle of its captures.
        check_results_folder(Path(args.out), estimate_run_bytes(scenario))
    except ResultsFolderError as exc:
        print(f"emu.run: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    web = WebSetting(args.web, args.web_port)
    if args.cli:
        return lab(scenario, Path(args.out), args.cli_script, web)
    return execute(scenario, Path(args.out), web)


@dataclass(frozen=True)
class WebSetting:
    on: bool = False
    port: int = 0


@contextmanager
def watched(run_dir: Path, web: WebSetting) -> Iterator[RunFeed]:
    """The run's feed (``events.jsonl``), and the web view on it if asked for."""
    feed = RunFeed(run_dir / EVENTS_FILE)
    view = unsubscribe = None
    try:
        if web.on:
            from emu.view.server import serve_live

            view, _, unsubscribe = serve_live(feed.subscribe, port=web.port,
                                              title=f"emu.run {run_dir.name}")
            print(f"  web view: {view.url}")
            print(f"    (on this machine only; from another one: ssh -L {view.port}:127.0.0.1:"
                  f"{view.port} THIS-HOST, then open the same address)", flush=True)
        yield feed
    finally:
        if view is not None:
            unsubscribe()
            view.stop()
            print(f"  web view stopped; replay: python -m emu.view {run_dir}")
        feed.close()


def dataplane_of(scenario) -> Choice:
    """The scenario's data plane on this machine, and a check of its TCP congestion
    control; raises DataplaneError before anything is created."""
    settings = scenario.config["testbed"]
    choice = cluster_choice(settings["dataplane"]) if settings["servers"] \
        else choose(settings["dataplane"])
    check_congestion(settings["congestion"])
    return choice


def check_cluster(scenario) -> None:
    """A cluster run's placement of the scenario's fabric, then every server
    (`emu.live.cluster.Cluster.preflight`), before the run folder or anything
    else exists; raises ClusterError or PlacementError naming what fails."""
    settings = scenario.config["testbed"]
    placement = place_fabric(build_fabric(scenario), len(settings["servers"]))
    Cluster(settings["servers"], settings["ssh_config"], log=lambda m: None).preflight()
    print(f"  servers: {', '.join(settings['servers'])}; {placement.describe()}")


def lab(scenario, out: Path, script: Optional[str], web: WebSetting = WebSetting()) -> int:
    """The scenario's fabric with its controller, driven from the CLI."""
    from mininet.log import setLogLevel

    from emu.live.cli import FabricCLI
    from emu.live.testbed import Testbed

    fabric = build_fabric(scenario)
    scale = scale_for(scenario, fabric)
    run_dir = results.new_run_dir(out, f"{scenario.name}-cli")
    try:
        settings = scenario.config["testbed"]
        with watched(run_dir, web) as feed, \
                Testbed(fabric, scale, run_dir, description=f"emu.run {scenario.name} --cli",
                        dataplane=dataplane_of(scenario).dataplane,
                        congestion=settings["congestion"], panel=settings["panel"],
                        ecmp_seed=settings["ecmp_seed"], feed=feed, servers=settings["servers"],
                        ssh_config=settings["ssh_config"]) as bed:
            setLogLevel("output")  # Mininet's own commands print at this level
            print(f"{fabric.name}: {len(fabric.hosts)} hosts; type help, or exit to leave")
            FabricCLI(bed, script=script)
    except AlreadyRunning as exc:
        print(f"emu.run: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


def execute(scenario, out: Path, web: WebSetting = WebSetting()) -> int:
    fabric = build_fabric(scenario)
    scale = None if fabric is None else scale_for(scenario, fabric)
    run_dir = results.new_run_dir(out, scenario.name)
    print(f"{scenario.name}: {scenario.description}")
    result = {"scenario": scenario.name, "description": scenario.description,
              "status": "running", "started": results.now_iso(), "config": scenario.config,
              "warnings": []}
    if scenario.emulates:
        # A browser polling the page takes CPU from the run: figures are
        # compared only between runs that say the same here.
        result["web_view"] = web.on
    if fabric is not None:
        print(f"  fabric {scenario.config['fabric']['spec']}: {len(fabric.hosts)} hosts, "
              f"{len(fabric.eps_switches)} packet switches, {len(fabric.ocs_switches)} OCS; "
              f"{scale.describe()}")
        result["scale"] = scale.to_dict()
        result["fabric"] = {"spec": scenario.config["fabric"]["spec"],
                            "hosts": len(fabric.hosts), "switches": len(fabric.eps_switches),
                            "ocs": len(fabric.ocs_switches),
                            "link_mbps": scenario.config["scale"]["link_mbps"]}
    print(f"  results -> {run_dir}")
    started = time.time()
    outcome, code = Outcome(), 0
    try:
        if scenario.models:
            outcome = _model(scenario, fabric, scale, run_dir, result)
        elif scenario.experiment.needs_emulation:
            with watched(run_dir, web) as feed:
                try:
                    outcome = _emulate(scenario, fabric, scale, run_dir, result, feed)
                finally:
                    for warning in result.get("fidelity", {}).get("warnings", []):
                        feed.emit("warning", text=warning)
                    feed.emit("run", status="ended")
        else:
            outcome = scenario.experiment.run(Context(scenario, fabric, scale, run_dir))
        result["status"] = "ok"
    except AlreadyRunning as exc:
        print(f"emu.run: {exc}", file=sys.stderr)
        result["status"], code = "refused: another emulation is running", EXIT_BUSY
    except KeyboardInterrupt:
        print("\nemu.run: interrupted; everything the run created has been removed",
              file=sys.stderr)
        result["status"], code = "interrupted", EXIT_INTERRUPTED
    except Exception as exc:  # reported in result.json and on stderr, then exit 1
        traceback.print_exc()
        result["status"], code = f"failed: {type(exc).__name__}: {exc}", EXIT_FAILED
    result["duration_s"] = time.time() - started
    try:
        with interrupts.deferred():
            _write(run_dir, result, outcome)
            _summary(run_dir, result)
    except KeyboardInterrupt:
        # A signal held while the results were written: they are whole.
        if code == 0:
            result["status"], code = "interrupted", EXIT_INTERRUPTED
            results.write_result(run_dir, result)
    return code


def _emulate(scenario, fabric, scale, run_dir, result, feed: Optional[RunFeed] = None) -> Outcome:
    """Run an experiment that needs a network.  Its testbeds, the one the runner
    opens here (``Network.ONE``) or those it opens itself (``Network.SERIES``),
    all go through one `TestbedSeries`: lock, CPU sampling, dumps and
    controller checks are the same for every testbed, and so is the
    fidelity check of the flows each one recorded."""
    from emu.live.series import TestbedSeries

    experiment = scenario.experiment
    settings = scenario.config["testbed"]
    series = TestbedSeries(run_dir, f"emu.run {scenario.name}",
                           dataplane=dataplane_of(scenario).dataplane,
                           congestion=settings["congestion"], panel=settings["panel"],
                           ecmp_seed=settings["ecmp_seed"], feed=feed,
                           servers=settings["servers"], ssh_config=settings["ssh_config"],
                           cpu_alarm_pct=scenario.config["fidelity"]["saturation_pct"])
    ctx = Context(scenario, fabric, scale, run_dir, testbeds=series)
    try:
        if experiment.network is Network.SERIES:
            outcome = experiment.run(ctx)
        else:
            with series.open(None, fabric, scale) as bed:
                ctx.bed = bed
                outcome = experiment.run(ctx)
                series.record_flows(outcome.flows)
    finally:
        result.update(series.result_fields())
        result["warnings"] = list(result.get("warnings", [])) + series.warnings
    rows = [row for recorded in series.recorded
            for row in fidelity_rows(recorded.fabric, recorded.scale, recorded.flows,
                                     prefix=f"{recorded.label}:" if recorded.label else "",
                                     paths=recorded.paths, ports=recorded.ports)]
    settings = scenario.config["fidelity"]
    result["fidelity"] = assess(rows, series.cpu_summary(),
                                saturation_pct=settings["saturation_pct"],
                                softirq_pct=settings["softirq_pct"],
                                goodput_floor=settings["goodput_floor"],
                                drops=series.drops_summary(),
                                kernel_forwarding=dataplane_of(scenario).dataplane == "linux",
                                servers_cpu=series.servers_cpu())
    return outcome


def _model(scenario, fabric, scale, run_dir, result) -> Outcome:
    """Run an experiment on the flow-level model: no testbed, no root; the
    result says so and records the model's frozen calibration."""
    from emu.experiments.base import load_calibration

    print(f"  engine model: the flow-level model (traffic.model), not an emulation")
    result["mode"] = "model"
    result["model"] = {"calibration": load_calibration(scenario).to_dict(),
                       "calibration_file": scenario.config.get("testbed", {}).get(
                           "model_calibration") or "traffic/model/calibration.toml"}
    return scenario.experiment.model(Context(scenario, fabric, scale, run_dir))


def _write(run_dir: Path, result: dict, outcome: Outcome) -> None:
    result["metrics"] = outcome.metrics
    if outcome.timeline:
        result["timeline"] = outcome.timeline
    if outcome.steps:
        result["steps"] = outcome.steps
    result["warnings"] = list(result.get("warnings", [])) + outcome.warnings
    if outcome.flows:
        results.write_flows(run_dir, outcome.flows, outcome.t0)
    results.write_result(run_dir, result)
    try:
        report.write_report(run_dir)
    except Exception as exc:  # the raw results are written; say why the report is missing
        print(f"emu.run: report.md could not be written: {exc}", file=sys.stderr)


def _summary(run_dir: Path, result: dict) -> None:
    warnings = result["warnings"] + result.get("fidelity", {}).get("warnings", [])
    for key, value in (result.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            print(f"  {key} = {value:.4g}")
    print(f"{result['scenario']}: {result['status']} in {result['duration_s']:.1f} s; "
          f"report: {run_dir / 'report.md'} (and report.html)")
    for warning in warnings:
        print(f"  WARNING: {warning}")


if __name__ == "__main__":
    sys.exit(main())
