"""The deterministic simulator (docs/simulator.md)."""
