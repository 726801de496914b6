"""Every registered fabric for Mininet's command line::

    sudo .venv/bin/mn --custom topologies/mn_custom.py --topo zcube,n=4
    sudo .venv/bin/mn --custom topologies/mn_custom.py --topo rfabric,bw_factor=0.001 --link tc
    sudo .venv/bin/mn --custom topologies/mn_custom.py --topo zcube,n=4,dataplane=linux \
        --controller none

(the virtualenv's ``mn``: the system one has no networkx).  `topos` maps each
registry name to a function returning a `FabricTopo`.  Keyword arguments are
the builder's (checked and typed by the registry); positional ones follow the
builder's parameter order; ``bw_factor`` and ``dataplane`` go to the Topo.
``dataplane=linux`` makes every switch a namespace (`NamespaceSwitch`: kernel
routers, OCS patch panels), whatever ``--switch`` says; without the testbed's
controller they hold no routes or circuits yet.  mn exec()s this
file without ``__file__``, so the project root is found from the code
object's file name, and mn makes every top-level name of this file a global of
its own: hence only ``topos`` is left at top level.
"""


def _make_topos():
    import inspect
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(
        inspect.currentframe().f_code.co_filename)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from topologies import registry
    from topologies.fabric import FabricError
    from topologies.mininet_topo import FabricTopo

    def topo_for(name):
        def make(*args, **kwargs):
            topo_opts = {key: kwargs.pop(key) for key in ("bw_factor", "dataplane")
                         if key in kwargs}
            names = list(registry.parameters(name))
            if len(args) > len(names):
                raise FabricError(f"{name}: {len(args)} positional arguments, it takes "
                                  f"{len(names)}: {', '.join(names)}")
            kwargs.update(zip(names, args))
            fabric = registry.build(name, **kwargs)
            return FabricTopo(fabric, **topo_opts)
        make.__name__ = f"{name.replace('-', '_')}_topo"
        return make

    return {name: topo_for(name) for name in registry.names()}


topos = _make_topos()
del _make_topos
