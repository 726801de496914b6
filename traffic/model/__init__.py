"""A flow-level model of the fabrics: flows share links max-min fairly.

Instead of moving packets, the model gives every flow a rate (the max-min fair
share of the links it crosses, `maxmin.py`) and advances from event to event
(`engine.py`: releases, drains, capacity changes), so that DAGs of millions of
flows at full scale finish in seconds.  Pure: no root, no Mininet, only numpy;
SimGrid serves as its oracle in the unit tests, not at run time.
"""

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_CACHE = _HERE / "__pycache__"
_STAMP = _CACHE / "numba-sources.sha256"


def _forget_stale_compilations() -> None:
    """Delete numba's cached compilations of this package when any of its
    sources changed.  numba keys each cached function to its own module's
    source only, but a compiled function carries the code of the compiled
    functions it calls from other modules (the event loop holds the rates'
    update): after ``rates.py`` changed, ``events.py``'s cache would go on
    running the old update, silently."""
    digest = hashlib.sha256()
    for source in sorted(_HERE.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    stamp = digest.hexdigest()
    try:
        if _STAMP.read_text() == stamp:
            return
    except OSError:
        pass
    try:
        _CACHE.mkdir(exist_ok=True)
        for pattern in ("*.nbi", "*.nbc"):
            for cached in _CACHE.glob(pattern):
                cached.unlink(missing_ok=True)
        _STAMP.write_text(stamp)
    except OSError:
        pass        # a read-only tree: numba caches elsewhere, or compiles each time


_forget_stale_compilations()
