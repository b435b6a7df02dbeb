"""Worker settings from flags, a YAML file and the environment, with verda-io's precedence.

defaults < config file (``-c``, or ``VERDA_IO_WORKER_CONFIG``) < ``VERDA_IO_WORKER_*`` environment
< command-line flags — the same keys and order as verda-io 0.4.4, so its config files work.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_PREFIX = "VERDA_IO_WORKER"
DEFAULTS: dict[str, Any] = {
    "script": None,
    "control_socket": "/tmp/verda-io.ctrl.sock",
    "data_socket": "/tmp/verda-io.data.sock",
    "name": "ml-worker-1",
    "max_reconnect_count": 5,
    "debug": False,
    "environment": {},
}
YAML_KEYS = {
    "script": "script",
    "control-socket": "control_socket",
    "data-socket": "data_socket",
    "name": "name",
    "max-reconnect-count": "max_reconnect_count",
    "debug": "debug",
    "environment": "environment",
}


class ConfigError(Exception):
    """A worker setting is missing or wrong; the message says which and how to fix it."""


@dataclass(frozen=True)
class WorkerConfig:
    script: str | None
    control_socket: str
    data_socket: str
    name: str
    max_reconnect_count: int = 5
    debug: bool = False
    environment: dict[str, str] = field(default_factory=dict)


def load_config_file(path: str) -> dict[str, Any]:
    import yaml  # only needed when a config file is given

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read worker config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"worker config {path} is not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"worker config {path} must be a YAML mapping")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in YAML_KEYS:
            known = ", ".join(YAML_KEYS)
            raise ConfigError(f"worker config {path}: unknown key {key!r} (known: {known})")
        if key == "environment" and not isinstance(value, dict):
            raise ConfigError(f"worker config {path}: 'environment' must be a mapping")
        out[YAML_KEYS[key]] = value
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for yaml_key, key in YAML_KEYS.items():
        if key == "environment":
            continue
        value = environ.get(f"{ENV_PREFIX}_{yaml_key.replace('-', '_').upper()}")
        if value is None:
            continue
        if key == "debug":
            out[key] = value.lower() in ("true", "1", "t", "yes")
        else:
            out[key] = value
    return out


def resolve(
    cli: Mapping[str, Any],
    config_path: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> WorkerConfig:
    merged = dict(DEFAULTS)
    if config_path:
        merged.update({k: v for k, v in load_config_file(config_path).items() if v is not None})
    merged.update(env_overrides(environ))
    merged.update({k: v for k, v in cli.items() if v is not None})
    try:
        reconnects = int(merged["max_reconnect_count"])
    except (TypeError, ValueError):
        raise ConfigError(
            f"max-reconnect-count must be an integer, got {merged['max_reconnect_count']!r}"
        ) from None
    environment = merged.get("environment") or {}
    return WorkerConfig(
        script=merged["script"],
        control_socket=str(merged["control_socket"]),
        data_socket=str(merged["data_socket"]),
        name=str(merged["name"]),
        max_reconnect_count=reconnects,
        debug=bool(merged["debug"]),
        environment={str(k): str(v) for k, v in environment.items()},
    )
