"""The report page rendered by headless Chromium: plots present in the DOM and on screen.

Needs Debian's `chromium` (.ci/ensure_chromium installs it). Without it the test is
skipped, unless CI or OPDFLOW_REQUIRE_BROWSER is set, where it fails.
"""

from __future__ import annotations

import base64
import html.parser
import io
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.report_runs import make_sweep

from opdflow.analysis.report import write_report

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        msg = "chromium not installed (run .ci/ensure_chromium)"
        if os.environ.get("CI") or os.environ.get("OPDFLOW_REQUIRE_BROWSER"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def render(page: Path, tmp: Path, screenshot: Path, size: tuple[int, int] = (1280, 5200)) -> str:
    """Screenshot `page` into `screenshot`; return the DOM Chromium built from it."""
    exe = chromium()
    common = [exe, *FLAGS, f"--user-data-dir={tmp / 'chromium-profile'}"]
    url = page.resolve().as_uri()
    subprocess.run(
        [*common, f"--window-size={size[0]},{size[1]}", f"--screenshot={screenshot}", url],
        check=True,
        capture_output=True,
        timeout=180,
    )
    dom = subprocess.run(
        [*common, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=180
    )
    return dom.stdout


class _Images(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs))


def test_report_renders_in_chromium(tmp_path):
    from PIL import Image

    sweep = make_sweep(tmp_path / "sweep", ks=(0, 1, 2, 4))
    page = write_report([sweep], tmp_path / "report")
    shot = tmp_path / "report_screenshot.png"
    dom = render(page, tmp_path, shot)

    # DOM: Chromium parsed every plot, each a real PNG of non-trivial size and content
    parser = _Images()
    parser.feed(dom)
    plots = [i for i in parser.imgs if "plot" in i.get("class", "")]
    expected = {"heldout_kl_vs_step", "heldout_kl_vs_time", "mismatch", "trainer_wait", "sweep"}
    assert expected <= {i["id"] for i in plots}
    assert sum(i["id"].startswith("timeline_") for i in plots) == 3  # k0 has no spans
    for img in plots:
        assert img["src"].startswith("data:image/png;base64,")
        data = base64.b64decode(img["src"].split(",", 1)[1])
        assert len(data) > 10_000, img["id"]
        png = Image.open(io.BytesIO(data))
        assert png.width >= 600 and png.height >= 200, (img["id"], png.size)
        assert np.asarray(png.convert("L"), float).std() > 10, img["id"]
    assert "k0: no spans recorded" in dom and "Admission" in dom

    # Screenshot: not blank, and the plots' coloured lines reached the screen
    rgb = np.asarray(Image.open(shot).convert("RGB"), float)
    assert rgb.std() > 20
    assert (rgb.min(axis=2) < 200).mean() > 0.02  # more than a few % of pixels are ink
    tab_blue = np.abs(rgb - np.array([31, 119, 180])).max(axis=2) < 30
    assert tab_blue.sum() > 2000, "no plot lines visible: images did not render"
    print(f"\nreport screenshot: {shot}")
