"""Run a command in a pseudo-terminal of a given size and read what a terminal would show.

:func:`run_in_pty` gives the child a pty as stdin and stdout (stderr apart, on a pipe) with the
window size set by ``TIOCSWINSZ``, and returns every byte it wrote. :class:`Screen` replays
those bytes as a terminal of that width does (printable text, ``\\r``, ``\\n``, erase-line and
cursor-up sequences; colours and cursor visibility ignored) and records whether any line wrapped
past the width.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable

__all__ = ["PtyResult", "Screen", "run_in_pty"]

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


class PtyResult:
    """A child run in a pty: its exit status, what it wrote to the terminal, and its stderr."""

    def __init__(self, code: int, raw: str, err: str) -> None:
        self.code = code
        self.raw = raw
        self.err = err

    def __repr__(self) -> str:
        return f"PtyResult(code={self.code}, raw={self.raw!r}, err={self.err!r})"


def run_in_pty(
    cmd: list[str],
    env: dict[str, str],
    *,
    columns: int,
    rows: int = 24,
    timeout: float = 60.0,
    interrupt_when: Callable[[str], bool] | None = None,
) -> PtyResult:
    """Run ``cmd`` with a ``columns`` x ``rows`` pty as its terminal until it exits (blocking).

    ``interrupt_when(output so far)`` true sends it SIGINT once, as Ctrl-C would."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(
        cmd, stdin=slave, stdout=slave, stderr=subprocess.PIPE, env={**env, "TERM": "xterm"}
    )
    os.close(slave)
    out = bytearray()
    interrupted = False
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"no exit within {timeout} s; output {bytes(out)!r}")
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
            if (
                interrupt_when is not None
                and not interrupted
                and interrupt_when(out.decode(errors="replace"))
            ):
                proc.send_signal(signal.SIGINT)
                interrupted = True
        code = proc.wait(timeout=timeout)
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        os.close(master)
    # The pty turns each \n into \r\n.
    return PtyResult(code, out.decode(errors="replace").replace("\r\n", "\n"), err)


class Screen:
    """A terminal ``width`` columns wide, fed the bytes a program wrote."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = [""]
        self.row = 0
        self.col = 0
        #: Lines that went past the width (a terminal would have wrapped them).
        self.wrapped = 0
        #: Newlines written (each one scrolls or moves down).
        self.newlines = 0

    def feed(self, text: str) -> Screen:
        """Interpret ``text``; return self."""
        text = _OSC.sub("", text)
        i = 0
        while i < len(text):
            match = _CSI.match(text, i)
            if match:
                self._csi(match.group(1), match.group(2))
                i = match.end()
                continue
            ch = text[i]
            i += 1
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.newlines += 1
                self.row += 1
                self.col = 0
                while len(self.lines) <= self.row:
                    self.lines.append("")
            elif ch == "\x1b":
                continue  # a lone escape (charset selection and the like): ignored
            elif ch >= " " or ch == "\t":
                if self.col >= self.width:
                    self.wrapped += 1
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + ch + line[self.col + 1 :]
                self.col += 1
        return self

    def _csi(self, params: str, final: str) -> None:
        if final == "K":  # erase in line: 0 (default) to the end, 1 to the start, 2 all
            mode = params or "0"
            line = self.lines[self.row]
            if mode == "2":
                self.lines[self.row] = ""
            elif mode == "1":
                self.lines[self.row] = " " * self.col + line[self.col :]
            else:
                self.lines[self.row] = line[: self.col]
        elif final == "A":  # cursor up
            self.row = max(0, self.row - int(params or "1"))
        elif final == "G":  # cursor to column
            self.col = int(params or "1") - 1
        # m (colours), h/l (modes such as cursor visibility), others: no effect on the text.

    def visible(self) -> list[str]:
        """The screen's lines, trailing blanks removed, without the empty last line."""
        lines = [line.rstrip() for line in self.lines]
        while lines and not lines[-1]:
            lines.pop()
        return lines
