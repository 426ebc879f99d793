"""Progress bars that suit where their output goes.

On a terminal, a live tqdm bar. Anywhere else (a log file, a pipe, CI), a bar that is shown at all
writes one plain line every ``LOG_EVERY_S`` seconds and one at the end, never a carriage-return
frame per update: a log of two preset builds once held about 2,300 such frames.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TextIO

LOG_EVERY_S = 5.0  # off a terminal: at most one progress line this often


def is_tty(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: standard error, where bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


class _Lines:
    """A file for tqdm that turns each refresh into one whole line (tqdm starts frames with '\\r')."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", enabled: bool = True, stream: TextIO | None = None, **kwargs: Any):
    """A tqdm bar over ``iterable`` (or to ``total``) on ``stream`` (default standard error).

    ``enabled=False``: silent (the CLI passes ``is_tty()``: quiet off a terminal). Enabled and not a
    terminal: a line every ``LOG_EVERY_S`` seconds, whatever the caller refreshes in between."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    if not enabled:
        return tqdm(iterable, total=total, disable=True)
    if is_tty(stream):
        return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, **kwargs)

    class _LogBar(tqdm):
        # set_postfix and friends refresh at once by default; in a log only the interval does
        def set_postfix(self, ordered_dict=None, refresh=True, **kw):
            super().set_postfix(ordered_dict, refresh=False, **kw)

        def set_postfix_str(self, s="", refresh=True):
            super().set_postfix_str(s, refresh=False)

        def set_description(self, desc=None, refresh=True):
            super().set_description(desc, refresh=False)

    kwargs.pop("position", None)  # a line on a terminal; in a log it would move the cursor with escapes
    return _LogBar(iterable, total=total, desc=desc, unit=unit, file=_Lines(stream), mininterval=LOG_EVERY_S,
                   maxinterval=LOG_EVERY_S, miniters=1, ascii=True, ncols=100, **kwargs)
