"""What the P/D scenarios share: the fabrics at the reference's GPU count, and their checks."""

from __future__ import annotations

import pytest

from emu.experiments import pd_setup
from topologies import registry
from topologies.fabric import FabricError

REFERENCE = "zcube,n=4,gpus_per_server=2"
#: The specs pd-inference, pd-failure and pd-pairing have always used at 16 GPUs.
SPECS_16 = {
    "zcube": REFERENCE,
    "roft": "roft,gpus=16,radix=8,gpus_per_server=2",
    "railfly": "railfly,rails=4,servers=4",
    "hpn": "hpn,gpus=16,gpus_per_server=2,radix=8",
    "rail-fabric": "rail-fabric,switches=8,downlinks=4,degree=2,d_degree=3,d_switches=4,"
                   "fast_lanes=3,seed=19,gpus_per_server=2",
}


def test_specs_at_the_reference_gpu_count_are_pinned():
    assert pd_setup.fabric_specs(REFERENCE, list(pd_setup.FABRICS)) == SPECS_16
    assert pd_setup.fabric_specs("zcube,n=8,gpus_per_server=8", ["roft", "railfly", "hpn"]) == {
        "roft": "roft,gpus=64,radix=8,gpus_per_server=8",
        "railfly": "railfly,rails=4,servers=16",
        "hpn": "hpn,gpus=64,gpus_per_server=8,radix=8"}
    assert pd_setup.fabric_specs("zcube,n=6,gpus_per_server=2", ["railfly"]) == {
        "railfly": "railfly,rails=4,servers=9"}


def test_check_names_the_key_for_a_fabric_that_does_not_fit():
    with pytest.raises(ValueError, match="pd-inference.fabrics: unknown fabric 'fattree'; "
                                         "allowed: zcube, roft, railfly, hpn, rail-fabric"):
        pd_setup.fabric_specs(REFERENCE, ["fattree"])
    specs = pd_setup.fabric_specs(REFERENCE, list(pd_setup.FABRICS))
    gpus = {pd_setup.gpu_count(registry.build(spec)) for spec in specs.values()}
    assert gpus == {16}


def test_a_gpu_count_a_fabric_cannot_build_is_named_word_for_word():
    with pytest.raises(ValueError) as railfly:
        pd_setup.fabric_specs("zcube,n=3,gpus_per_server=3", ["railfly"])
    assert str(railfly.value) == ("pd-inference.fabrics: 'railfly' needs a GPU count divisible "
                                  "by 4 rails, have 9; allowed: zcube, roft, railfly, hpn, "
                                  "rail-fabric")
    with pytest.raises(FabricError) as rail:
        pd_setup.fabric_specs("zcube,n=6,gpus_per_server=2", ["rail-fabric"])
    assert str(rail.value) == ("rail-fabric: a small build needs a multiple of 8 GPUs, at "
                               "least 16, got 36")
    with pytest.raises(ValueError, match="fabric.spec must be a zcube spec"):
        pd_setup.fabric_specs("fattree,k=4", ["roft"])


def test_check_fabric_fits_names_the_section_and_key():
    fabric = registry.build(SPECS_16["roft"])
    settings = {"tp": 3, "placement": "tiles", "tile": "3p2d", "seed": 1}
    with pytest.raises(ValueError, match=r"^pd-pairing.fabric: 'roft' \(roft,.*\) does not "
                                         r"work with pd-pairing.tp=3"):
        pd_setup.check_fabric_fits("roft", SPECS_16["roft"], fabric, settings, "pd-pairing",
                                   key="fabric")
