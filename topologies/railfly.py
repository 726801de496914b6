"""RailFly: K rail switches, fully meshed; rails as in rail-only, one port per GPU.

Section 8 of the 002 text ("Architecture Definition" and the scale table:
28 inter-group links for K = 8; 121 / 569 / 761 GPU ports per rail give
968 / 4,552 / 6,088 GPUs on 128-port 51.2T, 576-port Arista 7800R3 and
768-port H3C S12500R switches)::

            rail0 ----- rail1            K(K-1)/2 mesh links (28 for K = 8), fixed
             |  \\     /  |               whatever the GPU count
             |    \\ /    |
             |    / \\    |
            rail3 ----- rail2
           /|..|\\       /|..|\\
      server s: GPU r -> rail r           ``servers`` GPU ports per rail switch

Same-rank GPUs are one switch apart, any other pair two (rail r -> rail r'),
so cross-rail traffic needs no GPU forwarding, unlike rail-only.  A rail
switch has servers + K - 1 ports; its oversubscription toward the other
rails is servers : (K - 1) (121 : 7 = 17.3 for the fixed-switch row).  The
worst balanced cut splits the rails in two halves and crosses (K/2)^2 mesh
links, which is the price of the fixed mesh; the text argues a rail-aware
scheduler keeps most P -> D pairs inside a rail.

Parameters: ``rails`` (K, even), ``servers`` (GPU ports per rail switch),
``gbps`` (GPU links), ``mesh_gbps`` (each mesh link), ``mesh_links``
(parallel links per rail pair, 1 in the text).
"""

from __future__ import annotations

from typing import List, Optional

from topologies.counts import FabricCounts, cable_modules
from topologies.fabric import Fabric, FabricError, ScaleError


def _check(rails: int, servers: int, mesh_links: int) -> None:
    if rails < 2 or rails % 2 or servers < 1 or mesh_links < 1:
        raise FabricError(f"railfly: need an even rails >= 2, servers >= 1 and mesh_links >= 1, "
                          f"got {rails}, {servers}, {mesh_links}")


def build(rails: int = 4, servers: int = 4, gbps: float = 400.0, mesh_gbps: float = 400.0,
          mesh_links: int = 1) -> Fabric:
    _check(rails, servers, mesh_links)
    radix = servers + (rails - 1) * mesh_links
    fabric = Fabric("railfly", params={"rails": rails, "servers": servers, "gbps": gbps,
                                       "mesh_gbps": mesh_gbps, "mesh_links": mesh_links})
    switches = [fabric.add_switch("rail", rail=r, radix=radix, port_gbps=gbps)
                for r in range(rails)]
    for server in range(servers):
        for rail in range(rails):
            host = fabric.add_host("gpu", gpu=server * rails + rail, server=server, rail=rail)
            fabric.add_link(host, switches[rail], gbps)
    for a in range(rails):
        for b in range(a + 1, rails):
            for _ in range(mesh_links):
                fabric.add_link(switches[a], switches[b], mesh_gbps)
    return fabric


