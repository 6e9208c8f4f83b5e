"""``python -m engine``: see :mod:`engine.cli.main`."""

from engine.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
