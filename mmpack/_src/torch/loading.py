"""One call to a fast, resumable DataLoader over a view: :func:`loader`.

:func:`loader` returns a :class:`ResumableLoader`, a torchdata ``StatefulDataLoader`` over a
map-style dataset (any mmpack view or mixture) with a
:class:`~mmpack.ResumableSampler` (rank and world size from ``torch.distributed``
when initialised; shuffling unless the dataset orders itself, recording its ``fingerprint``),
:func:`~mmpack.torch.collate` (batches leave workers through reused shared buffers,
:mod:`mmpack._src.torch.transfer`), pinned memory with CUDA and persistent workers.  Every complete
pass advances the sampler to the next epoch; :meth:`ResumableLoader.set_epoch` chooses one.

State: :meth:`ResumableLoader.state_dict` is the sampler's state after the samples the loop has
been *given* (never those the workers prefetched), plain ints and bools, nothing about workers:
it loads at any ``num_workers`` (the same batches follow) and, by the elastic rule
(:mod:`mmpack._src.torch.elastic`), at any world size.  A plain ``StatefulDataLoader``'s state is a
:class:`~mmpack.errors.FormatError`; one of another ``fingerprint`` a
:class:`~mmpack.errors.StateMismatchError` (except one of the mixture a ``with_schedule`` change
started from, taken at or before the change).  Given a :class:`~mmpack.Stages`
run, :func:`loader` uses it as the batch sampler and its state is the run's.

Defaults: ``num_workers=0``, since a view builds a batch in a fraction of a millisecond in the
training process, overlapping an asynchronous GPU step, while workers pay a process each and a
transfer per batch (``python -m benchmarks.bench_e2e --workers``); give workers where
``__getitem__`` is slow (cold object storage, heavy per-sample work).  Cost: the DataLoader's own
plus O(1) per ``state_dict`` / ``load_state_dict`` (O(stages + edits) over Stages).
"""

from __future__ import annotations

import inspect
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from mmpack._src.core.constants import FETCH_BLOCK_BYTES, WINDOW_BLOCKS
from mmpack._src.core.sample_order import check_shuffle, order_block_bytes
from mmpack._src.core.validation import check_bool, check_int_range, check_positive_int
from mmpack._src.torch.collate import Collator
from mmpack._src.torch.collate import collate as default_collate
from mmpack._src.torch.sampler import ResumableSampler
from mmpack._src.torch.stages import Stages
from mmpack.errors import FormatError

__all__ = ["ResumableLoader", "WORKER_TIMEOUT", "loader", "read_state_file"]

_LOADER_STATE_VERSION = 1
"""Version of the dict written by :meth:`ResumableLoader.state_dict`."""

WORKER_TIMEOUT = 600.0
"""Seconds the loop waits for a worker's batch before the DataLoader raises (``RuntimeError``:
a stuck worker ends in an error, never a wait for ever); the first batch of a cold start
(compiling kernels, fetching the first window) takes far less."""

_KIND = "mmpack.torch.loader"
_SET_VITAL = "'set_vital' is deprecated"  # torch's warning for torchdata's call (see __init__)


