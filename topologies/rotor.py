"""RotorNet: ToRs joined by rotor OCSes that cycle through fixed matchings.

After Mellette et al., "RotorNet: A Scalable, Low-complexity, Optical
Datacenter Network" (SIGCOMM 2017).  Every ToR has one uplink to every rotor;
a rotor is an OCS that does not take arbitrary circuit requests but steps
through a fixed, small set of matchings, each a perfect matching of the ToRs,
on a fixed schedule (`controllers.schedule`).  The matchings are the
round-robin 1-factorisation of the complete graph on the ToRs (`matchings`),
so over one cycle every ToR pair gets a direct circuit; with ``tors - 1``
rotors each lit with a different matching, every ToR pair has exactly one
direct circuit at every instant::

       o1 (rotor 0)       o2 (rotor 1)      ...      oR (rotor R-1)     R = ``rotors``
     +-------------+    +-------------+            +-------------+     radix ``tors``
     | 1  2  3  4  |    | 1  2  3  4  |            | 1  2  3  4  |     port t+1 = ToR t
     +-|--|--|--|--+    +-|--|--|--|--+            +-|--|--|--|--+
       |  |  |  |         |  |  |  |                 |  |  |  |
       s1 s2 s3 s4        s1 s2 s3 s4                s1 s2 s3 s4        one uplink from
                                                                        every ToR to every rotor
     tor s1   tor s2   tor s3   tor s4     `tors` ToRs (ToR t is s(t+1))
       |        |        |        |
      h1       h2       h3       h4        `hosts_per_tor` GPUs each

     rotor r lit with matching r (4 ToRs): o1 {0-3, 1-2}, o2 {1-3, 0-2}, o3 {2-3, 0-1}

ToR t (0-based) wires its uplink to rotor r on rotor r's port t + 1, so port
numbers are ToR indices plus one on every rotor, and each rotor's radix is
``tors``.  The initial circuits (slot 0 of `controllers.schedule.rotor_schedule`)
light rotor r with matching r: with the default ``rotors = tors - 1`` the lit
circuits form the complete graph on the ToRs (one hop between any two), and a
schedule that rotates the matchings keeps that true in every slot.  With fewer
rotors the ToRs only see some of the matchings at a time (one rotor: a perfect
matching, several islands of two ToRs).

Parameters: ``tors`` (even, 4..16), ``hosts_per_tor`` (a ToR's GPUs, one
server), ``rotors`` (1..tors-1; 0 = tors - 1), ``gbps`` (every link),
``technology`` (the rotor OCS preset, ``rotornet``: RotorNet's 10 us
reconfiguration in Table 2 of the RFabric text).  Not a fabric of the texts:
a small fabric for experiments with scheduled circuits (like `hybrid`), kept
out of their summary lists; it has analytic `counts`, a `bisection_half` and a
`params_at` rule, so the registry, `topologies.catalog` and the ``fabrics``
and ``cost`` commands take it by name.
"""

from __future__ import annotations

from typing import List, Optional, Set, Tuple

from topologies.counts import FabricCounts, cable_modules, graph_diameter
from topologies.fabric import (TEXT_GPUS_PER_SERVER, Circuit, Fabric, FabricError, ScaleError,
                               normalize_circuit)

MIN_TORS, MAX_TORS = 4, 16


