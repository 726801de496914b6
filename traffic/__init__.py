"""What the fabrics carry, as pure models: workloads, collectives, flow DAGs.

Where code goes: a model of traffic or of its scheduling (RL phases, P/D
request streams, placement, pairing, credits, fast lanes, failover), the
flow DAGs it produces, the mapping between real and emulated units
(`traffic.scale`) and the analysis of captures (`traffic.measure`) live
here.  Nothing here forks a process, waits on a host or talks to a switch:
that is `emu.live`.  Every module imports without root and without Mininet
installed (a unit test checks it); it may use `topologies` and the
controllers' cores, never their appliers.

Layers: topologies <- controllers <- traffic <- emu (docs/architecture.md).
"""
