"""The package's numba cache is dropped whole when any of its sources changes."""

import traffic.model as model


def test_a_changed_source_drops_every_cached_compilation(tmp_path, monkeypatch):
    package = tmp_path / "model"
    cache = package / "__pycache__"
    cache.mkdir(parents=True)
    (package / "rates.py").write_text("x = 1\n")
    (package / "events.py").write_text("y = 2\n")
    monkeypatch.setattr(model, "_HERE", package)
    monkeypatch.setattr(model, "_CACHE", cache)
    monkeypatch.setattr(model, "_STAMP", cache / "numba-sources.sha256")

    def cached():
        for name in ("events.run_events-1.py311.nbi", "events.run_events-1.py311.1.nbc"):
            (cache / name).write_text("compiled")

    model._forget_stale_compilations()          # first time: no stamp yet
    cached()
    model._forget_stale_compilations()          # nothing changed: kept
    assert len(list(cache.glob("*.nb?"))) == 2
    (package / "rates.py").write_text("x = 3\n")    # another module than the cached one
    model._forget_stale_compilations()
    assert list(cache.glob("*.nb?")) == []
    cached()
    model._forget_stale_compilations()          # the new stamp holds
    assert len(list(cache.glob("*.nb?"))) == 2
