"""The flow-level model's few constants, calibrated once on the emulator and frozen.

The model has seven constants that max-min fairness alone does not give:

* ``efficiency``: the share of a link's rate that TCP's payload gets (1500-byte
  frames, headers, acknowledgements on the reverse path);
* ``startup_s``: what a replayed flow spends before its first byte (iperf3's
  connection and control exchange on the emulator);
* ``hop_latency_s``: per link crossed, the propagation and store-and-forward
  time of the last bytes;
* ``round_s``: one confirmed control round of the controller (a batch of
  routes or circuits applied and acknowledged), the unit of the six-step
  reconfiguration;
* ``phase_startup_s``: from an RL phase's start to its first flow's first
  byte, beyond a flow's own set-up: the emulator's replayer telling the
  phase's first flows (armed before the phase starts, on host agents the
  run keeps) to go;
* ``resend_s``: from a running flow's cancellation (a NIC port failed over) to
  its resend's first byte, beyond a flow's own set-up.  The emulator's
  replayer arms a failure's resends ahead (`emu.live.replay.Replayer`'s
  ``standby``), and measured 0 (under a hand-over) since; 7.9 ms while it
  started a resend's processes only once the flow was cancelled;
* ``notice_s``: from a switch's links going down to the controller having
  seen them all and rerouted: when a failure's flows move.

They are measured by ``bench/model --calibrate`` on a single-flow bench of the
emulator (one lone TCP flow over 1 and 7 switches at two sizes, on ``dataplane =
linux``; ``notice_s`` by failing every ToR of ``pd-failure``'s fabrics with
no traffic) and written to ``calibration.toml`` beside this module with the date
and the machine kind.  Validation against the emulator (``bench/model
--validate``) never refits them.

Their times are the emulator's wall-clock seconds, which the testbed calls
emulated seconds.  None of them dilates with ``tdf``: iperf3's set-up and a
control round take the same milliseconds whatever the time factor.  The
per-hop latency is mostly the store-and-forward of one full frame, so it
scales with the link rate (``link_mbps`` is the rate it was measured at):
`for_emulation` gives the constants for an emulated run at another rate.
`for_real_world` gives them for a run in real units at the texts' line
rates (the full-scale scenarios): the TCP share is kept, the per-hop
latency scaled to the real rate, and the emulator's own software overheads
(iperf3's set-up, the controller's rounds, a resend's processes) are left out, because they
belong to the emulator, not to the fabric: what remains of a
reconfiguration is its technology's delay.  ``notice_s`` is kept: a real
fabric's control plane also takes time to see a switch die and reroute,
and the emulator's controller is the only one measured.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:                                   # Ubuntu 22.04's Python 3.10
    import tomli as tomllib

DATA = Path(__file__).with_name("calibration.toml")


@dataclass(frozen=True)
class Calibration:
    efficiency: float = 1.0
    startup_s: float = 0.0
    hop_latency_s: float = 0.0
    round_s: float = 0.0
    phase_startup_s: float = 0.0
    resend_s: float = 0.0                # 0 in a calibration from before it was measured
    notice_s: float = 0.0                # likewise
    link_mbps: float = 0.0               # the link rate hop_latency_s was measured at
    measured: str = ""                   # date and machine kind
    source: str = ""                     # how

    def _hop_at(self, mbps: float) -> float:
        if not self.link_mbps or not mbps:
            return self.hop_latency_s
        return self.hop_latency_s * self.link_mbps / mbps

    def for_emulation(self, link_mbps: float) -> "Calibration":
        """The constants for an emulated run whose host links run at ``link_mbps``."""
        return replace(self, hop_latency_s=self._hop_at(link_mbps), link_mbps=link_mbps)

    def for_real_world(self, link_gbps: float) -> "Calibration":
        """The constants for a run in real units at ``link_gbps`` (see above)."""
        mbps = link_gbps * 1000.0
        return replace(self, startup_s=0.0, round_s=0.0, phase_startup_s=0.0, resend_s=0.0,
                       hop_latency_s=self._hop_at(mbps), link_mbps=mbps)

    def to_dict(self) -> dict:
        return asdict(self)


#: The ideal model: pure max-min fairness, no overheads (closed forms, tests).
IDEAL = Calibration(source="ideal: no overheads")


def load(path: Optional[Path] = None) -> Calibration:
    """The frozen calibration; a clear error if the file is missing or malformed."""
    path = Path(path or DATA)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no model calibration; run bench/model --calibrate") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    section = data.get("calibration")
    if not isinstance(section, dict):
        raise ValueError(f"{path}: no [calibration] table")
    fields = set(Calibration.__dataclass_fields__)
    unknown = sorted(set(section) - fields)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown} in [calibration]; allowed: "
                         f"{', '.join(sorted(fields))}")
    for key in ("efficiency", "startup_s", "hop_latency_s", "round_s", "phase_startup_s",
                "resend_s", "notice_s", "link_mbps"):
        value = section.get(key, getattr(IDEAL, key))
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{path}: calibration.{key} must be a number >= 0, got {value!r}")
    if not 0 < section.get("efficiency", 1.0) <= 1:
        raise ValueError(f"{path}: calibration.efficiency must be in (0, 1]")
    return Calibration(**section)


def dump(calibration: Calibration, path: Optional[Path] = None) -> Path:
    path = Path(path or DATA)
    lines = ["# The flow-level model's constants, measured by bench/model --calibrate.",
             "# Validation never refits them: change them only by calibrating again.",
             "[calibration]"]
    for key, value in calibration.to_dict().items():
        lines.append(f"{key} = {value!r}" if not isinstance(value, str)
                     else f'{key} = "{value}"')
    path.write_text("\n".join(lines) + "\n")
    return path
