"""The fabric registry: one entry per name, and "this fabric at N GPUs" for every scale."""

from __future__ import annotations

import pytest

from topologies import catalog, registry
from topologies.fabric import Fabric, FabricError, ScaleError

RAIL_FABRIC_16 = ("rail-fabric,switches=8,downlinks=4,degree=2,d_degree=3,d_switches=4,"
                  "fast_lanes=3,seed=19,gpus_per_server=2")


def test_every_name_has_one_entry_with_its_builder_and_where_it_has_them_its_counts():
    names = registry.names()
    assert len(names) == len(set(names)) == 15
    assert catalog.names() == sorted(set(names) - {"fattree", "leafspine", "hybrid"})
    for name in catalog.names():
        entry = registry.FABRICS[name]
        assert entry.bisection_half and entry.params_at, name
    assert [n for n in names if registry.FABRICS[n].transit_hosts] == ["sip-ocs"]
    with pytest.raises(FabricError, match="no analytic counts for 'fattree'; known: clos, "):
        catalog.analytic_counts("fattree", k=4)
    with pytest.raises(FabricError, match="unknown fabric 'ring'; known fabrics: clos, "):
        registry.build("ring,n=4")


def test_register_adds_a_fabric_to_the_spec_api():
    def ring(n: int = 3) -> Fabric:
        fabric = Fabric("ring", params={"n": n})
        switches = [fabric.add_switch("ring") for _ in range(n)]
        for i, switch in enumerate(switches):
            fabric.add_link(fabric.add_host("gpu"), switch, 100.0)
            fabric.add_link(switch, switches[i - 1], 100.0)
        return fabric

    registry.register("ring", ring)
    try:
        assert len(registry.build("ring,n=4").hosts) == 4
        assert registry.parameters("ring") == {"n": 3}
        with pytest.raises(FabricError, match="no rule for its parameters"):
            registry.spec_at("ring", 4)
    finally:
        del registry.FABRICS["ring"]


@pytest.mark.parametrize("name, options, spec", [
    # pd-inference, pd-failure and pd-pairing at ZCube's 16 GPUs, 2 per server
    ("roft", dict(radix=8, gpus_per_server=2), "roft,gpus=16,radix=8,gpus_per_server=2"),
    ("railfly", dict(radix=8, gpus_per_server=2), "railfly,rails=4,servers=4"),
    ("hpn", dict(radix=8, gpus_per_server=2), "hpn,gpus=16,gpus_per_server=2,radix=8"),
    ("rail-fabric", dict(radix=8, gpus_per_server=2), RAIL_FABRIC_16),
    # rfabric at RFabric's 16 GPUs, radix 8, 2 per server
    ("fattree", dict(radix=8, gpus_per_server=2), "fattree,k=4"),
    ("clos", dict(radix=8, gpus_per_server=2), "clos,gpus=16,radix=8,gpus_per_server=2"),
    ("fattree-os", dict(radix=8, gpus_per_server=2),
     "fattree-os,gpus=16,radix=8,gpus_per_server=2"),
    ("sip-ocs", dict(radix=8, gpus_per_server=2, technology="piezo"),
     "sip-ocs,gpus=16,technology=piezo"),
])
def test_small_specs_are_the_ones_the_experiments_emulate(name, options, spec):
    assert registry.spec_at(name, 16, small=True, **options) == spec
    assert len({registry.build_at(name, 16, small=True, **options).graph.nodes[h].get("gpu", i)
                for i, h in enumerate(registry.build(spec).hosts)}) == 16


def test_full_scale_is_the_cost_models_construction():
    assert catalog.scaled_params("roft", 16384, 128) == {"gpus": 16384, "gpus_per_server": 8,
                                                         "radix": 128}
    assert catalog.scaled_params("clos", 1024, 64) == {"gpus": 1024, "radix": 64}
    assert catalog.scaled_params("sip-ocs", 1024, 64) == {"gpus": 1024}
    assert catalog.scaled_params("zcube", 16384, 128) == {"n": 128}
    assert catalog.scaled_params("railfly", 1024, 64) == {"rails": 8, "servers": 128}
    assert catalog.scaled_params("rfabric", 1024, 64) == {
        "pods": 4, "train_pods": 2, "servers_per_pod": 32, "gpus_per_server": 8, "radix": 64}
    assert catalog.scaled_params("rail-fabric", 1024, 64) == {
        "switches": 64, "downlinks": 32, "degree": 8, "fast_lanes": 8, "d_switches": 26,
        "d_degree": 8}
    assert registry.spec_at("rail-fabric", 1024, radix=64) == (
        "rail-fabric,switches=64,downlinks=32,degree=8,fast_lanes=8,d_switches=26,d_degree=8")
    with pytest.raises(FabricError, match="^railfly: 16,384 GPUs need 2,055-port rail switches, "
                                          "more than the 768-port chassis"):
        catalog.scaled_params("railfly", 16384, 128)


def test_a_gpu_count_without_a_build_says_why_and_what_builds_instead():
    with pytest.raises(ScaleError) as fattree:
        registry.spec_at("fattree", 24)
    assert (fattree.value.reason, fattree.value.instead) == ("has no k with k^3/4 = 24 GPUs",
                                                             "clos")
    assert fattree.value.naming("rfabric.fabrics", ["fattree", "clos"]) == (
        "rfabric.fabrics: 'fattree' has no k with k^3/4 = 24 GPUs; use 'clos' (allowed: "
        "fattree, clos)")
    with pytest.raises(ScaleError) as railfly:
        registry.spec_at("railfly", 18, small=True)
    assert railfly.value.naming("k", ["railfly"]) == (
        "k: 'railfly' needs a GPU count divisible by 4 rails, have 18; allowed: railfly")
    with pytest.raises(FabricError, match="roft: unknown parameter 'rails'"):
        registry.spec_at("roft", 16, rails=4)
