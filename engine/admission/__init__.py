"""engine.admission."""
