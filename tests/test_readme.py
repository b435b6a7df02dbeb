"""The README's descriptor reference names every key the schema takes (a key added without a
line there fails here), each with an example of itself."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.backends.http import HTTP_KEYS
from supervisor.backends.schema import CALIBRATION_KEYS, TIMEOUT_KEYS, TOP_KEYS, VRAM_KEYS

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_descriptor_key_has_a_line_with_an_example() -> None:
    rows = re.findall(r"^\| `([a-z_.]+)` \| (.+?) \| `(.+?)` \|$", README.read_text(), re.M)
    documented = {key for key, _what, _example in rows}
    wanted = (set(TOP_KEYS) - {"vram", "timeouts", "calibration"}) | {"vram"}
    wanted |= {f"vram.{k}" for k in VRAM_KEYS} | {f"timeouts.{k}" for k in TIMEOUT_KEYS}
    wanted |= {f"calibration.{k}" for k in CALIBRATION_KEYS} | {"on_overuse", "api"}
    wanted |= {f"http.{k}" for k in HTTP_KEYS}
    assert wanted <= documented, sorted(wanted - documented)
    for key, _what, example in rows:
        assert example.split(":")[0].strip() == key.split(".")[0], (key, example)

