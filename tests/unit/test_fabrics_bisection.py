"""Each builder's bisection cut really is the worst balanced cut (brute force, tiny fabrics)."""

from itertools import combinations

import pytest

from topologies import catalog, registry
from topologies.counts import bisection, gpu_hosts

TINY = [
    ("clos", {"gpus": 8, "radix": 4}),
    ("fattree-os", {"gpus": 12, "radix": 4}),
    ("roft", {"gpus": 8, "gpus_per_server": 2, "radix": 4}),
    ("rail-only", {"gpus": 8, "gpus_per_server": 2, "radix": 4}),
    ("hpn", {"gpus": 8, "gpus_per_server": 4, "radix": 4}),
    ("sip-ocs", {"gpus": 8, "ports_per_gpu": 2}),
    ("rfabric", {"pods": 2, "servers_per_pod": 2, "gpus_per_server": 2, "radix": 4}),
    ("zcube", {"n": 2}),
    ("zcube", {"n": 3}),
    ("railfly", {"rails": 4, "servers": 2}),
]


def min_bisection(fabric) -> float:
    gpus = sorted(gpu_hosts(fabric))
    first, rest = gpus[0], gpus[1:]
    return min(bisection(fabric, (first,) + others)
               for others in combinations(rest, len(gpus) // 2 - 1))


@pytest.mark.parametrize("name,params", TINY)
def test_builder_cut_is_the_minimum_bisection(name, params):
    fabric = registry.build(name, **params)
    claimed = catalog.analytic_counts(name, **params).bisection_gbps
    assert catalog.measure_fabric(fabric, with_diameter=False).bisection_gbps == claimed
    assert min_bisection(fabric) == claimed


def test_oversubscription_shows_in_the_bisection():
    full = catalog.analytic_counts("clos", gpus=3072, radix=64).bisection_gbps
    thin = catalog.analytic_counts("fattree-os", gpus=3072, radix=64).bisection_gbps
    assert thin == pytest.approx(full / 3)


def test_railfly_cut_is_the_mesh():
    counts = catalog.analytic_counts("railfly", rails=8, servers=121)
    assert counts.bisection_gbps == 16 * 400.0          # (K/2)^2 mesh links cross
