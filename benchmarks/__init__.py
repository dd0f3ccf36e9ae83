"""Benchmark suite for rlocks: ``python -m benchmarks --help``.

Kept import-light on purpose: worker processes are started with ``spawn`` and re-import this
package, so nothing heavy (matplotlib, the lock libraries) is imported here.
"""
