"""The door layer: what every door of the engine needs, written once.

A door is a way into the engine from outside its loop: the in-process facade
(:mod:`supervisor.facade`), the control socket (:mod:`supervisor.control`), HTTP
(:mod:`supervisor.http`) and the Dynamo bridge (:mod:`.dynamo`).  They share:

- :mod:`.watch`: the one way to await a job's end or follow its events, with a deadline
  (the only module outside the engine that knows how a job's end is signalled);
- :mod:`.codec`: the engine's views as JSON values (HTTP and the CLI's ``--json``);
- :mod:`supervisor.apispec`: the one list of methods, which every door is checked against.

This package imports nothing itself: the CLI loads :mod:`.codec` alone, and only
``vramtui --serve --dynamo`` loads :mod:`.dynamo`.
"""
