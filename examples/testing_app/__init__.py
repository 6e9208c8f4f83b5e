"""An example app that embeds engine, with its test suite (docs/testing.md walks through it)."""
