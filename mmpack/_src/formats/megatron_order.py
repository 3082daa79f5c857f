"""megatron-core's ``GPTDataset`` sample order, computed over a store: its document index, sample
index and shuffle index, array for array.

A ``GPTDataset`` (megatron-core 0.16) draws fixed-length samples from *sequences* (the
``.idx``'s sequences: a document's sentences with ``--split-sentences``, else the documents):

1. **Sequences**: split ``[a, b)`` of the normalised ``split`` string gets the sequences
   ``[round(a * S), round(b * S))``; a split of weight 0 is not built (:func:`split_sequences`).
2. **Epochs**: ``E`` = the fewest epochs whose tokens hold ``num_samples * seqlen + extra``
   (``extra`` = 1 with ``add_extra_token_to_sequence``); the last is shuffled apart when it
   contributes fewer than ``int(0.8 * per_epoch)`` samples.
3. **Document index**: ``numpy.random.RandomState(seed)`` shuffles the sequences repeated ``E``
   times (or ``E - 1``, then the last epoch alone): int32.
4. **Sample index**: the ``N + 1`` boundaries of samples of ``seqlen + extra`` tokens as (entry,
   offset) pairs (:mod:`mmpack._src.kernels.megatron_order`), a kept padded last validation sample
   counted as megatron-core counts it; int32 unless a count passes ``2**31 - 1``.
5. **Shuffle index**: the same ``RandomState`` shuffles ``range(N)`` (the separate final epoch
   on its own); sample ``i`` is sample ``shuffle_index[i]`` of the sample index.

Cost: O(E * n + N) time and memory, as in megatron-core, mostly the two shuffles
(``python -m benchmarks.bench_megatron_order``, against megatron-core's own construction;
docs/benchmarks.md).  :func:`cached_order` keeps the arrays in the store's cache folder
(:mod:`mmpack._src.formats.arrayfile`), keyed by the fingerprint and every parameter.  A split
without tokens (megatron-core loops forever) is refused with ``ValueError``.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from mmpack._src.core.options import MegatronSplit, parse_option
from mmpack._src.core.validation import (
    check_bool,
    check_in_range,
    check_int_range,
    check_positive_int,
)
from mmpack._src.formats.arrayfile import load_arrays, save_arrays
from mmpack._src.formats.megatron import MegatronStore, read_index
from mmpack._src.kernels.megatron_order import fill_sample_index
from mmpack._src.store.integrity import stripe_digest
from mmpack._src.store.reader import TokenStore
from mmpack.errors import FormatError, StateMismatchError

__all__ = [
    "MegatronOrder",
    "StoreSequences",
    "build_order",
    "cached_order",
    "split_sequences",
    "store_sequences",
]

_SEED_LIMIT = 2**32  # numpy.random.RandomState takes seeds in [0, 2**32)
_INT32_MAX = np.iinfo(np.int32).max
_SEPARATE_THRESHOLD = 0.80
_KEY_VERSION = 1


def split_sequences(split: str, index_split: Any, num_sequences: int) -> np.ndarray:
    """The sequences (int32, ascending) that ``BlendedMegatronDatasetBuilder`` gives split
    ``index_split`` of ``num_sequences`` under the ``split`` string (``"969,30,1"``: up to three
    non-negative weights, normalised; missing ones are 0).

    Raises ``ValueError`` for a malformed string or a split of weight 0 (megatron-core builds no
    dataset for it)."""
    part = parse_option(MegatronSplit, index_split, "index_split")
    if not isinstance(split, str):
        raise TypeError(f"split must be a str such as '969,30,1', got {type(split).__name__}")
    weights = [float(w) for w in re.findall(r"[.0-9]+", split)]
    if not weights or len(weights) > 3 or sum(weights) <= 0:
        raise ValueError(
            f"split must hold one to three non-negative weights, not all 0, got {split!r}"
        )
    weights += [0.0] * (3 - len(weights))
    w = np.asarray(weights, dtype=np.float64)
    normalised = (w / np.sum(w)).tolist()
    bookends = [0.0]
    for x in normalised:
        bookends.append(bookends[-1] + x)
    k = list(MegatronSplit).index(part)
    lo, hi = bookends[k], bookends[k + 1]
    if hi <= lo:
        raise ValueError(f"split={split!r} gives the {part.value} split no weight: it is not built")
    beg = int(round(lo * float(num_sequences)))
    end = int(round(hi * float(num_sequences)))
    return np.arange(beg, end, dtype=np.int32)


class StoreSequences:
    """The sequences a ``GPTDataset`` sees in a store: ``sizes`` (int32, (S,)) and where each
    starts in the store's flat tokens, ``pointers[s] // itemsize`` (int64, (S,)).  A Megatron
    store gives its ``.idx``'s sequences (byte pointers, mapped); any other store its documents
    (token offsets, ``itemsize`` 1)."""

    __slots__ = ("itemsize", "pointers", "sizes")

    def __init__(self, sizes: np.ndarray, pointers: np.ndarray, itemsize: int) -> None:
        self.sizes = sizes
        self.pointers = pointers
        self.itemsize = itemsize

    def __len__(self) -> int:
        return int(self.sizes.shape[0])


def store_sequences(store: TokenStore) -> StoreSequences:
    """:class:`StoreSequences` of ``store``; the ``.idx`` of a Megatron store is validated again
    and must still describe the store's documents (``FormatError`` otherwise)."""
    if isinstance(store, MegatronStore):
        index = read_index(store.location)
        offsets, num_tokens = index.token_offsets()  # validates lengths and pointers
        if num_tokens != store.num_tokens or not np.array_equal(offsets, store.offsets):
            raise FormatError(f"{index.path} changed since the store was opened")
        if index.sequence_count > _INT32_MAX:
            raise ValueError(f"{index.path}: {index.sequence_count} sequences exceed int32")
        return StoreSequences(
            index.sequence_lengths, index.sequence_pointers, int(index.dtype.itemsize)
        )
    lens = store.doc_lens
    if len(store) > _INT32_MAX or (lens.size and int(lens.max()) > _INT32_MAX):
        raise ValueError(
            f"{store!r}: megatron-core's sequence lengths and indices are int32; this store's "
            "documents do not fit"
        )
    return StoreSequences(lens.astype(np.int32), store.offsets[:-1], 1)


