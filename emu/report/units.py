"""What a metric key's unit suffix means, and its value printed emulated and real.

Metric keys name their unit by suffix: ``_s``, ``_ms``, ``_us`` (time),
``_mbps``, ``_gbps`` (rate), ``_bytes`` (size), ``_pct`` (percent),
``_ratio`` (dimensionless), ``_count`` (count).  Values are *emulated*
unless the key holds the word ``real`` (``ocs_delay_real_ms``,
``iteration_real_ms``): those are real-world quantities already and are
printed as such, never converted.  Emulated time, rate and size values are
printed in both unit systems using the run's ``Scale`` (real time =
emulated / tdf, real rate = emulated / bw_factor, real bytes = emulated /
(bw_factor x tdf)).

Every function returns text for a Markdown table cell: numbers to a few
significant digits with their unit (``traffic.scale.format_quantity``),
other values as text with ``|`` escaped and newlines flattened.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence, Tuple

from traffic.scale import Scale, format_quantity

# Metric key suffix -> (unit printed, kind, factor to the kind's base unit).
# Base units: seconds for time, Mbit/s for rate, bytes for size.
_UNIT_SUFFIXES = (
    ("_ms", "ms", "time", 1e-3),
    ("_us", "us", "time", 1e-6),
    ("_s", "s", "time", 1.0),
    ("_mbps", "Mbit/s", "rate", 1.0),
    ("_gbps", "Gbit/s", "rate", 1e3),
    ("_bytes", "B", "size", 1.0),
    ("_pct", "%", "plain", 1.0),
    ("_ratio", "", "plain", 1.0),
    ("_count", "", "count", 1.0),
)
# Kinds whose emulated value differs from the real one.
SCALED_KINDS = ("time", "rate", "size")
# A list longer than this is summarised (min, median, max).
MAX_LISTED_VALUES = 8


@dataclass(frozen=True)
class MetricUnit:
    """What a metric key's suffix says about its value."""

    name: str       # the key without its unit suffix
    unit: str       # printed unit ("ms", "Mbit/s", "" ...)
    kind: str       # "time", "rate", "size", "plain", "count" or "unknown"
    to_base: float  # multiply to get seconds / Mbit/s / bytes
    is_real: bool   # the key says the value is in real units already

    @property
    def is_scaled(self) -> bool:
        """True when the value is an emulated time, rate or size (it has a real twin)."""
        return self.kind in SCALED_KINDS and not self.is_real


def metric_unit(key: str) -> MetricUnit:
    """Parse a metric key's unit suffix (see the module docstring)."""
    leaf = key.rsplit(".", 1)[-1]
    is_real = "real" in leaf.lower().split("_")
    for suffix, unit, kind, to_base in _UNIT_SUFFIXES:
        if leaf.lower().endswith(suffix) and len(leaf) > len(suffix):
            return MetricUnit(key[:len(key) - len(suffix)], unit, kind, to_base,
                              is_real)
    return MetricUnit(key, "", "unknown", 1.0, is_real)


def is_identity(scale: Scale) -> bool:
    """True when emulated and real units coincide (nothing to convert)."""
    return scale.bw_factor == 1.0 and scale.tdf == 1.0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _to_real(unit: MetricUnit, value: float, scale: Scale) -> Tuple[float, str]:
    """(real value in the kind's base unit, base unit) of an emulated value."""
    base = value * unit.to_base
    if unit.kind == "time":
        return base / scale.tdf, "s"
    if unit.kind == "rate":
        return base / scale.bw_factor, "Mbit/s"
    return base / (scale.bw_factor * scale.tdf), "B"


def plain(value: Any, digits: int = 4) -> str:
    """A table cell: numbers to ``digits`` significant digits, text on one line, escaped."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}"
    if isinstance(value, (list, dict)):
        value = json.dumps(value)
    # One line whatever the value: CommonMark reads a lone "\r" as a line break too,
    # and a line of a value's own could open a block (a code fence) that runs on.
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def with_unit(value: Any, unit: MetricUnit) -> str:
    """``value`` with the unit its key names (counts and text as they are)."""
    if _is_number(value):
        if unit.kind == "count":
            return plain(value)
        if unit.unit:
            return format_quantity(value, unit.unit)
    return plain(value)


def both_units(value: Any, unit: MetricUnit, scale: Scale) -> Tuple[str, str]:
    """(emulated text, real text) for one metric value; either may be empty.

    A value whose key says ``real`` has real text only: converting it back
    to "emulated" units would print a quantity the testbed never measured.
    Values without a scaled unit (counts, ratios, text) have emulated text only.
    """
    if not _is_number(value) or unit.kind not in SCALED_KINDS:
        return with_unit(value, unit), ""
    if unit.is_real:
        return "", with_unit(value, unit)
    real, base = _to_real(unit, value, scale)
    return with_unit(value, unit), format_quantity(real, base)


def value_list(values: list, unit: MetricUnit, scale: Scale) -> Tuple[str, str]:
    """(emulated, real) text for a list of values: all of them, or a summary.

    As in :func:`both_units`, either text may be empty.
    """
    if not values:
        return "(empty)", ""
    numbers = [v for v in values if _is_number(v)]
    if len(values) <= MAX_LISTED_VALUES or len(numbers) != len(values):
        pairs: Sequence[Tuple[str, str]] = [both_units(v, unit, scale)
                                            for v in values[:MAX_LISTED_VALUES]]
        more = (f", ... ({len(values)} values)" if len(values) > MAX_LISTED_VALUES
                else "")
    else:
        summary = (("min", min(numbers)), ("median", statistics.median(numbers)),
                   ("max", max(numbers)))
        pairs = [tuple(f"{name} {text}" if text else "" for text in
                       both_units(value, unit, scale)) for name, value in summary]
        more = f" ({len(values)} values)"
    emulated = ", ".join(pair[0] for pair in pairs if pair[0])
    real = ", ".join(pair[1] for pair in pairs if pair[1])
    return (emulated + more) if emulated else "", (real + more) if real else ""


def column_header(column: str) -> str:
    """A table column's header: its name and unit, marked when the unit is real."""
    unit = metric_unit(column)
    if not unit.unit:
        return column
    if unit.is_real and unit.kind in SCALED_KINDS:
        return f"{unit.name} ({unit.unit}, real)"
    return f"{unit.name} ({unit.unit})"
