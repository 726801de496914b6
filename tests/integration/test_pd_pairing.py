"""pd-pairing on ZCube: with KV ingress credits no D ever takes more streams than its
credits; without them the same stream piles more KV streams into one D (the incast)."""

from __future__ import annotations

import pytest

from tests.integration.utils import assert_no_leftovers, run_ok

pytestmark = pytest.mark.require_root


def test_credits_cap_the_incast_into_each_d(tmp_path, dataplane):
    run, result = run_ok("pd-pairing", tmp_path, f"dataplane={dataplane}",
                         "pd-pairing.pairings=fixed,score",
                         "pd-pairing.credits=2,0", "pd-pairing.requests=12",
                         files=("report.md", "flows.csv", "d_ingress.png", "ttft_cdf.png",
                                "pd_bars.png"), timeout_s=300)
    configs = {c["config"]: c for c in result["metrics"]["configs"]}
    assert list(configs) == ["fixed, credits 2", "fixed, no credits", "score, credits 2",
                             "score, no credits"]
    for config in configs.values():
        assert config["served_count"] == 12, config
    for pairing in ("fixed", "score"):
        capped = configs[f"{pairing}, credits 2"]["peak_streams_per_d_count"]
        free = configs[f"{pairing}, no credits"]["peak_streams_per_d_count"]
        assert 1 <= capped <= 2, configs
        assert free > 2, f"{pairing}: 12 requests at 100/s with no credits must pile up at D"
    ingress = result["metrics"]["d_ingress"]
    for config, row in configs.items():
        mine = [r for r in ingress if r["config"] == config]
        assert max(r["streams_count"] for r in mine) == row["peak_streams_per_d_count"]
    assert_no_leftovers()
