"""Build any fabric, check it, and (with ``--cli``) explore it by hand.

    sudo .venv/bin/python -m emu.run lab --set fabric.spec=zcube,n=4 --cli

Without ``--cli`` the run pings every pair of hosts the fabric connects (a
fabric may be several networks on purpose, like HPN's two planes) and
reports the loss, the build time and the counts: a quick check that a
fabric materialises and routes.
"""

from __future__ import annotations

import networkx as nx

from emu.experiments.base import Context, Experiment, Network, Outcome, build_fabric
from emu.schema import Field
from topologies.fabric import HOST

SECTION = "lab"
SUMMARY = "build a fabric and ping every connected pair; with --cli, explore it by hand"
FIELDS = {
    "ping": Field(bool, True, "ping every pair of hosts the fabric connects"),
}


def check(scenario) -> None:
    build_fabric(scenario)


def connected_host_sets(fabric):
    logical = fabric.logical_graph()
    return [sorted((h for h in c if logical.nodes[h]["kind"] == HOST),
                   key=lambda h: fabric.graph.nodes[h]["index"])
            for c in nx.connected_components(logical)]


def run(ctx: Context) -> Outcome:
    outcome = Outcome()
    sets = [s for s in connected_host_sets(ctx.fabric) if len(s) > 1]
    pairs = sum(len(s) * (len(s) - 1) for s in sets)
    losses = []
    if ctx.settings["ping"]:
        for hosts in sets:
            loss = ctx.bed.net.ping([ctx.bed.net.get(h) for h in hosts], timeout=2)
            losses.append(loss * len(hosts) * (len(hosts) - 1))
            if loss:
                outcome.warnings.append(f"{loss:.1f}% of pings lost among {hosts[0]}..{hosts[-1]}")
    outcome.metrics = {
        "hosts_count": len(ctx.fabric.hosts),
        "switches_count": len(ctx.fabric.eps_switches),
        "ocs_count": len(ctx.fabric.ocs_switches),
        "networks_count": len(sets),
        "pairs_count": pairs,
        "ping_loss_pct": sum(losses) / pairs if pairs and losses else None,
    }
    ctx.log(f"{pairs} host pairs in {len(sets)} network(s); "
            f"ping loss {outcome.metrics['ping_loss_pct']}%")
    return outcome


EXPERIMENT = Experiment(kind="lab", summary=SUMMARY, section=SECTION, fields=FIELDS,
                        check=check, run=run, network=Network.ONE)
