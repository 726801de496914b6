"""A small hybrid EPS/OCS fabric: ToR uplinks pass through one OCS.

::

                 +------------------ o1 (OCS, radix R) ------------------+
                 |  port 1  port 2  |  port 3  port 4  | ...             |
                 +---|--------|-----+----|--------|-----+-----------------+
                     |        |          |        |
                   tor s1 (up1, up2)   tor s2 (up1, up2)   ...   `tors` ToRs
                    /   \\               /   \\
                  h1     h2           h3     h4             `hosts_per_tor` each

ToR t (0-based) wires its uplink u (0-based) to OCS port t*uplinks + u + 1.
Without lit circuits the ToRs are islands: all inter-ToR traffic rides a
circuit, so a reconfiguration moves real traffic.

Named circuit sets (``circuit_set(fabric, name)``):

* ``ring``: ToR t's last uplink to ToR t+1's first uplink (a ring, every pair
  of ToRs connected, possibly over several circuits);
* ``ring-reverse``: ToR t's first uplink to ToR t+1's last uplink: the same
  ToR adjacency over different OCS ports.  Switching between the two moves
  every circuit, so every inter-ToR flow goes dark for the injected delay.

With two ToRs the ring degenerates to one circuit per set.
"""

from __future__ import annotations

from typing import Set

from topologies.fabric import Circuit, Fabric, FabricError, normalize_circuit

CIRCUIT_SETS = ("ring", "ring-reverse", "none")


def build(tors: int = 2, hosts_per_tor: int = 2, uplinks: int = 2, gbps: float = 400.0,
          radix: int = 0, technology: str = "mems", circuits: str = "ring") -> Fabric:
    if tors < 2:
        raise FabricError(f"hybrid: tors must be >= 2, got {tors}")
    if hosts_per_tor < 1:
        raise FabricError(f"hybrid: hosts_per_tor must be >= 1, got {hosts_per_tor}")
    if uplinks < 2:
        raise FabricError(f"hybrid: uplinks must be >= 2 (two circuit sets), got {uplinks}")
    radix = radix or tors * uplinks
    if radix < tors * uplinks:
        raise FabricError(f"hybrid: radix {radix} < tors*uplinks = {tors * uplinks}")
    fabric = Fabric("hybrid", params={"tors": tors, "hosts_per_tor": hosts_per_tor,
                                      "uplinks": uplinks, "gbps": gbps, "radix": radix,
                                      "technology": technology})
    ocs = fabric.add_ocs(radix=radix, technology=technology)
    for t in range(tors):
        tor = fabric.add_switch("tor", pod=0, server=t)
        for slot in range(hosts_per_tor):
            host = fabric.add_host("gpu", pod=0, server=t, rail=slot)
            fabric.add_link(host, tor, gbps)
        for _ in range(uplinks):
            fabric.add_link(tor, ocs, gbps, medium="ocs")
    fabric.set_circuits(ocs, circuit_set(fabric, circuits))
    return fabric


def uplink_port(fabric: Fabric, tor_index: int, uplink: int) -> int:
    return tor_index * fabric.params["uplinks"] + uplink + 1


def circuit_set(fabric: Fabric, name: str) -> Set[Circuit]:
    if name not in CIRCUIT_SETS:
        raise FabricError(f"hybrid: circuit set {name!r} not one of {CIRCUIT_SETS}")
    tors, last = fabric.params["tors"], fabric.params["uplinks"] - 1
    if name == "none":
        return set()
    pairs = range(1) if tors == 2 else range(tors)
    result = set()
    for t in pairs:
        nxt = (t + 1) % tors
        if name == "ring":
            result.add(normalize_circuit(uplink_port(fabric, t, last), uplink_port(fabric, nxt, 0)))
        else:
            result.add(normalize_circuit(uplink_port(fabric, t, 0), uplink_port(fabric, nxt, last)))
    return result
