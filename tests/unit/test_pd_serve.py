"""What serving a planned stream takes from a run (the replay itself is integration-tested)."""

from __future__ import annotations

from types import SimpleNamespace

from emu.experiments.pd_serve import ServeSettings, kv_window_bytes
from traffic import fastlane, kvwindow
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


def _planned(*flows_per_request):
    return [SimpleNamespace(transfer=SimpleNamespace(dag=SimpleNamespace(flows=[None] * n)))
            for n in flows_per_request]


def test_the_kv_window_counts_the_flows_of_the_streams_a_d_admits():
    bed = SimpleNamespace(queue_packets=41, mtu=1500)
    # Two credits of two-flow requests: 4 flows share a queue, 10 segments each.
    assert kv_window_bytes(bed, _planned(2, 2, 1), kvwindow.BOUNDED, 2) == 10 * 1448
    # Four flows per request (two ranks, two NIC ports each): 8 flows, 5 segments.
    assert kv_window_bytes(bed, _planned(4, 2), kvwindow.BOUNDED, 2) == 5 * 1448
    # Without credits, the text's smallest D limit (2) is counted.
    assert kv_window_bytes(bed, _planned(2), kvwindow.BOUNDED, None) == 10 * 1448
    assert kv_window_bytes(bed, _planned(2), kvwindow.TCP, 2) == 0


def test_the_kv_window_rule_comes_from_the_scenario_and_defaults_to_bounded():
    assert ServeSettings.from_context(_ctx()).kv_window == kvwindow.BOUNDED
    assert ServeSettings.from_context(_ctx(kv_window="tcp")).kv_window == kvwindow.TCP
