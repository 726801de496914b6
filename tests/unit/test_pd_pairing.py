"""pd-pairing's checks and configuration grid (the runs are integration-tested)."""

from __future__ import annotations

import pytest

from emu import scenario as scenarios
from emu.experiments import pd_pairing as pp


def _load(tmp_path, **section):
    lines = ['[scenario]', 'kind = "pd-pairing"', '[fabric]',
             'spec = "zcube,n=4,gpus_per_server=2"', '[scale]', 'link_mbps = 10.0',
             'tdf = 10.0', '[pd-pairing]']
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in section.items()]
    path = tmp_path / "s.toml"
    path.write_text("\n".join(lines) + "\n")
    return scenarios.load(str(path))


def test_grid_is_every_pairing_with_every_credit_setting_in_order(tmp_path):
    scenario = _load(tmp_path, pairings=["score", "fixed"], credits=[4, 0])
    pp.check(scenario)
    assert pp.configurations(scenario.section) == [("score", 4), ("score", 0), ("fixed", 4),
                                                   ("fixed", 0)]
    assert pp.label("score", 4) == "score, credits 4"
    assert pp.label("fixed", 0) == "fixed, no credits"


@pytest.mark.parametrize("section, message", [
    ({"pairings": []}, "pd-pairing.pairings is empty; allowed: fixed, random, score, sticky"),
    ({"pairings": ["best"]}, r"pd-pairing.pairings: unknown \['best'\]"),
    ({"pairings": ["score", "score"]}, "repeats"),
    ({"credits": []}, "pd-pairing.credits is empty"),
    ({"credits": [2, 9]}, r"pd-pairing.credits=\[2, 9\]: each must be 0"),
    ({"credits": [2, 2]}, "without repeats"),
    ({"tp": 3}, "pd-pairing.fabric: 'zcube' .* does not work with pd-pairing.tp=3"),
])
def test_check_names_the_key_and_the_allowed_values(tmp_path, section, message):
    with pytest.raises(ValueError, match=message):
        pp.check(_load(tmp_path, **section))


def test_unknown_fabric_is_refused_by_the_schema(tmp_path):
    with pytest.raises(Exception, match="pd-pairing.fabric.*zcube"):
        _load(tmp_path, fabric="fattree")


def test_notes_name_every_configuration_and_its_incast():
    rows = [{"config": "fixed, credits 2", "peak_streams_per_d_count": 2, "ttft_p99_s": 2.4,
             "on_home_pct": 50.0},
            {"config": "fixed, no credits", "peak_streams_per_d_count": 11, "ttft_p99_s": 3.3,
             "on_home_pct": 50.0}]
    notes = pp.notes(rows)
    assert len(notes) == 3
    assert notes[1].startswith("fixed, credits 2: peak 2 stream(s)")
    assert "peak 11 stream(s)" in notes[2] and "3.30 emulated s" in notes[2]
