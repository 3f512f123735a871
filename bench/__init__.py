"""Benchmarks of the rindle engine (run the modules as scripts; see bench/README.md)."""
