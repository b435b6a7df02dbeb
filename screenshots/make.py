"""Regenerate every screenshot of the TUI (SVG and PNG) from the deterministic snapshot source.

    .venv/bin/python screenshots/make.py            # all screens at 80x24 and 160x48
    .venv/bin/python screenshots/make.py dashboard  # only the scenes named

Writes ``screenshots/<scene>-<cols>x<rows>.svg`` and ``.png`` (PNG through cairosvg, from the
dev extra).  The data is fixed (clock, GPUs, backends, jobs, log), so the images only change
when the UI does.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


async def shoot(scene_name: str, size: tuple[int, int], out: Path) -> Path:
    from vramtui.app.scenes import SCENES, make_app

    spec = next(s for s in SCENES if s.name == scene_name)
    with tempfile.TemporaryDirectory(prefix="vt-shots-") as home:
        old_home = os.environ.get("HOME")
        os.environ["HOME"] = home  # paths on screen read ~/.local/state/vramtui/...
        try:
            app = make_app(Path(home), simulated=spec.simulated, gpus=spec.gpus,
                           calibrating=spec.calibrating)
            async with app.run_test(size=size) as pilot:
                await spec.run(pilot)
                name = f"{scene_name}-{size[0]}x{size[1]}.svg"
                svg = app.export_screenshot(title=f"vramtui — {scene_name}")
        finally:
            if old_home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = old_home
    path = out / name
    path.write_text(svg)
    return path


def to_png(svg: Path) -> Path:
    import cairosvg

    png = svg.with_suffix(".png")
    # The SVG asks for Fira Code (a browser fetches it); cairo would fall back to a
    # proportional font, so the PNG is drawn with the monospace font that is installed.
    text = svg.read_text().replace("font-family: Fira Code, monospace",
                                   "font-family: DejaVu Sans Mono, monospace")
    cairosvg.svg2png(bytestring=text.encode(), write_to=str(png), scale=1.0)
    # a 256-colour palette keeps the text crisp at a third of the size
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256)
    small.save(png, optimize=True)
    return png


def main(argv: list[str]) -> int:
    os.chdir(ROOT)  # the fixed data names examples/demo/backends.yaml relative to the repo
    sys.path.insert(0, str(ROOT))
    from vramtui.app.scenes import SCENES, SIZES

    wanted = argv or [s.name for s in SCENES]
    for name in wanted:
        for size in SIZES:
            svg = asyncio.run(shoot(name, size, HERE))
            png = to_png(svg)
            print(f"{svg.relative_to(ROOT)}  {png.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
