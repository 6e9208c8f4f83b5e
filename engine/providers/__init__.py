"""engine.providers."""
