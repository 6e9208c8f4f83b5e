"""engine.service."""