class MegatronOrder:
    """The three indices of a ``GPTDataset`` (see the module docstring); built by
    :func:`build_order`.

    Attributes
    ----------
    document_index : numpy.ndarray, int32, (E * n,)
    sample_index : numpy.ndarray, int32 or int64, (N + 1, 2)
    shuffle_index : numpy.ndarray, uint32 or int64, (N,)
    num_epochs, tokens_per_epoch : int
    separate_final_epoch : bool
    seqlen : int
    extra : int
        1 with ``add_extra_token_to_sequence`` (samples read ``seqlen + 1`` tokens), else 0.
    """

    def __init__(
        self,
        document_index: np.ndarray,
        sample_index: np.ndarray,
        shuffle_index: np.ndarray,
        *,
        num_epochs: int,
        tokens_per_epoch: int,
        separate_final_epoch: bool,
        seqlen: int,
        extra: int,
    ) -> None:
        self.document_index = document_index
        self.sample_index = sample_index
        self.shuffle_index = shuffle_index
        self.num_epochs = num_epochs
        self.tokens_per_epoch = tokens_per_epoch
        self.separate_final_epoch = separate_final_epoch
        self.seqlen = seqlen
        self.extra = extra

    def __len__(self) -> int:
        return int(self.shuffle_index.shape[0])

    def __repr__(self) -> str:
        return (
            f"MegatronOrder({len(self)} samples of {self.seqlen}+{self.extra} tokens, "
            f"{self.num_epochs} epochs of {self.tokens_per_epoch} tokens, "
            f"separate_final_epoch={self.separate_final_epoch})"
        )

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "document_index": self.document_index,
            "sample_index": self.sample_index,
            "shuffle_index": self.shuffle_index,
        }

    def facts(self) -> dict[str, Any]:
        return {
            "num_epochs": self.num_epochs,
            "tokens_per_epoch": self.tokens_per_epoch,
            "separate_final_epoch": self.separate_final_epoch,
            "seqlen": self.seqlen,
            "extra": self.extra,
        }

    def check(self, num_sequences: int, where: str) -> None:
        """Refuse (``FormatError``) arrays a reader could not serve: wrong shapes or dtypes,
        entries outside the sequences, the sample index or the samples."""
        di, si, sh = self.document_index, self.sample_index, self.shuffle_index
        n = sh.shape[0]
        if (
            di.dtype != np.int32
            or di.ndim != 1
            or si.ndim != 2
            or si.shape != (n + 1, 2)
            or si.dtype not in (np.int32, np.int64)
            or sh.dtype not in (np.uint32, np.int64)
        ):
            raise FormatError(f"{where}: the order's arrays have the wrong shapes or dtypes")
        if di.size == 0 or int(di.min()) < 0 or int(di.max()) >= num_sequences:
            raise FormatError(f"{where}: the document index names sequences outside the store")
        entries = si[:, 0]
        if int(entries.min()) < 0 or int(entries.max()) >= di.size or np.any(np.diff(entries) < 0):
            raise FormatError(f"{where}: the sample index is out of range or decreases")
        if n and (int(sh.min()) < 0 or int(sh.max()) >= n):
            raise FormatError(f"{where}: the shuffle index names samples outside the order")


