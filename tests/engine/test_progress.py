"""Progress bars suit where their output goes: live frames on a terminal, a plain line every few
seconds in a log (a demo log once held ~2,300 carriage-return frames for two preset builds)."""

from __future__ import annotations

import io
import time

from engine.support import progress
from engine.support.progress import is_tty, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_whole_lines_not_frames():
    log = io.StringIO()
    bar = progress_bar(range(3000), desc="build", unit="step", stream=log)
    for step in bar:
        bar.set_postfix(loss=f"{1 / (step + 1):.3f}")  # refreshes every step on a terminal
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 1 <= len(lines) <= 3, lines  # the first, perhaps one on the way, the last
    assert lines[-1].startswith("build: 100%")
    assert "3000/3000" in lines[-1]
    assert all(line.strip() for line in lines)


def test_a_bar_placed_on_a_terminals_second_line_writes_plain_lines_in_a_log():
    """Builds side by side each place their bar on a line of the terminal (``position``); in a log
    that would be cursor movements, so there each writes plain lines as any other bar."""
    log = io.StringIO()
    bar = progress_bar(range(10), desc="build b", unit="step", stream=log, position=1)
    for _ in bar:
        pass
    bar.close()
    text = log.getvalue()
    assert "\x1b" not in text
    assert text.splitlines()[-1].startswith("build b: 100%")
    terminal = Terminal()
    bar = progress_bar(range(10), desc="build b", unit="step", stream=terminal, position=1)
    for _ in bar:
        pass
    bar.close()
    assert "\x1b[A" in terminal.getvalue()  # on a terminal it keeps to its line


def test_a_log_gets_a_line_per_interval(monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.05)
    log = io.StringIO()
    bar = progress_bar(total=6, desc="sim", stream=log)
    for _ in range(6):
        time.sleep(0.06)
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert 4 <= len(lines) <= 8, lines  # about one per update at this interval, each a whole line
    assert all(line.startswith("sim:") for line in lines)


def test_a_terminal_gets_live_frames():
    term = Terminal()
    bar = progress_bar(range(50), desc="train", stream=term)
    for _ in bar:
        pass
    bar.close()
    assert "\r" in term.getvalue()
    assert is_tty(term)
    assert not is_tty(io.StringIO())


def test_a_disabled_bar_writes_nothing(capsys):
    bar = progress_bar(range(10), desc="quiet", enabled=False)
    assert list(bar) == list(range(10))
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""
