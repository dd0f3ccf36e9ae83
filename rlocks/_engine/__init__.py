"""The shared lock engine (see docs/design/core.md)."""
