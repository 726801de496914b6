"""Shared test configuration: the ``require_root`` marker (as in ipmininet), and
the ``vm`` marker of the kernel-datapath tests (tests/vm, `make vm-test`)."""

import os

import pytest
from hypothesis import HealthCheck, settings

# The fuzz tests (tests/unit/test_fuzz_*.py).  "ci", the default, is fixed-seed and
# keeps no example database, so every run tries the same examples and leaves
# nothing in the checkout; "deep" tries ten times as many, new ones each run:
# HYPOTHESIS_PROFILE=deep.  At this count CI's whole fuzz suite takes about a
# minute; the tests that draw a report per example take a share of it
# (tests/unit/fuzzing.py).
CI_EXAMPLES = 60
settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, deadline=None,
                          database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=10 * CI_EXAMPLES, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# vm/guest-init sets it: in the test VM a missing kernel module is a failure,
# not a reason to skip.
IN_TEST_VM = os.environ.get("FABRIC_EMU_VM") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "require_root: needs root, Open vSwitch and Mininet")
    config.addinivalue_line("markers", "vm: needs the openvswitch kernel module (OVS's "
                            "kernel datapath); `make vm-test` runs these in a qemu VM")


def _kernel_datapath() -> bool:
    from emu.live import ovs
    return ovs.kernel_datapath_available()


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (run `sudo make test`)")
        for item in items:
            if "require_root" in item.keywords or "vm" in item.keywords:
                item.add_marker(skip)
        return
    vm_items = [item for item in items if "vm" in item.keywords]
    if vm_items and not IN_TEST_VM and not _kernel_datapath():
        skip = pytest.mark.skip(reason="no openvswitch kernel module here: "
                                "`sudo make vm-test` runs these in a VM whose kernel has it")
        for item in vm_items:
            item.add_marker(skip)
