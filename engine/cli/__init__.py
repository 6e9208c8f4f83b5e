"""engine.cli."""
