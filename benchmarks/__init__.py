"""Benchmark scripts: each runs as `python benchmarks/<name>.py` or `python -m benchmarks.<name>`."""
