"""The interactive lab: Mininet's CLI on a scenario's fabric, plus fabric commands.

    sudo .venv/bin/python -m emu.run ocs-reconfig --cli

Every Mininet command works (``pingall``, ``h1 ping h2``, ``iperf``...), and:

    ocs                          list the OCS, their circuits and technology
    ocs set OCS a-b c-d ...      reconfigure, with the injected delay
    ocs preset OCS NAME [MS]     change the technology (NAME custom takes MS)
    ocs rotor SLOT_US GUARD_US   the rotor fabric's rotors cycle (real us, dilated)
    ocs stop                     the schedule stops; the circuits stay as listed
    fabric                       the fabric's summary and counts
    route SRC DST                the current shortest path(s)
    fail SWITCH | fail U V       a switch or a link goes down; the controller reroutes
    restore SWITCH | restore U V back up
    load [SECONDS]               per-link rates from the switches' port counters
    replay NAME ARGS             run a traffic pattern and print its result
                                 (allreduce, broadcast, kvburst, pairs, flow)

``help COMMAND`` explains each.  A wrong argument prints why and the CLI
goes on.  ``--cli-script FILE`` runs the commands of FILE instead (tests,
walkthroughs).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import time
from collections import Counter
from pathlib import Path
from typing import List, Tuple

from mininet.cli import CLI

from controllers.control import ControlError
from controllers.ocs_core import TECHNOLOGIES
from topologies import routing
from topologies.fabric import FabricError
from traffic import collectives
from traffic.flows import Flow, FlowDag, ring_allreduce
from emu.live.loadlog import link_rates, sent_bytes, wired_ports
from emu.live.replay import Replayer

MB = 1_000_000
PATTERNS = ("allreduce", "broadcast", "kvburst", "pairs", "flow")


class UsageError(ValueError):
    """A command was given wrong arguments; the message says what is expected."""


def _guarded(command):
    """A bad argument or a refused request prints a message; the CLI lives on."""
    @functools.wraps(command)
    def wrapper(self, line):
        try:
            return command(self, line)
        except (UsageError, FabricError, ControlError, ValueError, KeyError,
                RuntimeError) as exc:  # a failed command must not end the lab
            print(f"*** {command.__name__[3:]}: {exc}")
        return None
    return wrapper


def parse_circuits(words: List[str]) -> List[Tuple[int, int]]:
    circuits = []
    for word in words:
        match = re.fullmatch(r"(\d+)-(\d+)", word)
        if not match:
            raise UsageError(f"{word!r} is not a circuit; write port pairs like 1-4")
        circuits.append((int(match.group(1)), int(match.group(2))))
    return circuits


def failure_links(fabric, words: List[str]) -> List[Tuple[str, str]]:
    """The links ``fail``/``restore`` act on: every link of one switch, or one link."""
    if len(words) == 1 and words[0] in fabric.switches:
        return sorted(tuple(sorted((words[0], peer)))
                      for peer in set(fabric.graph.neighbors(words[0])))
    if len(words) == 2 and fabric.graph.has_edge(*words):
        return [tuple(sorted(words))]
    if len(words) == 2 and all(w in fabric.graph for w in words):
        raise UsageError(f"no link {words[0]}-{words[1]} in the fabric")
    raise UsageError(f"usage: fail SWITCH | fail NODE NODE (a link), e.g. fail "
                     f"{fabric.switches[0]}; switches are {', '.join(fabric.switches)}")


class FabricCLI(CLI):
    prompt = "fabric> "

    def __init__(self, bed, script: str = None):
        self.bed = bed
        self.fabric = bed.fabric
        self.replays = 0
        if script is None:
            super().__init__(bed.net)
            return
        # Mininet's CLI polls its stdin while a host command runs; a script
        # run gets a pipe that stays open and silent, whatever the caller's
        # stdin is (a closed or /dev/null stdin would end or spin that loop).
        read_fd, write_fd = os.pipe()
        try:
            with os.fdopen(read_fd) as silent:
                super().__init__(bed.net, stdin=silent, script=script)
        finally:
            os.close(write_fd)

    def onecmd(self, line):
        """Lines starting with # are comments (Mininet's source skips precmd)."""
        if line.lstrip().startswith("#"):
            return False
        return super().onecmd(line)

    # ------------------------------------------------------------ helpers
    def _hosts(self, text: str) -> List[str]:
        hosts = [h for h in text.split(",") if h]
        unknown = [h for h in hosts if h not in self.fabric.hosts]
        if unknown:
            raise UsageError(f"unknown host(s) {unknown}; hosts are "
                             f"{self.fabric.hosts[0]}..{self.fabric.hosts[-1]}")
        return hosts

    # ------------------------------------------------------------ ocs
    @_guarded
    def do_ocs(self, line):
        """ocs                      list every OCS with its technology and circuits
        ocs set OCS a-b c-d ...  replace OCS's circuits (port pairs), with its delay
        ocs preset OCS NAME [MS] set the technology: rotornet, mems, piezo, lc,
                                 robotic, or custom with a delay in ms
        ocs rotor SLOT_US GUARD_US  on the rotor fabric, every rotor steps through
                                 its matchings: slots of SLOT_US, each dark for
                                 GUARD_US first (real microseconds, dilated by the
                                 scale's tdf; the kernel's BPF panel keeps time)
        ocs stop                 stop the schedule: each OCS back to its listed circuits"""
        words = line.split()
        if not words:
            state = self.bed.control.call("state")
            if not state["circuits"]:
                print("this fabric has no OCS")
            for ocs, circuits in sorted(state["circuits"].items()):
                tech = state["technology"][ocs]
                radix = self.fabric.graph.nodes[ocs]["radix"]
                pairs = " ".join(f"{a}-{b}" for a, b in circuits) or "(all dark)"
                delay = f", {tech['delay_ms']} ms" if tech["name"] == "custom" else ""
                print(f"{ocs}: {tech['name']}{delay}, radix {radix}: {pairs}")
            if state.get("schedule"):
                running = state["schedule"]
                print(f"a schedule runs on {', '.join(running['ocs'])}: {running['slots']} "
                      f"slots of {running['slot_emulated_s'] * 1000:g} ms, each dark "
                      f"{running['guard_emulated_s'] * 1000:g} ms first (the circuits above "
                      "hold when it stops)")
            return
        if words[0] == "rotor" and len(words) == 3:
            try:
                slot_us, guard_us = float(words[1]), float(words[2])
            except ValueError:
                raise UsageError("usage: ocs rotor SLOT_US GUARD_US (numbers, real us)") \
                    from None
            reply = self.bed.schedule({"rotor": True, "slot_us": slot_us,
                                       "guard_us": guard_us})
            print(f"rotors cycling: {reply['slots']} slots of "
                  f"{reply['slot_emulated_s'] * 1000:g} ms emulated, each dark "
                  f"{reply['guard_emulated_s'] * 1000:g} ms first (duty "
                  f"{reply['duty_cycle']:.2f})")
            return
        if words == ["stop"]:
            reply = self.bed.stop_schedule()
            print("schedule stopped" if reply["stopped"] else "no schedule runs")
            return
        if words[0] == "set" and len(words) >= 2:
            result = self.bed.reconfigure(words[1], parse_circuits(words[2:]), timeout_s=600)
            plan, stamps = result["plan"], result["timestamps"]
            print(f"{words[1]}: tore {len(plan['tear'])}, lit {len(plan['light'])}, kept "
                  f"{len(plan['keep'])} circuit(s); injected {plan['delay_emulated_ms']:.2f} ms, "
                  f"dark {result['dark_s'] * 1000:.2f} ms, whole change "
                  f"{(stamps['routes_restored'] - stamps['start']) * 1000:.2f} ms")
            return
        if words[0] == "preset" and len(words) in (3, 4):
            if (len(words) == 4) != (words[2] == "custom"):
                raise UsageError("give a delay in ms with 'custom', and only with it: "
                                 "ocs preset o1 custom 30 | ocs preset o1 mems")
            delay = float(words[3]) if len(words) == 4 else None
            result = self.bed.control.call("preset", ocs=words[1], technology=words[2],
                                           delay_ms=delay)
            print(f"{words[1]}: {words[2]}, {result['delay_real_ms']:g} ms real, "
                  f"{result['delay_emulated_ms']:g} ms emulated")
            return
        raise UsageError("usage: ocs | ocs set OCS a-b ... | ocs preset OCS NAME [MS] | "
                         "ocs rotor SLOT_US GUARD_US | ocs stop; "
                         f"presets: {', '.join(TECHNOLOGIES)}, custom")

    # ------------------------------------------------------------ fabric, route
    @_guarded
    def do_fabric(self, line):
        """fabric   the fabric's parameters and its counts: hosts, switches per role,
                 links per rate, OCS radix and circuits"""
        fabric = self.fabric
        params = ", ".join(f"{k}={v}" for k, v in fabric.params.items())
        print(f"{fabric.name} ({params})")
        roles = Counter(d["role"] for _, d in fabric.graph.nodes(data=True) if d["kind"] != "host")
        print(f"  hosts: {len(fabric.hosts)}; switches: "
              + ", ".join(f"{n} {r}" for r, n in sorted(roles.items())))
        rates = Counter(d["gbps"] for _, _, d in fabric.links())
        print("  links: " + ", ".join(
            f"{n} x {g:g} Gbit/s real ({self.bed.scale.emu_mbps(g):g} Mbit/s emulated)"
            for g, n in sorted(rates.items())))
        for ocs in fabric.ocs_switches:
            print(f"  {ocs}: radix {fabric.graph.nodes[ocs]['radix']}, "
                  f"{len(fabric.circuits[ocs])} circuit(s) lit")
        print(f"  scale: {self.bed.scale.describe()}; data plane {self.bed.dataplane.kind}"
              + (f" ({self.bed.dataplane.datapath} datapath)" if self.bed.dataplane.datapath
                 else ""))

    @_guarded
    def do_route(self, line):
        """route SRC DST   the current shortest path(s) from SRC to DST over the static
                        links that are up and the lit circuits (ECMP spreads flows
                        over all)"""
        words = line.split()
        if len(words) != 2:
            raise UsageError("usage: route SRC DST, e.g. route h1 h4")
        src, dst = self._hosts(",".join(words))
        logical = routing.base_graph(self.fabric)
        for u, v in self.bed.control.call("state")["down_links"]:
            while logical.has_edge(u, v):
                logical.remove_edge(u, v)
        paths = routing.shortest_paths(logical, src, dst)
        if not paths:
            print(f"{src} cannot reach {dst} over the current circuits and links")
            return
        for path in paths:
            hops = [path[0]]
            for u, v in zip(path, path[1:]):
                via = [f"{d['ocs']} {d['circuit'][0]}-{d['circuit'][1]}"
                       for d in logical[u][v].values() if "ocs" in d]
                hops.append(f"({', '.join(via)}) -> {v}" if via else f"-> {v}")
            print(" ".join(hops))
        print(f"{len(paths)} equal-cost path(s) of {len(paths[0]) - 1} hops")

    # ------------------------------------------------------------ failures
    def _set_links(self, line: str, up: bool) -> None:
        links = failure_links(self.fabric, line.split())
        took = self.bed.set_links(links, up)
        what = line.strip().replace(" ", "-")
        print(f"{what} {'up' if up else 'down'}: {len(links)} link(s); the controller "
              f"{'restored its routes' if up else 'rerouted'} in {took:.2f} s")

    @_guarded
    def do_fail(self, line):
        """fail SWITCH        every link of SWITCH goes down (a switch failure)
        fail NODE NODE     the link between two nodes goes down
        Both ends go down as with Mininet's 'link ... down'; the switches report
        the ports and the controller reroutes on its own.  'route' then shows
        the paths that are left."""
        self._set_links(line, up=False)

    @_guarded
    def do_restore(self, line):
        """restore SWITCH | restore NODE NODE   bring failed links back up"""
        self._set_links(line, up=True)

    # ------------------------------------------------------------ load
    @_guarded
    def do_load(self, line):
        """load [SECONDS]   rate of every busy link direction over SECONDS (default 1),
                         from the switches' port counters, busiest first"""
        seconds = float(line) if line.strip() else 1.0
        if not 0 < seconds <= 60:
            raise UsageError("SECONDS must be in (0, 60]")
        before = sent_bytes(self.bed.counters(), self.fabric)
        started = time.monotonic()
        time.sleep(seconds)  # the measurement interval itself
        after = sent_bytes(self.bed.counters(), self.fabric)
        # The time between the two readings, as the run's load.csv measures it.
        elapsed = time.monotonic() - started
        rows = [(mbps, f"{switch}:{port} -> {peer}:{peer_port}")
                for switch, port, peer, peer_port, mbps
                in link_rates(wired_ports(self.fabric), before, after, elapsed)
                if mbps > 0.01]
        if not rows:
            print("no traffic")
        for mbps, link in sorted(rows, reverse=True):
            print(f"{mbps:9.2f} Mbit/s  {link}")

    # ------------------------------------------------------------ replay
    def _pattern(self, words: List[str]) -> FlowDag:
        name, args = words[0], words[1:]
        size = float(args[-1]) * MB if args and re.fullmatch(r"[\d.]+", args[-1]) else 1 * MB
        if name == "allreduce" and args:
            return ring_allreduce(self._hosts(args[0]), int(size), group="cli-allreduce")
        if name == "broadcast" and len(args) >= 2:
            return collectives.broadcast_tree(self._hosts(args[0])[0], self._hosts(args[1]),
                                              int(size), group="cli-broadcast")
        if name == "kvburst" and len(args) >= 2:
            prefill, decode = self._hosts(args[0]), self._hosts(args[1])
            return FlowDag([Flow(f"kv-{p}-{d}", p, d, int(size)) for p in prefill for d in decode])
        if name == "pairs" and args:
            flows = []
            for pair in args[0].split(","):
                src, _, dst = pair.partition(":")
                src, dst = self._hosts(f"{src},{dst}")
                flows.append(Flow(f"pair-{src}-{dst}", src, dst, int(size)))
            return FlowDag(flows)
        if name == "flow" and len(args) >= 2:
            src, dst = self._hosts(f"{args[0]},{args[1]}")
            return FlowDag([Flow(f"flow-{src}-{dst}", src, dst, int(size))])
        raise UsageError("usage: replay allreduce H1,H2,... [MB] | replay broadcast SRC "
                         "D1,D2,... [MB] | replay kvburst P1,P2 D1,D2 [MB] | replay pairs S1:D1,S2:D2 [MB] "
                         "| replay flow SRC DST [MB]")

    @_guarded
    def do_replay(self, line):
        """replay allreduce H1,H2,...[MB]    ring all-reduce of MB (default 1) over the hosts
        replay broadcast SRC D1,D2,... [MB] broadcast tree from SRC
        replay kvburst P1,P2 D1,D2 [MB]     every prefill host sends MB of KV to every decode host
        replay pairs S1:D1,S2:D2 [MB]       chosen pairs at once (e.g. TP rank i to rank i)
        replay flow SRC DST [MB]            one flow
        Prints each flow's time and goodput and the pattern's completion time."""
        words = shlex.split(line)
        if not words or words[0] not in PATTERNS:
            raise UsageError(f"name a pattern: {', '.join(PATTERNS)}")
        dag = self._pattern(words)
        rate = self.bed.scale.emu_mbps(max(d["gbps"] for _, _, d in self.fabric.links()))
        self.replays += 1
        work_dir = Path(self.bed.run_dir) / f"replay-{self.replays}"
        flows = Replayer(self.bed, dag, rate, work_dir).run()
        for flow in flows:
            print(f"{flow.id:24s} {flow.src:>5s} -> {flow.dst:<5s} {flow.bytes / MB:8.2f} MB "
                  f"{flow.duration_s:7.3f} s {flow.goodput_mbps:8.2f} Mbit/s {flow.status}")
        ok = [f for f in flows if f.status == "ok"]
        if ok:
            span = max(f.end for f in ok) - min(f.start for f in ok)
            print(f"{len(ok)}/{len(flows)} flows ok; completion {span:.3f} s emulated "
                  f"({self.bed.scale.real_seconds(span) * 1000:.3f} ms real)")
