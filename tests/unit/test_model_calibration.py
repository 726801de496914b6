"""The model's frozen calibration: the shipped file, its checks, and what each
use keeps (`traffic.model.calibration`)."""

from __future__ import annotations

import pytest

from traffic.model import calibration
from traffic.model.calibration import Calibration


def test_the_shipped_calibration_has_every_constant_measured_and_says_when():
    cal = calibration.load()
    assert 0 < cal.efficiency <= 1
    for key in ("startup_s", "hop_latency_s", "round_s", "notice_s"):
        assert getattr(cal, key) > 0, f"{key} was measured, so it is not the ideal 0"
    # Measured too, and 0 where the emulator's gap is no longer than what
    # startup_s counts already (a resend armed ahead goes in under a hand-over).
    assert cal.phase_startup_s >= 0 and cal.resend_s >= 0 and "resend_s" in cal.source
    assert cal.link_mbps > 0 and "cores" in cal.measured and "notice_s" in cal.source


def test_a_written_calibration_reads_back_the_same(tmp_path):
    cal = Calibration(efficiency=0.9, startup_s=0.004, hop_latency_s=3e-5, round_s=3e-4,
                      phase_startup_s=0.001, resend_s=0.008, notice_s=0.022, link_mbps=10.0,
                      measured="today", source="a test")
    assert calibration.load(calibration.dump(cal, tmp_path / "c.toml")) == cal


@pytest.mark.parametrize("text, error", [
    ("[calibration]\nnotice_s = -0.1\n", "calibration.notice_s must be a number >= 0"),
    ("[calibration]\nnotice = 0.02\n", r"unknown keys \['notice'\] .*allowed: .*notice_s"),
    ("[calibration]\nefficiency = 1.5\n", r"efficiency must be in \(0, 1\]"),
])
def test_a_bad_file_is_named_with_the_key_and_what_is_allowed(tmp_path, text, error):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error) as raised:
        calibration.load(path)
    assert str(path) in str(raised.value)


def test_the_real_world_drops_the_emulators_software_but_keeps_the_control_planes_notice():
    cal = Calibration(efficiency=0.95, startup_s=0.004, hop_latency_s=3e-5, round_s=3e-4,
                      phase_startup_s=0.001, resend_s=0.008, notice_s=0.022, link_mbps=10.0)
    real = cal.for_real_world(400.0)
    assert (real.startup_s, real.round_s, real.phase_startup_s, real.resend_s) == (0, 0, 0, 0)
    assert real.notice_s == 0.022 and real.efficiency == 0.95
    assert real.hop_latency_s == pytest.approx(3e-5 * 10 / 400_000)
    assert cal.for_emulation(20.0).notice_s == 0.022
