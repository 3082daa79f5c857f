"""Numba kernels: small pure functions over arrays, one module per family of kernels.

Kernels that call each other live in one module (numba's cache does not follow callees across
files).  Every kernel has a slow, obviously right Python twin (``PAIRS`` in
``tests/reference.py``), compared by hypothesis and timed by ``python -m benchmarks.bench_kernels``.

| module | kernels |
|---|---|
| ``window`` | window resolution (binary search, sampled index), copies with eot insertion, the documents a window spans |
| ``packing`` | the packing kernels by one path, and the plan drivers chaining the two below |
| ``plan_items`` | what each document becomes in a plan, and its statistics |
| ``plan_bestfit`` | one free-space index (a bitset tree): best-fit decreasing and online best fit (and their output passes to the CSR plan), the streaming packer's best fit over a batch's rows |
| ``packed_rows`` | packed-row assembly, the one row writer: bins (and the streaming packer's batches) to model inputs, by the one label rule; the pieces' documents and positions |
| ``provenance`` | a mixture batch's pieces, each source's laid into the batch's row order |
| ``streaming_batch`` | the streaming packer's batch layout (placed pieces row by row) and the gather of an in-memory source's placed pieces into one buffer |
| ``masking`` | counter-based MLM corruption of whole batches |
| ``permutation`` | the keyed Feistel permutation |
| ``mixture`` | Tijdeman's assignment over one period |
| ``store`` | offsets validation for huge indexes; the build's convert-and-check pass; XXH64 and the node cache's check of cached pages by it |
| ``eos`` | one scan for document separators in a flat token file |
| ``pagestate`` | the remote node cache's hit test (are a batch's pages all present?) |
| ``megatron_order`` | megatron-core GPTDataset's sample index; its samples' token ranges and copies |
| ``subset`` | a subset's token ranges mapped onto its parent's tokens |
"""

__all__: list[str] = []  # kernels are reached by module path
