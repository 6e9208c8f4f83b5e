"""engine.db."""
