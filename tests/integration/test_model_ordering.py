"""The flow-level model and the emulator order the fabrics alike where the model
predicts a wide gap.

Only an ordering the model puts 25% or more apart is asserted: closer ones
are within what TCP and the replay move between two emulated runs, and
belong to `bench/model --validate`, which prints every figure side by side.
"""

from __future__ import annotations

import pytest

from tests.integration.utils import assert_no_leftovers, run_ok

pytestmark = pytest.mark.require_root

#: The model must predict at least this relative gap for the test to hold the
#: emulator to its order.
WIDE_GAP = 0.25
FAILURE = ("pd-failure.fabrics=hpn,zcube", "pd-failure.requests=12", "pd-failure.repeats=1")


def test_pd_failure_order_of_hpn_and_zcube_agrees(tmp_path):
    _, model = run_ok("pd-failure", tmp_path / "model", "engine=model", *FAILURE)
    predicted = {name: model["metrics"][name]["throughput_degradation_pct"]
                 for name in ("hpn", "zcube")}
    worse, better = sorted(predicted, key=predicted.get, reverse=True)
    gap = (predicted[worse] - predicted[better]) / max(abs(predicted[worse]), 1e-9)
    assert gap >= WIDE_GAP, f"the model must predict a wide gap to test: {predicted}"

    _, emulated = run_ok("pd-failure", tmp_path / "emulated", "dataplane=linux", *FAILURE,
                         timeout_s=600)
    measured = {name: emulated["metrics"][name]["throughput_degradation_pct"]
                for name in ("hpn", "zcube")}
    assert measured[worse] > measured[better], \
        f"model {predicted} (a {gap:.0%} gap), emulated {measured}"
    assert_no_leftovers()
