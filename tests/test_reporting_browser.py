"""The HTML report in a real headless Chromium (Debian's ``chromium``): it loads with no console
messages, shows every section, and renders its images. Installs nothing; skips without chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest
from test_reporting_helpers import CORNER, make_run_dir

from robusttrain.reporting import write_report

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium absent (CI: apt-get install -y chromium)"
)

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--hide-scrollbars",
]


def chromium(tmp: Path, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
        cwd=tmp,  # whatever the browser drops in its working directory stays out of the repository
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def console_lines(stderr: str) -> list[str]:
    # with --enable-logging=stderr every console message (log, warning, error, uncaught
    # exception) is written as "...:INFO:CONSOLE:<line>] "<message>", source: <url> (<line>)"
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    run = make_run_dir(tmp_path_factory.mktemp("browser") / "run")
    return write_report(run)


def test_console_detection_works(tmp_path):
    # guards the check below: a page that does log must be seen as logging
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><script>console.error('boom');undefinedFn();</script></body></html>"
    )
    out = chromium(tmp_path, "--dump-dom", page.as_uri())
    lines = console_lines(out.stderr)
    assert any("boom" in ln for ln in lines) and any("ReferenceError" in ln for ln in lines)


def test_report_dom_has_every_section_and_no_console_messages(report, tmp_path):
    out = chromium(tmp_path, "--dump-dom", report.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    dom = out.stdout
    assert console_lines(out.stderr) == []
    for anchor, title in [
        ("summary", "Run summary"),
        ("clean-dice", "Clean Dice"),
        ("efr-table", "EFR table"),
        ("efr-curves", "EFR curves"),
        ("corner-cases", "Corner cases"),
        ("failures", "Worst failures"),
        ("gallery", "Perturbation gallery"),
    ]:
        assert re.search(rf'<section id="{anchor}"><h2>{title}</h2>', dom), anchor
    assert CORNER in dom and "t = 0.25" in dom and "t = 0.5" in dom
    # clean Dice, EFR curves, 1 corner case, trade-off, 5 failures, gallery
    assert len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', dom)) == 10


def _screenshot(tmp: Path, page: Path, name: str):
    shot = tmp / name
    out = chromium(tmp, "--window-size=1280,6000", f"--screenshot={shot}", page.as_uri())
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    assert console_lines(out.stderr) == []
    return shot, matplotlib.image.imread(shot)


def test_report_screenshot_renders_images(report, tmp_path):
    shot, img = _screenshot(tmp_path, report, "report.png")
    assert img.shape[:2] == (6000, 1280)  # tall enough for every section (trade-off, gallery)
    # the same page with its <img> elements removed: coloured pixels (plot lines, thumbnails) must
    # come mostly from the images, i.e. they were decoded and drawn
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<img [^>]*>", "", report.read_text()))
    _, bare_img = _screenshot(tmp_path, bare, "bare.png")

    def colour(a):
        return float(((a[..., :3].max(axis=2) - a[..., :3].min(axis=2)) > 0.3).mean())

    assert colour(img) > 3 * colour(bare_img), (colour(img), colour(bare_img))
    keep = os.environ.get("ROBUSTTRAIN_SCREENSHOT_DIR")
    if keep:  # to look at it yourself
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "report.png")
