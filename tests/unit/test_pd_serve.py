"""What serving a planned stream takes from a run (the replay itself is integration-tested)."""

from __future__ import annotations

from types import SimpleNamespace

from emu.experiments.pd_serve import ServeSettings
from traffic import fastlane
from traffic.scale import Scale

SCALE = Scale.from_rates(200, 10, tdf=10)


def _ctx(**section):
    return SimpleNamespace(settings=section, scale=SCALE,
                           scenario=SimpleNamespace(config={"scale": {"link_mbps": 10.0}}))


def test_settings_come_from_the_run_and_default_where_a_scenario_has_no_key():
    plain = ServeSettings.from_context(_ctx(path_credits=0))
    assert plain == ServeSettings(10.0, SCALE, None, 1, fastlane.WAIT)
    lanes = ServeSettings.from_context(_ctx(path_credits=2, lane_capacity=3,
                                            lane_when_busy=fastlane.EXPANDER))
    assert (lanes.path_credits, lanes.lane_capacity, lanes.lane_when_busy) == \
        (2, 3, fastlane.EXPANDER)
