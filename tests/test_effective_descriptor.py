"""The effective descriptor (``vramtui backends describe``, ``GET /v1/backends/{b}/descriptor``)
shows every key a descriptor sets: a key left out reads as "not set" to whoever checks it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from supervisor.backends import load_backends
from supervisor.backends.schema import TOP_KEYS
from supervisor.descriptors import spec_document

#: Keys the loader reads and does not keep as such: the script and its Python become the
#: command; inheritance and ``enabled`` decide which backends there are; an ``http:`` server
#: (``tests/test_server_descriptors.py``) is no worker speaking a protocol.
NOT_KEPT = {"script", "python", "extends", "abstract", "enabled", "http"}


def test_every_key_a_descriptor_sets_is_in_its_effective_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text(textwrap.dedent("""
        name: every
        description: sets every key
        command: [python3, -c, "pass"]
        cwd: .
        env: {A: "1"}
        vram: {peak: 3GiB}
        safety: 256MiB
        priority: 3
        gpus: [0]
        keep_alive: 10m
        pinned: true
        preload: true
        unlisted: true
        stream: false
        inline_results: true
        concurrency: 1
        timeouts: {start: 1m}
        calibration: {request: {steps: 2}}
        reload_cost: 7s
        wake_cost: 2s
        target_wait: 3s
        sleep: {residual: 512MiB}
        simulated: true
        on_overuse: kill
        protocol: vramd
        unload_frees_vram: false
        vramd: {load_keys: [model], event_timeout: 5m}
        api: [chat]
        aliases: [every-alias]
        listed_as: every-alias
    """).lstrip("\n"))
    result = load_backends([path], environ={}, demo_fallback=False)
    assert not result.errors, result.errors
    shown = spec_document(result.backends["every"])
    missing = sorted(TOP_KEYS - NOT_KEPT - set(shown))
    assert not missing, f"set but not shown: {missing}"
    assert shown["target_wait"] == "3s" and shown["listed_as"] == "every-alias"
    assert shown["vramd"]["load_keys"] == ["model"] and shown["inline_results"] is True
