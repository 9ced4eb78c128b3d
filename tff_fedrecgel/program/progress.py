"""The progress display of a run: a bar on a terminal, plain lines elsewhere.

tqdm redraws its bar with carriage returns, which fill a log file or a pipe
with one long line; there the same information goes out as one line per
round instead.
"""

from __future__ import annotations

from collections.abc import Mapping
import sys
import time
from typing import Any, TextIO

import tqdm


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f'{hours}:{minutes:02d}:{seconds:02d}' if hours else f'{minutes:02d}:{seconds:02d}'


class PlainProgress:
    """tqdm's `set_postfix` / `update` / `close`, written as whole lines.

    Each `update` writes `round R/T  key=value ...  elapsed E, left L`.
    """

    def __init__(self, *, total: int, initial: int = 0, stream: TextIO | None = None,
                 clock=time.monotonic):
        """Starts the display.

        Args:
          total: The last round.
          initial: Rounds already done (a resumed run).
          stream: Where lines go (default: standard error, read when writing).
          clock: Seconds, for the elapsed and remaining times.
        """
        self._total, self._done, self._first = total, initial, initial
        self._stream, self._clock = stream, clock
        self._start = clock()
        self._postfix: dict[str, Any] = {}

    def set_postfix(self, values: Mapping[str, Any], refresh: bool = False) -> None:
        """Sets the values the next line shows (`refresh` is ignored)."""
        del refresh
        self._postfix = dict(values)

    def update(self, rounds: int = 1) -> None:
        """Counts finished rounds and writes one line."""
        self._done += rounds
        elapsed = self._clock() - self._start
        rate = elapsed / max(1, self._done - self._first)
        parts = [f'round {self._done}/{self._total}']
        parts += [f'{k}={v}' for k, v in self._postfix.items()]
        parts.append(f'elapsed {_duration(elapsed)}, left '
                     f'{_duration(rate * max(0, self._total - self._done))}')
        stream = self._stream or sys.stderr
        stream.write('  '.join(parts) + '\n')
        stream.flush()

    def close(self) -> None:
        """Nothing to clear: every line is complete."""


def progress_display(*, total: int, initial: int, enabled: bool,
                     stream: TextIO | None = None):
    """The run's progress display.

    Args:
      total: The last round.
      initial: Rounds already done.
      enabled: Whether to show progress at all.
      stream: The output (default standard error).

    Returns:
      A tqdm bar when `stream` is a terminal (or progress is off), else a
      `PlainProgress`.
    """
    stream = stream or sys.stderr
    isatty = getattr(stream, 'isatty', None)
    if not enabled or (isatty is not None and isatty()):
        return tqdm.tqdm(total=total, initial=initial, disable=not enabled, unit='round',
                         dynamic_ncols=True, file=stream)
    return PlainProgress(total=total, initial=initial, stream=stream)
