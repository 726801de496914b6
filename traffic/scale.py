"""Mapping between real-world units and the emulated ones.

The emulation machine forwards a few hundred Mbit/s in total, so a fabric of
100-400 Gbit/s links is scaled down (see "Scale and time" in docs/architecture.md):

* emulated bandwidth = real bandwidth x ``bw_factor``
* emulated time      = real time      x ``tdf``  (time-dilation factor)
* emulated bytes     = real bytes     x ``bw_factor`` x ``tdf``

Scaling bytes by both factors keeps every transfer's duration dilated by
exactly ``tdf``::

    emulated duration = emu_bytes / emu_rate
                      = (B x bw_factor x tdf) / (R x bw_factor)
                      = (B / R) x tdf

so compute phases and OCS reconfiguration delays, dilated by the same
``tdf``, keep their proportion to communication.

Example: 100 Gbit/s links emulated at 100 Mbit/s (``bw_factor`` = 1e-3) with
``tdf`` = 400: a 1 GB real transfer (80 ms at 100 Gbit/s) becomes 400 MB that
take 32 s at 100 Mbit/s, and a 20 ms real OCS reconfiguration is emulated as
8 s of darkness: ``Scale(1e-3, 400).format_seconds(8.0)`` gives
``"8.0 s emulated (20 ms real)"``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

# SI prefixes used to print quantities readably, largest first.  Each entry is
# (multiplier, prefix); a value is printed with the largest prefix it reaches.
_PREFIXES_UP = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_PREFIXES_DOWN = ((1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n"))

# Units whose prefix is chosen automatically, and the prefixes that make sense
# for them (nobody writes "kilo-seconds" or "milli-bytes").
_AUTO_PREFIX_UNITS = {
    "s": _PREFIXES_DOWN,
    "bit/s": _PREFIXES_UP,
    "B": _PREFIXES_UP,
    "bit": _PREFIXES_UP,
}

# Units given with a prefix are first brought back to their base unit so that
# callers may pass 20.0 "ms" or 0.02 "s" alike.
_PREFIXED_UNITS = {
    "ns": (1e-9, "s"), "us": (1e-6, "s"), "ms": (1e-3, "s"),
    "kbit/s": (1e3, "bit/s"), "Mbit/s": (1e6, "bit/s"),
    "Gbit/s": (1e9, "bit/s"), "Tbit/s": (1e12, "bit/s"),
    "kB": (1e3, "B"), "MB": (1e6, "B"), "GB": (1e9, "B"), "TB": (1e12, "B"),
}


def _check_positive_finite(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise ValueError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a positive finite number "
                         f"(0 < {name} < inf), got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number "
                         f"(0 < {name} < inf), got {value!r}")
    return float(value)


def _check_non_negative_finite(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise ValueError naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a finite number >= 0 "
                         f"(0 <= {name} < inf), got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0 "
                         f"(0 <= {name} < inf), got {value!r}")
    return float(value)


def _format_number(value: float) -> str:
    """Three significant digits, keeping one decimal below 10 ("8.0", "20")."""
    text = f"{value:.3g}"
    if "e" in text:
        return text
    if "." not in text and abs(value) < 10:
        text += ".0"
    return text


def format_quantity(value: float, unit: str) -> str:
    """Print ``value unit`` with an SI prefix chosen for readability.

    Time ("s", "ms", "us", "ns"), rates ("bit/s", "Mbit/s", ...) and sizes
    ("B", "MB", ...) get the prefix that keeps the number between 1 and 1000:
    ``format_quantity(0.02, "s")`` is ``"20 ms"``, ``format_quantity(100,
    "Mbit/s")`` is ``"100 Mbit/s"``.  Any other unit is printed as given.
    """
    if value is None or not math.isfinite(value):
        return f"{value} {unit}".strip()
    factor, base = _PREFIXED_UNITS.get(unit, (1.0, unit))
    prefixes = _AUTO_PREFIX_UNITS.get(base)
    if prefixes is None:
        return f"{_format_number(value)} {unit}".strip()
    base_value = value * factor
    magnitude = abs(base_value)
    if magnitude == 0:
        return f"0 {base}"
    # Fall back to the smallest prefix for values below all of them.
    multiplier, prefix = prefixes[-1]
    for candidate_multiplier, candidate_prefix in prefixes:
        # A tiny tolerance so that 0.001 s prints as "1.0 ms", not "1000 us".
        if magnitude >= candidate_multiplier * (1 - 1e-9):
            multiplier, prefix = candidate_multiplier, candidate_prefix
            break
    return f"{_format_number(base_value / multiplier)} {prefix}{base}"


def format_both(emu_value: float, real_value: float, unit: str) -> str:
    """``"8.0 s emulated (20 ms real)"``: one quantity in both unit systems."""
    return (f"{format_quantity(emu_value, unit)} emulated "
            f"({format_quantity(real_value, unit)} real)")


@dataclass(frozen=True)
class Scale:
    """How real-world rates, sizes and times map onto the emulation.

    ``bw_factor`` is emulated bit/s per real bit/s (1e-3 turns 100 Gbit/s into
    100 Mbit/s); ``tdf`` is emulated seconds per real second (400 turns 20 ms
    into 8 s).  Both must be positive and finite.
    """

    bw_factor: float = 1.0
    tdf: float = 1.0

    def __post_init__(self) -> None:
        # Frozen dataclass: normalise to float through object.__setattr__ so
        # that to_dict() and equality do not depend on int vs float input.
        object.__setattr__(self, "bw_factor",
                           _check_positive_finite("bw_factor", self.bw_factor))
        object.__setattr__(self, "tdf", _check_positive_finite("tdf", self.tdf))

    @classmethod
    def from_rates(cls, real_gbps: float, emu_mbps: float,
                   tdf: float = 1.0) -> "Scale":
        """The scale that emulates a ``real_gbps`` link at ``emu_mbps``."""
        real_gbps = _check_positive_finite("real_gbps", real_gbps)
        emu_mbps = _check_positive_finite("emu_mbps", emu_mbps)
        return cls(bw_factor=(emu_mbps * 1e6) / (real_gbps * 1e9), tdf=tdf)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Scale":
        """Inverse of :meth:`to_dict`; rejects unknown keys by name."""
        unknown = sorted(set(data) - {"bw_factor", "tdf"})
        if unknown:
            raise ValueError(f"unknown scale key(s) {unknown}; "
                             f"allowed: ['bw_factor', 'tdf']")
        return cls(**dict(data))

    # Rates -----------------------------------------------------------------
    def emu_mbps(self, real_gbps: float) -> float:
        """Emulated Mbit/s for a real rate in Gbit/s."""
        real_gbps = _check_non_negative_finite("real_gbps", real_gbps)
        return real_gbps * 1e3 * self.bw_factor

    def real_gbps(self, emu_mbps: float) -> float:
        """Real Gbit/s for an emulated rate in Mbit/s."""
        emu_mbps = _check_non_negative_finite("emu_mbps", emu_mbps)
        return emu_mbps / self.bw_factor / 1e3

    # Sizes -----------------------------------------------------------------
    def emu_bytes(self, real_bytes: float) -> int:
        """Emulated bytes for a real transfer size (at least 1 if non-empty).

        A non-empty real transfer never rounds to an empty emulated one: an
        empty flow would complete instantly and hide a dependency.
        """
        real_bytes = _check_non_negative_finite("real_bytes", real_bytes)
        emulated = round(real_bytes * self.bw_factor * self.tdf)
        if real_bytes > 0:
            return max(1, int(emulated))
        return 0

    def real_bytes(self, emu_bytes: float) -> float:
        """Real bytes that an emulated transfer of ``emu_bytes`` stands for."""
        emu_bytes = _check_non_negative_finite("emu_bytes", emu_bytes)
        return emu_bytes / (self.bw_factor * self.tdf)

    # Time ------------------------------------------------------------------
    def emu_seconds(self, real_s: float) -> float:
        """Emulated seconds for a real duration in seconds."""
        real_s = _check_non_negative_finite("real_s", real_s)
        return real_s * self.tdf

    def real_seconds(self, emu_s: float) -> float:
        """Real seconds for an emulated duration in seconds."""
        emu_s = _check_non_negative_finite("emu_s", emu_s)
        return emu_s / self.tdf

    # Printing --------------------------------------------------------------
    def format_seconds(self, emu_s: float) -> str:
        """``"8.0 s emulated (20 ms real)"`` for an emulated duration."""
        return format_both(emu_s, self.real_seconds(emu_s), "s")

    def format_rate(self, emu_mbps: float) -> str:
        """``"100 Mbit/s emulated (100 Gbit/s real)"`` for an emulated rate."""
        return format_both(emu_mbps, self.real_gbps(emu_mbps) * 1e3, "Mbit/s")

    def format_bytes(self, emu_bytes: float) -> str:
        """``"400 MB emulated (1.0 GB real)"`` for an emulated size."""
        return format_both(emu_bytes, self.real_bytes(emu_bytes), "B")

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line naming both factors and what they do to a 1 s, 100 Gbit/s world."""
        return (f"bandwidth x{self.bw_factor:g} "
                f"(100 Gbit/s real = {format_quantity(self.emu_mbps(100.0), 'Mbit/s')}"
                f" emulated), time x{self.tdf:g} "
                f"(1 s real = {format_quantity(self.emu_seconds(1.0), 's')} emulated)")
