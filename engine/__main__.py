"""``python -m engine``: see :mod:`engine.cli.main`."""

from engine.cli.main import entry

if __name__ == "__main__":
    entry()
