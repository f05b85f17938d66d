"""report.html in a real browser: Debian's headless Chromium, driven by Playwright, opens
the report of a tiny run (with a hostile answer planted in it) on a laptop-sized screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from compressor_2.archive import Answer, RunArchive, genome_key
from compressor_2.commands.evolve import evolve
from compressor_2.config import load_config
from compressor_2.data.financebench import examples_from_config, holdout_examples
from compressor_2.fitness import example_key
from compressor_2.outputs.report import write_report
from tests.test_evolution_support import write_config

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
# Flags that keep Chromium off the network and quiet in a container.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LAPTOP = {"width": 1366, "height": 768}
HOSTILE = ('<script>console.error("the report ran an answer")</script>'
           '<img src="https://example.invalid/x.png" onerror="console.error(1)">')


def browser():  # noqa: ANN201 - playwright's module, imported only when the test runs
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (make install)")
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: `make install` installs Debian's chromium where apt-get runs as "
                    "root")
    return sync_api


def test_the_report_reads_well_in_headless_chromium(tmp_path, shared, tiny_model_dir, uninterrupted):
    sync_api = browser()
    del uninterrupted  # built the shared clusters
    config_path = write_config(tmp_path, shared, tiny_model_dir, FINANCEBENCH_POOL_INDICES='"0-1"', NGEN="2",
                               HOLDOUT_INDICES='"2"', COMPARE_SIMPLE="y")
    evolve(load_config(config_path))
    config = load_config(config_path)
    pool = examples_from_config(config)
    out = tmp_path / "out"
    archive = RunArchive.open(out / "run.sqlite")
    try:
        zeros = genome_key([0.0] * len(archive.best().deltas))
        archive.store({(zeros, example_key(pool[0])): Answer(HOSTILE, 40, True, "")}, archive.meta("context"), 0)
        report = write_report(archive, out, pool, holdout_examples(config, pool))
    finally:
        archive.close()

    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), args=FLAGS, headless=True, viewport=LAPTOP)
        try:
            page = context.new_page()
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(report.resolve().as_uri(), wait_until="load")
            front = page.locator("#front-figure img")
            assert front.is_visible()
            assert page.evaluate("document.querySelector('#front-figure img').naturalWidth") > 0  # decoded
            answers = page.locator("table.answers").first
            answers.scroll_into_view_if_needed()
            assert answers.is_visible() and answers.locator("tbody tr").count() >= 1
            simpler = page.locator("#simpler-table")
            simpler.scroll_into_view_if_needed()
            assert simpler.is_visible() and simpler.locator("tbody tr").count() == 4  # baseline, best, EOS, cap
            assert page.locator("#answers-training").inner_text().count("the report ran an answer") == 1  # as text
            # Readable on a laptop: nothing wider than the screen.
            assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
            page.evaluate("window.scrollTo(0, 0)")
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot))
        finally:
            context.close()
    assert errors == []
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []  # no network

    from PIL import Image, ImageStat

    with Image.open(shot) as image:
        assert image.size == (LAPTOP["width"], LAPTOP["height"])
        assert ImageStat.Stat(image.convert("L")).stddev[0] > 10  # not a blank page
