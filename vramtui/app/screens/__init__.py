"""The TUI's screens, one per module.  Screens render the snapshot the app hands the top one
(``show_snapshot``) and never call the engine themselves: every command goes through the app's
``request_*`` methods, which confirm when asked to and run the facade call in a thread worker.

Full screens (each a `SnapshotScreen`, ``snapshot_screen``):
- ``dashboard``: `Dashboard`, GPUs, backends, jobs and events at a glance; the app's first
  screen.
- ``job_detail``: `JobDetail`; ``backend_detail``: `BackendDetail`; both build on
  ``detail_screen`` (`DetailScreen`: the back key and a followed worker log).
- ``calibration_screen``: `CalibrationScreen`, a calibration run live, then its results.

Modal screens: ``help_screen`` (`HelpScreen`), ``confirm_dialog`` (`ConfirmDialog`),
``submit_dialog`` (`SubmitDialog`), ``save_data_dialog`` (`SaveDataDialog`), ``drain_dialog``
(`DrainDialog`), ``reload_screen`` (`ReloadScreen`).

``keys`` holds what the screens' keys share: `key_binding`, the actions that change something
(`MUTATING`, off in --readonly through `ReadonlyKeys`) and those that ask first (`CONFIRMED`).
Their widgets are in ``vramtui.app.widgets``; their look in ``vramtui.tcss``, the app's one
stylesheet.  Import each from its module (``from vramtui.app.screens.dashboard import
Dashboard``).
"""
