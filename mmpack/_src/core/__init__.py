"""The bottom layer's rules, imported by every layer above and importing none of them.

::

    constants.py   numbers every layer agrees on (IGNORE_INDEX, INT32_MAX, UINT64_LIMIT)
    options.py     options that take one of a few names, as StrEnums (one error message)
    validation.py  argument checks shared by every entry point (one wording per mistake)
    permutation_keys.py  the keys of the keyed permutations (seed -> Feistel round keys)
    libc.py        the system calls the standard library does not wrap (ctypes, one home)
    progress.py    progress bars with a total and an ETA, quiet unless asked
    fingerprints.py  the digest of a configuration (what decides a dataset's samples)
"""

__all__: list[str] = []
