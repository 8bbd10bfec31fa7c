"""Benchmarks of sglang-r3: ``python -m benchmarks.run [--quick]`` (see benchmarks/README.md)."""
