"""Numba kernels: small pure functions over arrays, one module per family of kernels.

Kernels that call each other live in the same module (numba's cache does not notice edits to a
jitted function in another file).  Every kernel has a slow, obviously right Python twin,
paired with it in one table (``PAIRS`` in ``tests/reference.py``) that the tests compare by
hypothesis on random inputs and ``python -m benchmarks.bench_kernels`` times side by side.

| module | kernels |
|---|---|
| ``window`` | window resolution (binary search, sampled index), copies with eot insertion, the documents a window spans |
| ``packing`` | the packing kernels by one path, and the plan drivers chaining the three below |
| ``plan_items`` | what each document becomes in a plan, and its statistics |
| ``plan_bestfit`` | one free-space index (a bitset tree): best-fit decreasing (and its output pass), online best fit, the streaming packer's best fit over a batch's rows |
| ``plan_emit`` | online best fit's placements to the CSR plan |
| ``packed_rows`` | packed-row assembly: bins to model inputs; the one label rule (also the streaming packer's); the pieces' documents and positions |
| ``provenance`` | a mixture batch's pieces, each source's laid into the batch's row order |
| ``streaming_batch`` | the streaming packer's batch layout and its one token writer (in-memory chunks and a store's ranges) |
| ``masking`` | counter-based MLM corruption of whole batches |
| ``permutation`` | the keyed Feistel permutation |
| ``mixture`` | Tijdeman's assignment over one period |
| ``store`` | offsets validation for huge indexes; the build's convert-and-check pass; XXH64 and the node cache's check of cached blocks by it |
| ``eos`` | one scan for document separators in a flat token file |
| ``blockstate`` | the remote node cache's hit test (are a batch's blocks all present?) |
| ``megatron_order`` | megatron-core GPTDataset's sample index; its samples' token ranges and copies |
| ``subset`` | a subset's token ranges mapped onto its parent's tokens |
"""

__all__: list[str] = []  # kernels are reached by module path
