"""engine.load."""
