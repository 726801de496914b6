"""A control request's arguments, checked against its op's signature before it runs.

A request is JSON from another process (`controllers.control`), so any argument
may hold any JSON type.  Handed on unchecked, ``"up": "false"`` brought a link
*up* (a non-empty string is true), and a missing or unknown argument was
answered with Python's own wording about positional arguments.  `check` names
the op, the argument and the type the op's annotation asks for: ``str``,
``bool``, ``int``, ``float`` (a finite number), ``list``, ``dict``, or
``Optional`` of one; an argument without an annotation is the op's to check.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from typing import Any, Callable, Dict

# How an annotation reads in a refusal.
_NAMES = {str: "a string", bool: "true or false", int: "an integer",
          float: "a finite number", list: "a list", dict: "an object"}


def check(op: str, method: Callable, args: Dict[str, Any]) -> None:
    """Raise ValueError naming ``op`` and the argument unless ``args`` fit ``method``."""
    parameters = inspect.signature(method).parameters
    unknown = sorted(set(args) - set(parameters))
    if unknown:
        raise ValueError(f"op {op!r}: unknown argument {_short(unknown[0])}; allowed: "
                         f"{', '.join(parameters) or 'none'}")
    missing = [name for name, parameter in parameters.items()
               if parameter.default is inspect.Parameter.empty and name not in args]
    if missing:
        raise ValueError(f"op {op!r}: missing argument {missing[0]!r}")
    hints = typing.get_type_hints(method)
    for name, value in args.items():
        expected = hints.get(name)
        if expected is not None and not _fits(value, expected):
            raise ValueError(f"op {op!r}: argument {name!r} must be {_describe(expected)}, "
                             f"got {_short(value)}")


def _union(expected: Any) -> bool:
    return typing.get_origin(expected) in (typing.Union, types.UnionType)


def _fits(value: Any, expected: Any) -> bool:
    if _union(expected):
        return any(_fits(value, option) for option in typing.get_args(expected))
    expected = typing.get_origin(expected) or expected
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value)
    if expected in (str, list, dict):
        return isinstance(value, expected)
    return True                 # an annotation this module does not read: the op checks


def _describe(expected: Any) -> str:
    options = typing.get_args(expected) if _union(expected) else (expected,)
    names = [_NAMES.get(typing.get_origin(o) or o, getattr(o, "__name__", str(o)))
             for o in options if o is not type(None)]
    return " or ".join(names) + (" or null" if type(None) in options else "")


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
