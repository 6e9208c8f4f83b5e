"""engine.capacity."""
