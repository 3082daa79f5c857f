"""The store core: mmpack's local format, written and read; its modules::

    format.py      metadata record, little-endian dtypes, stripe checksums, fingerprint
    backends/      where the two arrays live (memmap, Zarr v3) behind one reading interface
    opening.py     open_store (``mmpack.open``): dispatch, the unchanged-while-opening loop
    reader.py      TokenStore: validated at open, memory-mapped, picklable
    integrity.py   block checksums: verify(), verify_reads, the digests a build writes
    checked_file.py  named arrays behind a checksummed header (plans, cached orders): the reader
    writer.py      build / StoreWriter: streaming, validated, published atomically
    doc_order.py   a build's keyed document order (``shuffle_docs``): the order, the rewrite
    tokenfile.py   the token file a build streams into (convert, check, hash, write)
    stripe_writer.py the writer thread and the hash thread behind tokenfile
    gather.py      the documents a build takes from lists, arrays and generators
    tokens.py      one document's tokens checked and converted (the rules of ``build``)
    lossmask.py    per-token loss masks: document dicts, the mask rule, the mask store's checks
    fields.py      per-document fields: columns, categories, their files and records
    documents.py   what every store offers over its documents: fields, select / where / split
    subset.py      SubsetBackend: a store over some documents of another, no token copied
    publish.py     temporary folders, the atomic swap, what ``overwrite`` may replace
    vocab.py       the tokenizer a store records: ids for views, vocabulary/mixing checks
    registry.py    the kinds of store the adapters add (URLs, other formats, joins)

The adapters (:mod:`mmpack._src.remote`, :mod:`mmpack.formats`, :mod:`mmpack._src.joins`) import from it
and register in :mod:`mmpack._src.store.registry`; the core imports none of them.
"""

__all__: list[str] = []
