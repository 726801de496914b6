"""Fabrics as pure graphs: builders, routing, counts and cost (the bottom layer).

Where code goes: anything that describes a fabric and needs nothing but
networkx (a builder, its analytic counts, routing over the logical graph, the
cost model, naming) lives here and imports no other package of the testbed.
The one exception to "no Mininet" is `topologies.mininet_topo`, the adapter
that turns a `Fabric` into a Mininet ``Topo``.

Layers: topologies <- controllers <- traffic <- emu (docs/architecture.md).
"""
