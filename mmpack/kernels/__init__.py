"""Numba kernels: small pure functions over arrays, one module per family of kernels.

Kernels that call each other live in the same module (numba's cache does not notice edits to a
jitted function in another file).  Every kernel has a slow, obviously right Python twin in the
tests (``tests/reference.py``), compared by hypothesis.
"""
