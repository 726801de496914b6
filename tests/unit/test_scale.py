"""Tests for traffic.scale: real <-> emulated units."""

import math

import pytest

from traffic.scale import Scale, format_both, format_quantity


def test_default_scale_is_identity():
    scale = Scale()
    assert scale.emu_mbps(1.0) == 1000.0
    assert scale.emu_bytes(1500) == 1500
    assert scale.emu_seconds(0.02) == 0.02


def test_rates_follow_bw_factor():
    scale = Scale(bw_factor=1e-3, tdf=400)
    assert scale.emu_mbps(100) == pytest.approx(100.0)
    assert scale.real_gbps(100.0) == pytest.approx(100.0)
    assert scale.real_gbps(scale.emu_mbps(400)) == pytest.approx(400)


def test_bytes_scale_by_both_factors_so_durations_dilate_by_tdf():
    scale = Scale(bw_factor=1e-3, tdf=400)
    real_bytes, real_gbps = 1e9, 100.0
    emu_bytes = scale.emu_bytes(real_bytes)
    assert emu_bytes == 400_000_000
    real_duration_s = real_bytes * 8 / (real_gbps * 1e9)
    emu_duration_s = emu_bytes * 8 / (scale.emu_mbps(real_gbps) * 1e6)
    assert emu_duration_s == pytest.approx(scale.emu_seconds(real_duration_s))
    assert scale.real_bytes(emu_bytes) == pytest.approx(real_bytes)


def test_emu_bytes_rounds_and_never_empties_a_transfer():
    scale = Scale(bw_factor=1e-6, tdf=1)
    assert scale.emu_bytes(1) == 1
    assert scale.emu_bytes(2_600_000) == 3
    assert scale.emu_bytes(0) == 0
    assert isinstance(scale.emu_bytes(1e9), int)


def test_time_follows_tdf():
    scale = Scale(tdf=400)
    assert scale.emu_seconds(0.02) == pytest.approx(8.0)
    assert scale.real_seconds(8.0) == pytest.approx(0.02)


def test_from_rates():
    scale = Scale.from_rates(real_gbps=400, emu_mbps=100, tdf=10)
    assert scale.bw_factor == pytest.approx(2.5e-4)
    assert scale.tdf == 10.0
    assert scale.emu_mbps(400) == pytest.approx(100)


@pytest.mark.parametrize("kwargs, name", [
    ({"bw_factor": 0}, "bw_factor"),
    ({"bw_factor": -1}, "bw_factor"),
    ({"bw_factor": math.inf}, "bw_factor"),
    ({"bw_factor": math.nan}, "bw_factor"),
    ({"tdf": 0}, "tdf"),
    ({"tdf": "2"}, "tdf"),
    ({"tdf": True}, "tdf"),
])
def test_bad_factors_are_rejected_by_name_and_range(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name} must be a positive finite .*0 < {name} < inf"):
        Scale(**kwargs)


def test_bad_rates_and_arguments_are_rejected_by_name():
    with pytest.raises(ValueError, match="real_gbps"):
        Scale.from_rates(real_gbps=0, emu_mbps=100)
    with pytest.raises(ValueError, match="emu_mbps"):
        Scale.from_rates(real_gbps=100, emu_mbps=-5)
    with pytest.raises(ValueError, match="real_bytes"):
        Scale().emu_bytes(-1)
    with pytest.raises(ValueError, match="emu_s"):
        Scale().real_seconds(math.inf)


def test_to_dict_round_trips_and_from_dict_rejects_unknown_keys():
    scale = Scale(bw_factor=1e-3, tdf=400)
    assert scale.to_dict() == {"bw_factor": 1e-3, "tdf": 400.0}
    assert Scale.from_dict(scale.to_dict()) == scale
    with pytest.raises(ValueError, match="unknown scale key.*'speed'.*allowed"):
        Scale.from_dict({"speed": 2})


def test_describe_names_both_factors_on_one_line():
    text = Scale(bw_factor=1e-3, tdf=400).describe()
    assert "\n" not in text
    assert "x0.001" in text and "x400" in text
    assert "100 Mbit/s" in text and "400 s" in text


def test_format_quantity_picks_readable_prefixes():
    assert format_quantity(0.02, "s") == "20 ms"
    assert format_quantity(8.0, "s") == "8.0 s"
    assert format_quantity(0.001, "s") == "1.0 ms"
    assert format_quantity(2.5e-6, "s") == "2.5 us"
    assert format_quantity(100, "Mbit/s") == "100 Mbit/s"
    assert format_quantity(100000, "Mbit/s") == "100 Gbit/s"
    assert format_quantity(4e8, "B") == "400 MB"
    assert format_quantity(12.345, "%") == "12.3 %"


def test_format_both_and_scale_formatters():
    assert format_both(8.0, 0.02, "s") == "8.0 s emulated (20 ms real)"
    scale = Scale(bw_factor=1e-3, tdf=400)
    assert scale.format_seconds(8.0) == "8.0 s emulated (20 ms real)"
    assert scale.format_rate(100) == "100 Mbit/s emulated (100 Gbit/s real)"
    assert scale.format_bytes(4e8) == "400 MB emulated (1.0 GB real)"