def loader(
    view: Any,
    batch_size: int | None = None,
    *,
    seed: int = 0,
    num_workers: int = 0,
    shuffle: bool | Literal["blocks"] | None = None,
    drop_last: bool = False,
    collate: Callable[[Any], Any] = default_collate,
    rank: int | None = None,
    world_size: int | None = None,
    block_bytes: int = FETCH_BLOCK_BYTES,
    window_blocks: int = WINDOW_BLOCKS,
    timeout: float = WORKER_TIMEOUT,
    balance: Literal["attention"] | None = None,
    cp_size: int | None = None,
    cp_rank: int | None = None,
    pad_cu_seqlens: bool = False,
) -> ResumableLoader:
    """A resumable, sharded DataLoader over ``view`` (see the module docstring).

    Parameters
    ----------
    view : map-style dataset or Stages
        An mmpack view, a mixture, or any dataset with ``len`` and ``__getitem__``; or a
        :class:`~mmpack.Stages` run, which holds its own batch sizes, seed, order,
        ``drop_last``, block options, rank and world size (leave those arguments out).
    batch_size : int
        Samples per batch, ``>= 1`` (required for a view; none for Stages).
    seed : int, default 0
        Key of the sampler's permutations (the same on every rank).
    num_workers : int, default 0
        DataLoader worker processes (see the module docstring for why none by default).
    shuffle : bool or "blocks", optional
        A keyed pseudo-random order per epoch; ``"blocks"``: the block-window order over
        ``view.block_bounds(block_bytes)`` (over a remote store with a node cache the sampler
        then fetches whole blocks, :mod:`mmpack._src.torch.block_fetch`); ``False`` visits the
        samples in order.  Default (:func:`~mmpack._src.core.sample_order.check_shuffle`): ``False``
        for a view that orders itself (``view.ordered``: a mixture whose weights follow a
        schedule; ``True`` and ``"blocks"`` are refused), ``"blocks"`` over a remote store (a
        mixture of remote sources: if built with ``block_bytes``, at its size), said once
        (:class:`~mmpack.errors.DefaultOrderWarning`), else ``True``.  ``True`` over a remote
        store warns once of its cost (:class:`~mmpack.errors.SlowReadWarning`).
    drop_last : bool, default False
        ``True``: every rank gets the same number of full batches and nothing repeats (the
        sampler drops the tail that does not fill a round of ranks, the loader the last partial
        batch).  ``False``: the sampler pads the ranks' shares as ``DistributedSampler`` does and
        the last batch may be partial.
    collate : callable, default :func:`mmpack.torch.collate`
        The ``collate_fn`` (e.g. a :class:`~mmpack.torch.Collator`).
    rank, world_size : int, optional
        This process's share; default ``torch.distributed``'s when a process group is
        initialised, else 0 of 1.
    block_bytes, window_blocks : int
        With ``shuffle="blocks"``: bytes per block (default 4 MiB) and blocks per window
        (default 256).
    timeout : float, default :data:`WORKER_TIMEOUT`
        With workers: seconds the loop waits for a batch before the DataLoader raises
        ``RuntimeError`` (a stuck worker ends in an error, never a wait for ever).
    balance : "attention", optional
        Deal each step's ``batch_size * world_size`` samples to the ranks by attention cost
        (``view.attention_cost``), the costliest rank as cheap as the rule finds
        (:mod:`mmpack._src.sampling.balance`); the steps hold the same samples as without it.
    cp_size, cp_rank, pad_cu_seqlens
        The default collate's context-parallel layout and fixed-length boundaries
        (:func:`~mmpack.torch.collate`); ``rank`` and ``world_size`` are then the
        data-parallel ones (every rank of a context-parallel group loads the same batches).

    Returns
    -------
    ResumableLoader
        Batches as ``collate`` makes them: with the default, ``input_ids``, ``position_ids``,
        ``targets`` (int64, shape ``(B, seqlen)``), ``cu_seqlens`` (int32), ``cu_seqlens_rows``,
        ``max_seqlen``.

    Raises
    ------
    TypeError
        ``view`` has no ``len`` (an iterable dataset: use ``DataLoader(ds, batch_size=None)``),
        no ``batch_size`` for a view, or an argument of the wrong type.
    ValueError
        ``batch_size < 1``, ``num_workers < 0``, ``timeout <= 0``, a rank outside its world
        size, ``shuffle=True`` / ``"blocks"`` over a view that orders itself, an unknown
        ``balance``, or context-parallel options with a ``collate`` of one's own; for Stages, an
        argument the run holds itself, ``balance`` (not dealt by cost), or a rank and world size
        other than the run's.
    """
    num_workers = check_int_range(num_workers, "num_workers", 0)
    if not callable(collate):
        raise TypeError(f"collate must be callable, got {type(collate).__name__} {collate!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if cp_size is not None or cp_rank is not None or pad_cu_seqlens:
        if collate is not default_collate:
            raise ValueError(
                "cp_size, cp_rank and pad_cu_seqlens configure the default collate; give them "
                f"to your own collate ({collate!r}) instead"
            )
        collate = Collator(cp_size=cp_size, cp_rank=cp_rank, pad_cu_seqlens=pad_cu_seqlens)
    common: dict[str, Any] = dict(
        num_workers=num_workers,
        collate_fn=collate,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
        timeout=float(timeout) if num_workers > 0 else 0.0,
    )
    if isinstance(view, Stages):
        given: dict[str, Any] = dict(batch_size=batch_size, seed=seed, shuffle=shuffle)
        given.update(
            drop_last=drop_last,
            block_bytes=block_bytes,
            window_blocks=window_blocks,
            balance=balance,
        )
        return _stages_loader(view, given, rank, world_size, common)
    if not hasattr(view, "__len__") or not hasattr(view, "__getitem__"):
        raise TypeError(
            f"loader needs a map-style dataset (len and __getitem__), got {type(view).__name__}; "
            "an iterable dataset such as PackerDataset goes in DataLoader(ds, batch_size=None)"
        )
    if batch_size is None:
        raise TypeError(f"loader needs batch_size for a {type(view).__name__}, got none")
    batch_size = check_positive_int(batch_size, "batch_size")
    drop_last = check_bool(drop_last, "drop_last")
    rank, world_size = _rank_and_world(rank, world_size)
    order = check_shuffle(shuffle, view, block_bytes=block_bytes, window_blocks=window_blocks)
    blocks: dict[str, Any] = {}
    if order == "blocks":
        if not callable(getattr(view, "block_bounds", None)):
            raise TypeError(f"shuffle='blocks' needs a view with block_bounds, got {view!r}")
        if shuffle is None:  # the default over a remote store: a mixture's own block size
            block_bytes = order_block_bytes(view, block_bytes)
        blocks = dict(block_bounds=view.block_bounds(block_bytes), window_blocks=window_blocks)
    sampler = ResumableSampler(
        view,
        shuffle=order,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        **blocks,
        **_balance_costs(view, balance, batch_size),
    )
    return ResumableLoader(
        view, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **common
    )


def _balance_costs(view: Any, balance: Any, batch_size: int) -> dict[str, Any]:
    """The sampler's ``costs`` and ``batch_size`` for ``balance`` (none without it)."""
    if balance is None:
        return {}
    if balance != "attention":
        raise ValueError(f"balance must be 'attention' or None, got balance={balance!r}")
    if not callable(getattr(view, "attention_cost", None)):
        raise TypeError(f"balance='attention' needs a view with attention_cost, got {view!r}")
    return dict(costs=view.attention_cost, batch_size=batch_size)


def _stages_loader(
    view: Stages,
    given: dict[str, Any],
    rank: int | None,
    world_size: int | None,
    common: dict[str, Any],
) -> ResumableLoader:
    """:func:`loader` over a Stages run: the run is the batch sampler (see :func:`loader`)."""
    if given["balance"] is not None:
        raise ValueError(
            f"balance={given['balance']!r} is not available over Stages (a stage's step may span "
            "two epochs of its sampler); load each stage's view with loader(view, balance=...)"
        )
    del given["balance"]
    on = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not on:  # no process group: the run's own, unless given
        rank = view.rank if rank is None else rank
        world_size = view.world_size if world_size is None else world_size
    _check_stages_options(view, given, _rank_and_world(rank, world_size))
    return ResumableLoader(view.dataset, batch_sampler=view, **common)


def _check_stages_options(
    stages: Stages, given: dict[str, Any], rank_and_world: tuple[int, int]
) -> None:
    """``ValueError`` naming an argument of :func:`loader` given for ``stages`` (which holds its
    own), or a rank and world size (given, or the process group's) other than the run's."""
    defaults = inspect.signature(loader).parameters
    for name, value in given.items():
        if value is not defaults[name].default and value != defaults[name].default:
            raise ValueError(
                f"loader(Stages) takes {name} from the Stages run, got {name}={value!r}: give it "
                f"to Stages(...) (per stage for batch_size), not to loader"
            )
    ours = (stages.rank, stages.world_size)
    if rank_and_world != ours:
        raise ValueError(
            f"the Stages run deals rank {ours[0]} of {ours[1]} but this process is rank "
            f"{rank_and_world[0]} of {rank_and_world[1]}: build Stages(..., rank="
            f"{rank_and_world[0]}, world_size={rank_and_world[1]}) (its state loads at any world "
            "size)"
        )


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    on = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if on else 0
    if world_size is None:
        world_size = dist.get_world_size() if on else 1
    return rank, world_size


class ResumableLoader(StatefulDataLoader):
    """The ``StatefulDataLoader`` :func:`loader` returns: its state is its sampler's, taken at
    the samples the loop was given, and loads at any worker count and world size.

    Build it with :func:`loader`; ``sampler`` must be a
    :class:`~mmpack.ResumableSampler`, or ``batch_sampler`` a
    :class:`~mmpack.Stages` run over ``dataset`` (its :attr:`stages`; the other
    arguments are the ``StatefulDataLoader``'s).  Over a remote store in the block order the
    sampler fetches whole blocks as it is iterated (its ``window_fetcher``,
    :mod:`mmpack._src.torch.block_fetch`): this loader adds nothing to it.
    """

    sampler: ResumableSampler

    def __init__(
        self,
        dataset: Any,
        *,
        sampler: ResumableSampler | None = None,
        batch_sampler: Stages | None = None,
        **options: Any,
    ) -> None:
        self.stages = batch_sampler
        """The :class:`~mmpack.Stages` run this loader serves, or None."""
        if batch_sampler is not None and (
            sampler is not None or not isinstance(batch_sampler, Stages)
        ):
            raise TypeError(
                f"ResumableLoader's batch_sampler must be Stages (and no sampler), got "
                f"{type(batch_sampler).__name__} and {type(sampler).__name__}"
            )
        if batch_sampler is None and not isinstance(sampler, ResumableSampler):
            raise TypeError(
                f"ResumableLoader needs a ResumableSampler, got {type(sampler).__name__}"
            )
        # torchdata's own per-step snapshots (of workers and sampler) are never read: the state is
        # the sampler's or the run's (see state_dict), so none are taken.
        options.setdefault("snapshot_every_n_steps", None)
        if options.get("num_workers", 0) > 0 and not options.get("timeout"):
            options["timeout"] = WORKER_TIMEOUT  # a stuck worker: an error, never a hang
        with warnings.catch_warnings():
            # torchdata's constructor calls torch.set_vital, which torch answers with a deprecation
            # warning the user cannot act on; nothing else of the constructor is silenced.
            warnings.filterwarnings("ignore", message=_SET_VITAL, category=UserWarning)
            super().__init__(dataset, sampler=sampler, batch_sampler=batch_sampler, **options)
        self._yielded: int | None = None  # batches given by the pass under way (None: none)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass walk epoch ``epoch`` (the sampler's ``set_epoch``).

        Raises
        ------
        TypeError
            Over Stages: the run has no epoch to choose (it goes on where it stands).
        """
        if self.stages is not None:
            raise TypeError(
                f"a loader over Stages has no epoch to set (got {epoch!r}): the run goes on "
                "where it stands; load a state to move it"
            )
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self) -> Iterator[Any]:
        stages = self.stages
        if stages is not None and self._yielded is not None:
            # The last pass was cut short: go on after the batches the loop was given, not after
            # those its workers prefetched.
            stages.load_state_dict(stages.state_dict(consumed=self._yielded))
        self._yielded = 0
        for batch in super().__iter__():
            self._yielded += 1
            yield batch
        self._yielded = None
        if stages is None:
            self.sampler.set_epoch(self.sampler.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        """Where the loop stands: ``{"kind", "version", "batch_size", "num_workers", "sampler"}``
        (over Stages: ``{"kind", "version", "num_workers", "stages"}``).

        Returns
        -------
        dict
            ``sampler`` is :meth:`ResumableSampler.state_dict` after the samples of the batches
            yielded so far (after a complete pass: the start of the next epoch); ``stages``
            :meth:`Stages.state_dict <mmpack.Stages.state_dict>` after the batches
            yielded so far; ``num_workers`` is recorded for information only.  Plain ints,
            bools, strings and lists.
        """
        if self.stages is not None:
            return {
                "kind": _KIND,
                "version": _LOADER_STATE_VERSION,
                "num_workers": int(self.num_workers),
                "stages": self.stages.state_dict(consumed=self._yielded),
            }
        sampler = self.sampler
        if self._yielded is None:
            state = sampler.state_dict()
        else:
            given = min(self._yielded * int(self.batch_size or 1), sampler.handed_out)
            state = sampler.state_dict(consumed=given)
        return {
            "kind": _KIND,
            "version": _LOADER_STATE_VERSION,
            "batch_size": int(self.batch_size or 1),
            "num_workers": int(self.num_workers),
            "sampler": state,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass yields the batches that followed.

        Any ``num_workers`` and world size loads it (see the module docstring).

        Raises
        ------
        mmpack.errors.FormatError
            ``state_dict`` is not a state of this loader (e.g. a plain ``StatefulDataLoader``'s),
            or of another version; the message names what it holds.
        mmpack.errors.StateMismatchError
            It belongs to another dataset length, seed, ``shuffle``, ``drop_last`` or view
            ``fingerprint`` (naming both; a state of the mixture a ``with_schedule`` change
            started from loads if taken at or before the change).
        """
        if not isinstance(state_dict, dict) or state_dict.get("kind") != _KIND:
            keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise FormatError(
                f"not a state of mmpack.torch.loader (it holds {keys}); a state saved by a "
                "plain torchdata StatefulDataLoader records its workers and cannot be loaded here"
            )
        version = state_dict.get("version")
        if version != _LOADER_STATE_VERSION:
            raise FormatError(
                f"loader state has version {version!r}; this mmpack reads version "
                f"{_LOADER_STATE_VERSION}"
            )
        field = "sampler" if self.stages is None else "stages"
        if field not in state_dict:
            raise FormatError(
                f"loader state lacks the field {field!r} (it holds {sorted(state_dict)}): a state "
                f"of a loader over {'Stages' if field == 'sampler' else 'a view'} loads only into "
                "one of that kind"
            )
        if self.stages is not None:
            self.stages.load_state_dict(state_dict["stages"])
        else:
            self.sampler.load_state_dict(state_dict["sampler"])
        self._yielded = None


def read_state_file(path: str) -> Any:
    """The state ``torch.save`` wrote to ``path`` (a loader's, a sampler's or a Stages run's),
    read with ``weights_only=True``: plain values only, no code runs.

    Raises
    ------
    mmpack.errors.FormatError
        ``path`` is not a file ``torch.save`` wrote, or holds more than plain values; the
        message names the file.
    """
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise FormatError(f"{path} is not a state torch.save wrote ({e})") from None