def counts(rails: int = 4, servers: int = 4, gbps: float = 400.0, mesh_gbps: float = 400.0,
           mesh_links: int = 1) -> FabricCounts:
    _check(rails, servers, mesh_links)
    gpus = rails * servers
    mesh = mesh_links * rails * (rails - 1) // 2
    to_eps = {gbps: gpus}
    to_eps[mesh_gbps] = to_eps.get(mesh_gbps, 0) + mesh
    cables, modules = cable_modules(to_eps, {})
    half = rails // 2
    return FabricCounts(
        fabric="railfly", gpus=gpus, nic_ports=gpus, switches={"rail": rails},
        switch_ports={"rail": (servers + (rails - 1) * mesh_links, gbps)},
        cables=cables, optical_modules=modules, diameter=2,
        bisection_gbps=min(half * half * mesh_links * mesh_gbps, gpus // 2 * gbps))


def mesh_links_between(rails: int) -> int:
    """Inter-group links of the text's table: K(K-1)/2."""
    return rails * (rails - 1) // 2


def bisection_half(fabric: Fabric) -> List[int]:
    """The GPUs of the first K/2 rails: only mesh links cross."""
    rails = fabric.params["rails"]
    return [g for g in range(rails * fabric.params["servers"]) if g % rails < rails // 2]


LARGEST_CHASSIS = 768    # H3C S12500R, the largest rail switch in the text's table


TEXT_RAILS = 8
SMALL_RAILS = 4          # 16 GPUs: 4 servers, rail switches of 4 + 3 ports


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """One RailFly unit with ``gpus`` GPUs.  A server holds one GPU per rail, so
    the rail count sets the server and ``gpus_per_server`` does not apply.

    Full scale: eight rails, each rail switch gpus/8 + 7 ports, a modular
    chassis when that exceeds ``radix`` (the text's table goes to 768); a
    partial server is left out.  Small (emulated): four rails, and ``gpus``
    must fill whole servers (ScaleError otherwise).
    """
    if small:
        if gpus % SMALL_RAILS:
            raise ScaleError("railfly", f"needs a GPU count divisible by {SMALL_RAILS} rails, "
                             f"have {gpus}")
        return {"rails": SMALL_RAILS, "servers": gpus // SMALL_RAILS}
    ports = gpus // TEXT_RAILS + TEXT_RAILS - 1
    if ports > max(radix or 0, LARGEST_CHASSIS):
        raise FabricError(f"railfly: {gpus:,} GPUs need {ports:,}-port rail switches, more than "
                          f"the {LARGEST_CHASSIS}-port chassis of the text's table")
    return {"rails": TEXT_RAILS, "servers": gpus // TEXT_RAILS}


# ------------------------------------------------------------------ against ZCube
#: Section 8's last paragraph: "With the same 128 switches, RailFly uses 1 port
#: per GPU, 5.5% for interconnection, connecting ~15,488 GPUs; ZCube uses 2
#: ports per GPU, 50% for interconnection, capping at 4,096 GPUs ... ~3.8x".
TEXT_SAME_SWITCHES = {"switches": 128, "railfly_gpus": 15488, "zcube_gpus": 4096,
                      "railfly_interconnect_pct": 5.5, "zcube_interconnect_pct": 50.0,
                      "ratio": 3.8}


def versus_zcube(switches: int = 128, radix: int = 128, rails: int = TEXT_RAILS) -> dict:
    """GPUs RailFly and ZCube(n, 2) connect with the same ``switches`` radix-``radix``
    switches (the text: 128 x 128-port 51.2T, 15,488 against 4,096, 3.8x).

    RailFly: ``switches / rails`` separate units (16 of 8 rails), each rail
    switch radix - (rails - 1) GPU ports (121) and rails - 1 mesh ports, so a
    unit is the 968-GPU row of the scale table; the units are not wired to
    one another (the text compares GPUs per switch budget, not one fabric).
    ZCube: n = radix / 2 (2n-port switches), 2n switches per cell, n^2 GPUs
    (ZCube(64, 2): 128 switches, 4,096 GPUs), ``switches / 2n`` cells.
    Interconnect share = switch ports not facing a GPU / all switch ports.
    Counts come from each builder's `counts`.
    """
    if switches < 1 or radix < rails or switches % rails or radix % 2:
        raise FabricError(f"railfly.versus_zcube: switches must be a multiple of rails={rails} "
                          f"and radix even and >= rails, got switches={switches}, radix={radix}")
    from topologies import zcube                     # a sibling builder, for its counts
    unit = counts(rails=rails, servers=radix - (rails - 1))
    cell = zcube.counts(n=radix // 2)
    if switches % cell.total_switches:
        raise FabricError(f"railfly.versus_zcube: switches={switches} is not whole ZCube cells "
                          f"of {cell.total_switches} switches (2 x radix/2)")
    rows = []
    for name, one, copies in (("railfly", unit, switches // rails),
                              ("zcube", cell, switches // cell.total_switches)):
        ports = sum(n * one.switch_ports[role][0] for role, n in one.switches.items())
        rows.append({"fabric": name, "copies": copies, "switches": copies * one.total_switches,
                     "gpus": copies * one.gpus, "ports_per_gpu": one.nic_ports // one.gpus,
                     "switch_ports": copies * ports,
                     "interconnect_pct": 100.0 * (ports - one.nic_ports) / ports})
    railfly_row, zcube_row = rows
    text = TEXT_SAME_SWITCHES if (switches, radix, rails) == (128, 128, TEXT_RAILS) else None
    return {"switches": switches, "radix": radix, "rows": rows,
            "ratio": railfly_row["gpus"] / zcube_row["gpus"], "text": text}
