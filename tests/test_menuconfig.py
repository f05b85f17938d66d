"""`make menuconfig`'s UI, driven in tmux like a person would: change one value and save."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from compressor_2.config import KCONFIG_PATH, load_config
from tests.conftest import REPO

HANG_GUARD = 120.0  # seconds for a screen or the saved file to appear: a hang guard for a loaded machine

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="no terminal multiplexer (tmux) on this machine")


class Pane:
    def __init__(self, session: str) -> None:
        self.session = session

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.session, *keys], check=True)

    def text(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.session],
                              capture_output=True, text=True, check=True).stdout

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout: float = HANG_GUARD) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.text()
            if predicate(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"menuconfig never showed {what}; screen:\n{self.text()}")


def test_menuconfig_changes_one_value_and_saves(tmp_path: Path) -> None:
    config_path = tmp_path / ".config"
    shutil.copy(REPO / "defconfig", config_path)
    session = f"c2test{time.monotonic_ns()}"
    command = f"KCONFIG_CONFIG={config_path} {sys.executable} -m menuconfig {KCONFIG_PATH}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "48", command],
                   check=True, cwd=tmp_path)
    pane = Pane(session)
    try:
        pane.wait_for(lambda s: "Genetic algorithm" in s, "the main menu")
        pane.keys("/")
        pane.wait_for(lambda s: "Jump to symbol/choice" in s, "the jump dialog")
        pane.keys("^NGEN$")
        pane.wait_for(lambda s: 'NGEN(=16) "Generations to run' in s, "the NGEN search hit")
        pane.keys("Enter")
        pane.wait_for(lambda s: "(16) Generations to run" in s and "Jump to symbol/choice" not in s,
                      "the NGEN entry in its menu")
        pane.keys("Enter")
        pane.wait_for(lambda s: "Generations to run (required, >= 1) (int)" in s, "the input box")
        pane.keys("C-u", "17", "Enter")
        pane.wait_for(lambda s: "(17) Generations to run" in s, "the new value")
        pane.keys("q")
        pane.wait_for(lambda s: "Save configuration?" in s, "the save prompt")
        pane.keys("y")
        deadline = time.monotonic() + HANG_GUARD
        while "CONFIG_NGEN=17" not in config_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert "CONFIG_NGEN=17" in config_path.read_text()
    config = load_config(config_path)
    assert config.ga.ngen == 17 and config.ga.population_size == 8
