"""The TUI's widgets, one per module; each renders what the app or its screen hands it (engine
snapshots, views, reports) and none of them calls the engine.

- ``engine_header``: `EngineHeader`, the one-line header of every screen.
- ``gpu_panel``: `GpuPanel`, one GPU on the dashboard, made of
  ``mem_bar`` (`MemBar`, its `legend`), ``line`` (`Line`) and ``history_graph`` (`HistoryGraph`).
- ``row_table``: `RowTable`, the keyed live table that
  ``backends_table`` (`BackendsTable`), ``jobs_table`` (`JobsTable`) and ``process_table``
  (`ProcessTable`) build on; ``cells`` fits text into their cells.
- ``rewrap_log``: `RewrapLog`, the worker-log box; ``event_log``: `EventLog`, the engine's log.
- ``phase_chart``: `PhaseChart`, a calibration run's memory under its phase bands.
- ``key_footer``: `KeyFooter`, the footer that shows the keys that fit, most wanted first.
- ``titles``: `titles`, border titles that repaint only when they change.

Import each from its module (``from vramtui.app.widgets.jobs_table import JobsTable``).
"""
