"""A small declarative schema for scenario files: defaults, types, bounds.

Unknown keys, wrong types and out-of-range values are rejected with a
message that names the file, the dotted key and what is allowed.

A ``dict`` field is a TOML table of scalars, e.g. price overrides: nested
tables are flattened to dotted keys (``{ocs = {port = 800}}`` is
``{"ocs.port": 800}``), ``choices`` lists the allowed keys, and ``item``,
``minimum`` and ``maximum`` apply to every value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message says where and why."""


@dataclass(frozen=True)
class Field:
    kind: type                       # int, float, str, bool, list, dict
    default: Any = None
    help: str = ""
    choices: Optional[Sequence] = None     # allowed values (each item of a list; keys of a dict)
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    item: Optional[type] = None            # element type of a list, value type of a dict
    check: Optional[Callable[[Any], None]] = None  # raises ValueError with a reason

    def describe(self) -> str:
        if self.item is None:
            parts = [self.kind.__name__]
        else:
            parts = [f"{'table' if self.kind is dict else 'list'} of {self.item.__name__}"]
        if self.choices is not None:
            parts.append(("keys " if self.kind is dict else "") + "one of "
                         + ", ".join(map(str, self.choices)))
        if self.minimum is not None:
            parts.append(f">= {self.minimum:g}")
        if self.maximum is not None:
            parts.append(f"<= {self.maximum:g}")
        return ", ".join(parts)


Schema = Dict[str, Dict[str, Field]]


def _coerce_scalar(kind: type, value: Any) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise TypeError
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError
    return value


def _dotted(table: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _check_table(where: str, key: str, spec: Field, value: Any) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: key '{key}' must be {spec.describe()}, got {value!r}")
    entry = replace(spec, kind=spec.item, item=None, choices=None, check=None)
    table = {}
    for name, item in _dotted(value).items():
        if spec.choices is not None and name not in spec.choices:
            raise ScenarioError(f"{where}: unknown key '{key}.{name}'; allowed keys in "
                                f"'{key}': {', '.join(map(str, spec.choices))}")
        table[name] = _check_value(where, f"{key}.{name}", entry, item)
    return table


def _check_value(where: str, key: str, spec: Field, value: Any) -> Any:
    items: list = []       # the values checked against choices and bounds below
    try:
        if spec.kind is dict:      # checks its own keys and values
            value = _check_table(where, key, spec, value)
        elif spec.kind is list:
            if not isinstance(value, list):
                raise TypeError
            value = [_coerce_scalar(spec.item, v) for v in value]
            items = value
        else:
            value = _coerce_scalar(spec.kind, value)
            items = [value]
    except TypeError:
        raise ScenarioError(f"{where}: key '{key}' must be {spec.describe()}, "
                            f"got {value!r}") from None
    for item in items:
        if spec.choices is not None and item not in spec.choices:
            raise ScenarioError(f"{where}: key '{key}' has {item!r}; allowed: "
                                f"{', '.join(map(str, spec.choices))}")
        if spec.minimum is not None and item < spec.minimum:
            raise ScenarioError(f"{where}: key '{key}' is {item!r}; must be >= {spec.minimum:g}")
        if spec.maximum is not None and item > spec.maximum:
            raise ScenarioError(f"{where}: key '{key}' is {item!r}; must be <= {spec.maximum:g}")
    if spec.check is not None:
        try:
            spec.check(value)
        except ValueError as exc:
            raise ScenarioError(f"{where}: key '{key}': {exc}") from None
    return value


def validate(where: str, data: Dict[str, Any], schema: Schema) -> Dict[str, Dict[str, Any]]:
    """Fill defaults and check every key; returns the resolved configuration."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario is a table of sections")
    unknown = sorted(set(data) - set(schema))
    if unknown:
        raise ScenarioError(f"{where}: unknown section '{unknown[0]}'; allowed sections: "
                            f"{', '.join(sorted(schema))}")
    resolved: Dict[str, Dict[str, Any]] = {}
    for section, fields in schema.items():
        given = data.get(section, {})
        if not isinstance(given, dict):
            raise ScenarioError(f"{where}: '{section}' must be a [section] table")
        unknown = sorted(set(given) - set(fields))
        if unknown:
            raise ScenarioError(f"{where}: unknown key '{section}.{unknown[0]}'; allowed keys "
                                f"in [{section}]: {', '.join(sorted(fields))}")
        resolved[section] = {}
        for key, spec in fields.items():
            dotted = f"{section}.{key}"
            if key in given:
                resolved[section][key] = _check_value(where, dotted, spec, given[key])
            elif spec.default is None:
                raise ScenarioError(f"{where}: missing required key '{dotted}' "
                                    f"({spec.describe()}: {spec.help})")
            else:
                resolved[section][key] = spec.default
    return resolved


def parse_override(text: str) -> Tuple[str, Any]:
    """``key=value`` from the command line: TOML literals, else strings; a,b is a list."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10 (Ubuntu 22.04)
        import tomli as tomllib

    if "=" not in text:
        raise ScenarioError(f"--set {text!r}: expected key=value")
    key, raw = (part.strip() for part in text.split("=", 1))
    if not key:
        raise ScenarioError(f"--set {text!r}: empty key")
    try:
        return key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if "," in raw:
        return key, [parse_override(f"v={item}")[1] for item in raw.split(",") if item.strip()]
    return key, raw


def apply_overrides(where: str, data: Dict[str, Any], overrides: Sequence[str],
                    schema: Schema) -> Dict[str, Any]:
    """Merge --set overrides (``section.key=value``, or ``key=value`` when unique);
    ``section.table.entry=value`` sets one entry of a dict field."""
    # A scalar where a [section] belongs is left for validate() to report.
    merged = {section: dict(values) if isinstance(values, dict) else values
              for section, values in data.items()}
    for text in overrides:
        key, value = parse_override(text)
        if "." in key:
            section, name = key.split(".", 1)
            table, _, entry = name.partition(".")
            if entry and table in schema.get(section, {}) and schema[section][table].kind is dict:
                given = merged.setdefault(section, {}).get(table)
                # A later dotted entry wins over the same key nested in the file.
                merged[section][table] = {**(given if isinstance(given, dict) else {}),
                                          entry: value}
                continue
        else:
            owners = [s for s, fields in schema.items() if key in fields]
            if len(owners) != 1:
                raise ScenarioError(
                    f"--set {key}: " + ("no such key" if not owners else
                                        f"ambiguous, use one of {', '.join(o + '.' + key for o in owners)}")
                    + f" in {where}")
            section, name = owners[0], key
        if section in schema and name in schema[section]:
            spec = schema[section][name]
            if spec.kind is list and not isinstance(value, list):
                value = [value]
            if spec.kind is str and not isinstance(value, str):
                value = text.split("=", 1)[1].strip()   # as typed: "zcube,n=4" is no list
        merged.setdefault(section, {})[name] = value
    return merged
