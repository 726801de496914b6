"""What the fuzz tests (``test_fuzz_*.py``) share.

* `share`: settings for a test whose examples are slow (a report drawn, a
  capture parsed): a share of the profile's ``max_examples`` (tests/conftest.py),
  so that ``HYPOTHESIS_PROFILE=deep`` scales them too.
* `no_run_state`: the testbed's run directory moved to a folder that must
  never appear, and a trip wire on everything that would create it, so a
  hostile input that got as far as creating state fails the test instead.
* `assert_clear`: an error message that names what it must name and is no
  Python traceback.
* `hostile_text` and `json_values`: strategies for what an attacker or a
  broken file hands over.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Iterator, Tuple

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def share(fraction: float, **overrides) -> settings:
    """Settings with ``fraction`` of the loaded profile's examples (at least 5)."""
    examples = max(5, round(settings.default.max_examples * fraction))
    return settings(max_examples=examples,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow],
                    **overrides)


# A test whose fixtures (tmp_path, monkeypatch) serve every example: each
# example checks what it needs of them itself.
with_fixtures = share(1.0)


class StateCreated(AssertionError):
    """A hostile input got as far as creating testbed state."""


@contextlib.contextmanager
def no_run_state(monkeypatch, tmp_path: Path) -> Iterator[Path]:
    """Point `emu.live.state` at ``tmp_path/run-state`` and make creating it fail.

    Yields the folder; the caller checks it is still absent.  The real
    /run/fabric-emu is another engineer's emulation's: never looked at here.
    """
    from emu.live import state

    directory = tmp_path / "run-state"
    monkeypatch.setattr(state, "RUN_DIR", str(directory))
    monkeypatch.setattr(state, "LOCK_PATH", str(directory / "lock"))
    monkeypatch.setattr(state, "OWNED_PATH", str(directory / "owned.jsonl"))

    def trip(*args, **kwargs):
        raise StateCreated("a hostile input reached the creation of testbed state")

    monkeypatch.setattr(state, "ensure_run_dir", trip)
    yield directory
    assert not directory.exists(), f"{directory} was created by a hostile input"


def capture_stderr(call, *args, **kwargs) -> Tuple[object, str]:
    """``call(*args, **kwargs)`` with stdout dropped and stderr kept: (its value, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        value = call(*args, **kwargs)
    return value, err.getvalue()


def assert_clear(message: str, *names: str) -> None:
    """The message is no traceback and names at least one of ``names``."""
    assert "Traceback (most recent call last)" not in message, message
    assert message.strip(), "an empty error message"
    if names:
        assert any(name in message for name in names), \
            f"the message names none of {names}: {message!r}"


# Text as a command line or a file may carry it: control characters, quotes,
# separators, non-ASCII, surrogate-free (what a str can hold on any platform).
hostile_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)

# Any JSON value, nested a little, with the numbers JSON encoders let through
# (NaN and Infinity: Python's json writes and reads them).
json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | hostile_text)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(hostile_text, children, max_size=4),
    max_leaves=8)