def _num_epochs(tokens_per_epoch: int, num_samples: int | None, seqlen: int, extra: int) -> int:
    if num_samples is None:
        return 1
    requested = num_samples * seqlen + extra
    return max(1, -(-requested // tokens_per_epoch))


def _separate_final_epoch(
    epochs: int, tokens: int, num_samples: int | None, seqlen: int, extra: int
) -> tuple[bool, int]:
    """``(separate, samples of the first E - 1 epochs)`` (megatron-core's rule, see step 2)."""
    if epochs == 1 or num_samples is None:
        return False, 0
    sans_final = ((epochs - 1) * tokens - extra) // seqlen
    from_final = num_samples - sans_final
    per_epoch = (tokens - extra) // seqlen
    if not 0 <= from_final <= per_epoch + 1:  # megatron-core asserts this too
        raise ValueError(
            f"num_samples={num_samples} leaves {from_final} samples for the last of {epochs} "
            f"epochs of {per_epoch}: megatron-core refuses this dataset"
        )
    return from_final < int(_SEPARATE_THRESHOLD * per_epoch), sans_final


def _shuffled(values: np.ndarray, epochs: int, rng: np.random.RandomState) -> np.ndarray:
    out = np.tile(values.astype(np.int32, copy=False), epochs)
    rng.shuffle(out)
    return out


def _num_samples(total: int, seqlen: int, extra: int, drop_last: bool) -> int:
    if drop_last:
        return (total - extra) // seqlen
    # megatron-core's helper divides in float32 and takes the ceiling
    return int(np.ceil(np.float32(total - extra) / np.float32(seqlen)))


def _shuffle_index(first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(first, dtype=dtype)
    rng.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    rng.shuffle(tail)
    return np.concatenate((head, tail))


def build_order(
    sizes: np.ndarray,
    sequences: np.ndarray,
    seqlen: int,
    *,
    seed: int,
    num_samples: int | None = None,
    index_split: Any = "train",
    add_extra_token: bool = True,
    drop_last_partial_validation_sequence: bool = True,
) -> MegatronOrder:
    """The indices of ``GPTDataset(ds, path, sequences, num_samples, index_split, config)``
    with ``config.random_seed=seed``, ``sequence_length=seqlen`` and the two options.

    Parameters
    ----------
    sizes : numpy.ndarray, int32, (S,)
        Every sequence's length (the ``.idx``'s ``sequence_lengths``), all ``>= 0``.
    sequences : numpy.ndarray, integer, (n,)
        The split's sequences (``GPTDataset``'s ``indexed_indices``), each in ``[0, S)``.
    seqlen : int
        ``sequence_length``, ``>= 1``.
    num_samples : int, optional
        The split's requested sample count (Megatron's ``train_iters * global_batch_size`` for
        the training split); None: one epoch.
    """
    seqlen = check_positive_int(seqlen, "seqlen")
    seed = check_in_range(seed, "seed", 0, _SEED_LIMIT)
    if num_samples is not None:
        num_samples = check_int_range(num_samples, "num_samples", 0)
    part = parse_option(MegatronSplit, index_split, "index_split")
    extra = int(check_bool(add_extra_token, "add_extra_token"))
    keep_partial = part == MegatronSplit.VALID and not check_bool(
        drop_last_partial_validation_sequence, "drop_last_partial_validation_sequence"
    )
    sizes = np.asarray(sizes)
    seqs = np.asarray(sequences)
    if seqs.ndim != 1 or (seqs.size and seqs.dtype.kind not in "iu"):
        raise TypeError(f"sequences must be a 1-D integer array, got {seqs.dtype} {seqs.shape}")
    if seqs.size and (int(seqs.min()) < 0 or int(seqs.max()) >= sizes.shape[0]):
        raise ValueError(f"sequences must lie in [0, {sizes.shape[0]}), the store's sequences")
    seqs = seqs.astype(np.int64, copy=False)
    tokens = int(np.sum(sizes[seqs], dtype=np.int64))
    if tokens == 0:
        raise ValueError(
            f"the {part.value} split ({seqs.size} sequences) holds no token: megatron-core "
            "cannot draw a sample from it"
        )
    epochs = _num_epochs(tokens, num_samples, seqlen, extra)
    separate, sans_final = _separate_final_epoch(epochs, tokens, num_samples, seqlen, extra)
    rng = np.random.RandomState(seed)
    if separate:
        parts = (_shuffled(seqs, epochs - 1, rng), _shuffled(seqs, 1, rng))
        document_index = np.concatenate(parts)
    else:
        document_index = _shuffled(seqs, epochs, rng)
    total = epochs * tokens
    n = _num_samples(total, seqlen, extra, not keep_partial)
    wide = max(document_index.shape[0], int(sizes.max())) > _INT32_MAX
    sample_index = np.empty((n + 1, 2), dtype=np.int64 if wide else np.int32)
    fill_sample_index(sizes, document_index, seqlen, extra, total, sample_index)
    if not wide and n and int(sample_index[-1, 1]) < 0:
        # a kept partial sample ending on an empty sequence: megatron-core's check of its int32
        # sample index fails there (the int64 path has no such check)
        raise ValueError(
            f"the {part.value} split's last, partial sample ends on an empty sequence: "
            "megatron-core refuses this dataset (its sample index check fails)"
        )
    shuffle_index = _shuffle_index(sans_final if separate else n, n, rng)
    return MegatronOrder(
        document_index,
        sample_index,
        shuffle_index,
        num_epochs=epochs,
        tokens_per_epoch=tokens,
        separate_final_epoch=separate,
        seqlen=seqlen,
        extra=extra,
    )


def order_key(
    store: TokenStore, sequences: np.ndarray, seqlen: int, options: dict[str, Any]
) -> dict[str, Any]:
    """Everything a cached order depends on: the store's fingerprint, the split's sequences (by
    XXH64 digest), ``seqlen`` and the options of :func:`build_order`."""
    seqs = np.ascontiguousarray(sequences, dtype=np.int64)
    return {
        "format": _KEY_VERSION,
        "order": "megatron-core GPTDataset",
        "fingerprint": str(store.fingerprint),
        "sequences": [int(seqs.shape[0]), stripe_digest(seqs)],
        "seqlen": int(seqlen),
        **{k: (v.value if isinstance(v, MegatronSplit) else v) for k, v in options.items()},
    }


def cached_order(
    store: TokenStore,
    sequences: StoreSequences,
    split: np.ndarray,
    seqlen: int,
    *,
    cache: bool = True,
    **options: Any,
) -> MegatronOrder:
    """:func:`build_order` over ``sequences`` of ``store``, kept in
    ``<store cache folder>/megatron-order-<key>.mmarr`` (see the module docstring).

    A cached file is used when its key (:func:`order_key`) matches and its digests and ranges
    check; a damaged or mismatching one is rebuilt and replaced, with a warning.  A cache
    folder that cannot be written means the order is computed in memory, silently;
    ``cache=False`` neither reads nor writes it."""
    key = order_key(store, split, seqlen, options)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(store.cache_dir) / f"megatron-order-{digest}.mmarr"
    if cache and path.is_file():
        try:
            return _load(path, key, len(sequences))
        except (FormatError, StateMismatchError) as exc:
            warnings.warn(f"rebuilding the Megatron order: {exc}", stacklevel=2)
        except OSError:
            pass
    order = build_order(sequences.sizes, split, seqlen, **options)
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_arrays(path, key, order.arrays(), order.facts())
        except OSError:
            pass
    return order


def _load(path: Path, key: dict[str, Any], num_sequences: int) -> MegatronOrder:
    arrays, facts = load_arrays(path, key)
    try:
        order = MegatronOrder(
            arrays["document_index"],
            arrays["sample_index"],
            arrays["shuffle_index"],
            num_epochs=int(facts["num_epochs"]),
            tokens_per_epoch=int(facts["tokens_per_epoch"]),
            separate_final_epoch=bool(facts["separate_final_epoch"]),
            seqlen=int(facts["seqlen"]),
            extra=int(facts["extra"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: unexpected arrays or facts ({exc})") from None
    order.check(num_sequences, str(path))
    return order