def matchings(n: int) -> List[List[Tuple[int, int]]]:
    """The round-robin (circle method) 1-factorisation of K_n, ``n`` even.

    ``n - 1`` perfect matchings of 0..n-1; every pair is in exactly one.
    Matching r pairs n-1 with r and, around the circle of the other n-1
    vertices, r+i with r-i (mod n-1) for i = 1..n/2-1.  Pairs are (low, high),
    sorted.
    """
    if n < 2 or n % 2:
        raise FabricError(f"rotor: matchings need an even n >= 2, got {n}")
    ring = n - 1
    result = []
    for r in range(ring):
        pairs = [(r, n - 1)]
        for i in range(1, n // 2):
            a, b = (r + i) % ring, (r - i) % ring
            pairs.append((min(a, b), max(a, b)))
        result.append(sorted(pairs))
    return result


def _check(tors: int, hosts_per_tor: int, rotors: int) -> int:
    """The rotor count (0 means tors - 1), once the parameters are checked."""
    if tors % 2 or not MIN_TORS <= tors <= MAX_TORS:
        raise FabricError(f"rotor: tors must be even and in {MIN_TORS}..{MAX_TORS}, got {tors}")
    if hosts_per_tor < 1:
        raise FabricError(f"rotor: hosts_per_tor must be >= 1, got {hosts_per_tor}")
    rotors = rotors or tors - 1
    if not 1 <= rotors <= tors - 1:
        raise FabricError(f"rotor: rotors must be in 1..{tors - 1} (tors - 1: one per matching; "
                          f"0 = {tors - 1}), got {rotors}")
    return rotors


def build(tors: int = 4, hosts_per_tor: int = 1, rotors: int = 0, gbps: float = 400.0,
          technology: str = "rotornet") -> Fabric:
    rotors = _check(tors, hosts_per_tor, rotors)
    fabric = Fabric("rotor", params={"tors": tors, "hosts_per_tor": hosts_per_tor,
                                     "rotors": rotors, "gbps": gbps, "technology": technology})
    ocs = [fabric.add_ocs(radix=tors, technology=technology, rotor=r) for r in range(rotors)]
    for t in range(tors):
        tor = fabric.add_switch("tor", pod=0, server=t, radix=hosts_per_tor + rotors,
                                port_gbps=gbps)
        for slot in range(hosts_per_tor):
            host = fabric.add_host("gpu", pod=0, server=t, rail=slot,
                                   gpu=t * hosts_per_tor + slot)
            fabric.add_link(host, tor, gbps)
        for rotor in ocs:
            fabric.add_link(tor, rotor, gbps, medium="ocs")      # rotor port t + 1
    for r, rotor in enumerate(ocs):
        fabric.set_circuits(rotor, matching_circuits(tors, r))
    return fabric


def tor_port(tor_index: int) -> int:
    """The port of ToR ``tor_index`` (0-based) on every rotor."""
    return tor_index + 1


def matching_circuits(tors: int, index: int) -> Set[Circuit]:
    """Matching ``index`` of `matchings` (tors) as circuits of one rotor's ports."""
    return {normalize_circuit(tor_port(a), tor_port(b)) for a, b in matchings(tors)[index]}


def _diameter(tors: int, rotors: int) -> Optional[int]:
    """Forwarding elements (ToRs) on the worst GPU pair's path over the initial
    circuits: ToR hops + 1, None when some ToRs are cut off from others."""
    worst = graph_diameter(tors, [pair for pairs in matchings(tors)[:rotors]
                                  for pair in pairs])
    return None if worst is None else worst + 1


def counts(tors: int = 4, hosts_per_tor: int = 1, rotors: int = 0, gbps: float = 400.0,
           technology: str = "rotornet") -> FabricCounts:
    """By formula: ``tors`` ToRs of ``hosts_per_tor + rotors`` ports, ``rotors``
    OCS of ``tors`` wired ports; a GPU cable per GPU and a ToR-rotor cable per
    uplink.  Bisection (OCS as non-blocking nodes): half the ToRs, each limited
    by the smaller of its GPUs and its uplinks."""
    rotors = _check(tors, hosts_per_tor, rotors)
    gpus = tors * hosts_per_tor
    cables, modules = cable_modules({gbps: gpus}, {gbps: tors * rotors})
    return FabricCounts(
        fabric="rotor", gpus=gpus, nic_ports=gpus, switches={"tor": tors},
        switch_ports={"tor": (hosts_per_tor + rotors, float(gbps))},
        cables=cables, optical_modules=modules, ocs=rotors, ocs_ports=tors * rotors,
        diameter=_diameter(tors, rotors),
        bisection_gbps=float(tors // 2 * min(hosts_per_tor, rotors) * gbps))


def bisection_half(fabric: Fabric) -> List[int]:
    """The GPUs of the first half of the ToRs."""
    return list(range(fabric.params["tors"] // 2 * fabric.params["hosts_per_tor"]))


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """``gpus`` GPUs, one server of ``gpus_per_server`` per ToR, on an even
    number of ToRs in 4..16 (the rotor OCS and its schedule of tors - 1
    matchings are built for that range); ``tors - 1`` rotors.

    ``gpus_per_server`` None: the texts' eight at full scale; small, the
    fewest GPUs per ToR that give an allowed ToR count (16 GPUs: 16 ToRs of
    one).  ``radix`` does not apply: a ToR has hosts_per_tor + rotors ports.
    Raises `ScaleError` when no allowed ToR count holds ``gpus``.
    """
    if gpus_per_server is None and small:
        for per_tor in range(1, gpus + 1):
            tors, left = divmod(gpus, per_tor)
            if not left and tors % 2 == 0 and MIN_TORS <= tors <= MAX_TORS:
                return {"tors": tors, "hosts_per_tor": per_tor}
        raise ScaleError("rotor", f"has no even ToR count in {MIN_TORS}..{MAX_TORS} that "
                                  f"divides {gpus:,} GPUs")
    per_tor = gpus_per_server or TEXT_GPUS_PER_SERVER
    tors, left = divmod(gpus, per_tor)
    if left or tors % 2 or not MIN_TORS <= tors <= MAX_TORS:
        raise ScaleError("rotor", f"has no build with {gpus:,} GPUs in ToRs of {per_tor}: "
                                  f"that is {gpus / per_tor:g} ToRs, it takes an even "
                                  f"{MIN_TORS}..{MAX_TORS}")
    return {"tors": tors, "hosts_per_tor": per_tor}
