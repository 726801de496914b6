"""The web view: a run's fabric, link load, circuits and traffic, live or replayed.

`emu.view.state` folds a run's events into what one moment looks like,
`emu.view.page` draws it with Bokeh, `emu.view.server` serves it on
127.0.0.1 behind a token, and ``python -m emu.view RESULTS_DIR`` replays a
finished run from its ``events.jsonl`` and ``load.csv``.
"""
