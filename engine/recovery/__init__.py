"""engine.recovery."""
