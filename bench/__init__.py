"""Benchmarks: each prints one JSON object of measured figures (and a peer's, side by side)."""
