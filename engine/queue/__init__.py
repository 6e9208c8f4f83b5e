"""engine.queue."""
