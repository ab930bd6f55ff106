"""One updating progress line on stderr (a line every few seconds when it is not a terminal)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, quiet: bool, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.nested = 0
        self.errors = 0
        self.phase = "load"
        self._quiet = quiet
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._began = time.perf_counter()
        self._task: asyncio.Task[None] | None = None
        self._open = False  # a \r line is on the terminal without its newline yet

    def start(self) -> None:
        self._began = time.perf_counter()
        if not self._quiet:
            self._task = asyncio.create_task(self._tick())

    def note(self, text: str) -> None:
        """A one-off status (set-up, history check) on the same line."""
        if not self._quiet:
            self._write(text)

    async def stop(self) -> None:
        """Leaves the final progress line in place; a status note is wiped instead."""
        final = self._task is not None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
            self._write(self._line())
        if self._open:
            self._stream.write("\n" if final else "\r\x1b[K")
            self._stream.flush()
            self._open = False

    def _line(self) -> str:
        elapsed = time.perf_counter() - self._began
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (
            f"loadtest: {self.done}/{self.total} programs  {rate:.1f}/s  "
            f"nested {self.nested}  errors {self.errors}  {elapsed:.1f}s"
        )

    async def _tick(self) -> None:
        interval = 0.25 if self._tty else 5.0
        while True:
            await asyncio.sleep(interval)
            self._write(self._line())

    def _write(self, text: str) -> None:
        if self._tty:
            self._stream.write("\r\x1b[K" + text)
            self._open = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()
