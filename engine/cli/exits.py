"""The exit statuses of ``python -m engine``.

Standard library only: the parser's epilog (``--help``) lists them without loading anything
heavy (:mod:`engine.cli.args`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_RUNNING", "EXIT_OK", "EXIT_USAGE"]

#: Success, including a graceful shutdown of ``run``.
EXIT_OK: Final = 0
#: An engine error or an unexpected exception.
EXIT_ERROR: Final = 1
#: Invalid configuration or command line (as argparse; ``engine.config.config_problems_exit_code``).
EXIT_USAGE: Final = 2
#: ``db status``: the embedded server is not running (as ``pg_ctl status``).
EXIT_NOT_RUNNING: Final = 3
#: Interrupted by Ctrl-C, or a second SIGINT/SIGTERM during a graceful shutdown.
EXIT_INTERRUPTED: Final = 130
