"""Sequence-length stages: views of one store at different ``seqlen`` and batch sizes, in turn.

``Stages([(budget_0, view_0, batch_size_0), ...])`` serves stage 0's batches, then stage 1's, as
one resumable run.  Stage ``i`` draws from its own :class:`~mmpack.ResumableSampler`
over view ``i``, keyed by :func:`stage_seed` ``(seed, i)``, epoch after epoch.  A *step* is one
batch on every rank (``batch_size_i * world_size`` samples, each counting ``view_i.seqlen`` tokens
with ``unit="tokens"``); stage ``i`` ends at the first step boundary where what it served on all
ranks reaches ``budget_i``, so every rank ends a stage on the same step, at any world size.

The position is ``(stage, served, the stage sampler's epoch / position / offset)``: arithmetic,
O(stages + edits) to advance over any number of batches (the run's epoch walk,
:meth:`mmpack._src.sampling.dealing.Dealing.draws`).
``state_dict`` names the stage and holds its sampler's state, so a resume at any world size
continues the stage as an elastic resume of its sampler does (:mod:`mmpack._src.torch.elastic`).
:meth:`Stages.skip` and :meth:`Stages.replay` edit one stage's sampler in its global positions
(``e * n_i + j``; :meth:`Stages.positions_of` maps steps to them); a budget counts what a stage
*serves*, so edits change which samples a step holds, never how many steps a stage has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from mmpack._src.core.constants import FETCH_BLOCK_BYTES, WINDOW_BLOCKS
from mmpack._src.core.fingerprints import config_fingerprint
from mmpack._src.core.sample_order import check_shuffle, order_block_bytes
from mmpack._src.core.validation import check_int
from mmpack._src.sampling.sampler_state import STATE_VERSION
from mmpack._src.torch.sampler import ResumableSampler
from mmpack.errors import FormatError, StateMismatchError

__all__ = ["StageDataset", "Stages", "stage_seed"]

UNITS = ("samples", "tokens")
_FIELDS = ("version", "unit", "stages", "stage", "served", "step", "edits", "sampler")

Point = tuple[int, int, int, int, int]
"""``(stage, served, epoch, position, offset)``: where the next batch starts."""


def stage_seed(seed: int, stage: int) -> int:
    """The seed of stage ``stage``'s sampler: a 64-bit digest of ``(seed, stage)``."""
    digest = hashlib.blake2b(f"mmpack.stages:{seed}:{stage}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class StageDataset:
    """The map-style dataset of a :class:`Stages` run: ``dataset[(stage, i)]`` is
    ``views[stage][i]`` (what a DataLoader given ``batch_sampler=stages`` fetches)."""

    def __init__(self, views: Sequence[Any]) -> None:
        self.views = list(views)

    def __len__(self) -> int:
        return sum(len(v) for v in self.views)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        stage, index = key
        return self.views[stage][index]

    def __getitems__(self, keys: list[tuple[int, int]]) -> Any:
        """A batch of one stage as its view's ``__getitems__`` gives it (one call)."""
        stages = {stage for stage, _ in keys}
        view = self.views[next(iter(stages))] if len(stages) == 1 else None
        get = getattr(view, "__getitems__", None)
        if not callable(get):
            return [self[key] for key in keys]
        return get([index for _, index in keys])


class Stages:
    """A run over stages of (budget, view, batch size), with one resumable position.

    Parameters
    ----------
    stages : sequence of (int, view, int)
        ``(budget, view, batch_size)`` per stage: the stage's budget in ``unit`` (``>= 1``), its
        dataset (``len(view) >= 1``; with ``unit="tokens"`` it has an int ``seqlen``: a
        :class:`~mmpack.Mixture` has its sources' common one) and the
        batch size of each rank (``>= 1``).
    seed : int, default 0
        Stage ``i``'s order is keyed by :func:`stage_seed` ``(seed, i)``.
    unit : "samples" or "tokens", default "samples"
        What budgets count (see the module docstring for the rule that ends a stage).
    rank, world_size, shuffle, drop_last
        As for :class:`~mmpack.ResumableSampler`, for every stage's sampler,
        given the stage's view (its default order by the same rule); ``shuffle="blocks"``: each
        stage in the block-window order over its view's ``block_bounds(block_bytes)``.
    block_bytes, window_blocks : int
        The block order's bytes per block (4 MiB) and blocks per window (256), every stage's.

    Notes
    -----
    Iterating yields, per step, this rank's batch: a list of ``(stage, index)`` pairs (``index``
    an :class:`~mmpack.store.EpochIndex`).  ``mmpack.torch.loader(stages)`` serves
    them with a state that loads at any worker count and world size; a DataLoader given it as
    ``batch_sampler`` with :attr:`dataset` gets each batch as ``batch_size`` samples of its
    stage's view.  A later iterator continues where the previous one stood (the run does not
    restart); with a DataLoader whose workers prefetch, save ``state_dict(consumed=batches)``.
    """

    def __init__(
        self,
        stages: Sequence[tuple[int, Any, int]],
        *,
        seed: int = 0,
        unit: str = "samples",
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool | Literal["blocks"] | None = None,
        drop_last: bool = False,
        block_bytes: int = FETCH_BLOCK_BYTES,
        window_blocks: int = WINDOW_BLOCKS,
    ) -> None:
        if unit not in UNITS:
            raise ValueError(f"unit must be 'samples' or 'tokens', got unit={unit!r}")
        stages = list(stages)
        if not stages:
            raise ValueError("stages must hold at least one (budget, view, batch_size)")
        self._unit, self._views, self._budgets, self._batch, self._tokens = unit, [], [], [], []
        self._samplers: list[ResumableSampler] = []
        for i, stage in enumerate(stages):
            if not isinstance(stage, (tuple, list)) or len(stage) != 3:
                raise ValueError(f"stages[{i}] must be (budget, view, batch_size), got {stage!r}")
            budget, view, batch = stage
            self._budgets.append(_positive(budget, f"stages[{i}] budget"))
            self._batch.append(_positive(batch, f"stages[{i}] batch_size"))
            tokens = 1
            if unit == "tokens":
                tokens = _tokens_per_sample(view, i)
            self._tokens.append(tokens)
            self._views.append(view)
            order, blocks = _order(shuffle, view, i, block_bytes, window_blocks)
            own = getattr(view, "fingerprint", None)  # else the sampler takes the view's own
            sampler = ResumableSampler(
                view,
                seed=stage_seed(seed, i),
                rank=rank,
                world_size=world_size,
                shuffle=order,
                drop_last=drop_last,
                fingerprint=None
                if isinstance(own, str)
                else f"stages[{i}]: {len(view)} samples of {tokens} {unit}",
                **blocks,
            )
            if len(sampler) == 0:
                raise ValueError(
                    f"stages[{i}]'s view has {len(view)} samples: too few for one per rank "
                    f"(world_size={world_size}, drop_last={drop_last})"
                )
            self._samplers.append(sampler)
        self._world_size = world_size
        self._config = (seed, unit, drop_last, [s.shuffle for s in self._samplers])
        self._point: Point = (0, 0, 0, 0, 0)
        self._step = 0  # steps served before _point
        self._handed = 0
        self.dataset = StageDataset(self._views)
        """The map-style dataset to give a DataLoader with ``batch_sampler=self``."""

    @property
    def fingerprint(self) -> str:
        """32 hex digits of what decides the run's batches: the seed, unit, ``drop_last``, each
        stage's order, budget, batch size, and its view's ``fingerprint`` (each stage's sampler
        records its view's, and checks it on load)."""
        stages = [[*sig[:2], s.fingerprint] for sig, s in zip(self._signature(), self._samplers)]
        return config_fingerprint("Stages", *self._config, stages)

    @property
    def stage(self) -> int:
        """The stage of the next batch (``len(stages)`` once the run is over)."""
        return self._normal(self.position)[0]

    @property
    def step(self) -> int:
        """The step of the next batch: the batches handed out since the run began, on each rank
        (a step is one batch on every rank, at any world size; a DataLoader's prefetching workers
        may have taken some the loop has not consumed)."""
        return self._step + self._handed

    @property
    def position(self) -> Point:
        """``(stage, served, epoch, position, offset)`` where the next batch starts."""
        return self._advance(self._point, self._handed)

    def batch_size(self, stage: int) -> int:
        return self._batch[stage]

    @property
    def rank(self) -> int:
        """This process's rank among :attr:`world_size`."""
        return self._samplers[0].rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def __len__(self) -> int:
        """Batches this rank gets from the current position to the end of the run."""
        stage, served, *_ = self._normal(self.position)
        total = 0
        for s in range(stage, len(self._budgets)):
            total += self._steps_left(s, served if s == stage else 0)
        return total

    # -- arithmetic ------------------------------------------------------------------------------

    def _per_step(self, s: int) -> int:
        return self._batch[s] * self._world_size * self._tokens[s]

    def _steps_left(self, s: int, served: int) -> int:
        return max(0, -(-(self._budgets[s] - served) // self._per_step(s)))

    def _normal(self, point: Point) -> Point:
        """``point`` moved past stages whose budget is reached."""
        stage, served = point[0], point[1]
        while stage < len(self._budgets) and self._steps_left(stage, served) == 0:
            point = (stage + 1, 0, 0, 0, 0)
            stage, served = stage + 1, 0
        return point

    def _segments(self, point: Point, k: int) -> Iterator[tuple[Point, Point]]:
        """``(from, to)`` per stage the ``k`` batches after ``point`` reach: ``to`` where they
        leave the stage (not moved on to the next)."""
        point = self._normal(point)
        while k > 0 and point[0] < len(self._budgets):
            s, served, epoch, position, base = point
            t = min(k, self._steps_left(s, served))
            where = self._samplers[s].dealing.draws((epoch, position, base), t * self._batch[s])
            after = (s, served + t * self._per_step(s), *where)
            yield point, after
            point = self._normal(after)
            k -= t

    def _advance(self, point: Point, k: int) -> Point:
        """The point ``k`` batches after ``point``."""
        for _, after in self._segments(point, k):
            point = after
        return self._normal(point)

    def positions_of(self, start_step: int, stop_step: int) -> list[tuple[int, int, int]]:
        """The positions steps ``[start_step, stop_step)`` serve, as ``(stage, start, stop)``.

        Steps count from the start of the run (:attr:`step`, the training loop's step number);
        ``start_step >= step``: a step not served yet.  Per stage the steps reach,
        ``[start, stop)`` are the global positions of that stage's sampler the steps serve for the
        first time (replayed ones aside), what ``skip(start, stop, stage=stage)`` takes; stages
        where they serve none are left out.  The steps are found with the edits made so far.

        Raises
        ------
        ValueError
            ``start_step < step`` (those steps are served: resume from a checkpoint before them)
            or ``stop_step < start_step``; the message names the values.
        """
        start, stop = check_int(start_step, "start_step"), check_int(stop_step, "stop_step")
        if not self.step <= start <= stop:
            raise ValueError(
                f"cannot find the positions of steps [{start}, {stop}): the run is at step "
                f"{self.step}, and expects {self.step} <= start_step <= stop_step (a served step "
                "is found from a checkpoint before it)"
            )
        out = []
        for a, b in self._segments(self._advance(self.position, start - self.step), stop - start):
            lo = self._samplers[a[0]].dealing.frontier(a[2:])
            hi = self._samplers[a[0]].dealing.frontier(b[2:])
            if lo < hi:
                out.append((a[0], lo, hi))
        return out

    # -- skips and replays -----------------------------------------------------------------------

    def skip(self, start: int, stop: int, *, stage: int | None = None) -> None:
        """Never serve global positions ``[start, stop)`` of stage ``stage``'s sampler.

        As :meth:`ResumableSampler.skip <mmpack.ResumableSampler.skip>` for the
        sampler of ``stage`` (default: the current stage; a later stage may be edited before it
        starts): position ``e * n + j`` is position ``j`` of the stage's epoch ``e``
        (:meth:`positions_of` finds those of given steps).  Skipped positions count nothing
        toward the budget: the stage still serves as many steps.  Recorded in the state.

        Raises
        ------
        ValueError
            ``stage`` is out of range or over, the range is malformed or reaches positions
            already consumed; the message names the values.
        """
        self._edit("skip", start, stop, stage)

    def replay(self, start: int, stop: int, *, stage: int | None = None) -> None:
        """Serve the consumed global positions ``[start, stop)`` of stage ``stage``'s sampler
        again, next (default: the current stage).

        As :meth:`ResumableSampler.replay <mmpack.ResumableSampler.replay>`;
        replayed samples count toward the budget again (the stage serves as many steps, some of
        them replayed).  Recorded in the state.

        Raises
        ------
        ValueError
            ``stage`` is out of range or over, the range is malformed or reaches positions not
            consumed yet (every position of a later stage); the message names the values.
        """
        self._edit("replay", start, stop, stage)

    def _edit(self, op: str, start: int, stop: int, stage: int | None) -> None:
        point = self._normal(self.position)
        current = point[0]
        s = current if stage is None else check_int(stage, "stage")
        if not 0 <= s < len(self._budgets):
            raise ValueError(
                f"cannot {op} [{start}, {stop}): stage must satisfy 0 <= stage < "
                f"{len(self._budgets)}, got stage={s}"
            )
        if s < current:
            raise ValueError(
                f"cannot {op} [{start}, {stop}) in stage {s}: stage {s} is over (the run is in "
                f"stage {current})"
            )
        # The sampler stands where the run does: at the current point (its iterator, or the
        # state loaded or set for it), or at its start for a later stage (load_state_dict sets it).
        sampler = self._samplers[s]
        try:
            getattr(sampler, op)(start, stop)
        except ValueError as e:
            raise ValueError(f"in stage {s}: {e}") from None

    # -- batches -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        self._step, self._point, self._handed = self.step, self.position, 0
        return self._generate(self._point)

    def _generate(self, point: Point) -> Iterator[list[tuple[int, int]]]:
        point = self._normal(point)
        while point[0] < len(self._budgets):
            s, served, epoch, position, base = point
            sampler = self._samplers[s]
            sampler.load_state_dict(self._sampler_state(s, epoch, position, base))
            it = iter(sampler)
            for _ in range(self._steps_left(s, served)):
                batch: list[tuple[int, int]] = []
                while len(batch) < self._batch[s]:
                    index = next(it, None)
                    if index is None:  # the epoch is over: the next one dealing an index follows
                        sampler.set_epoch(sampler.dealing.next_epoch(sampler.epoch))
                        it = iter(sampler)
                        continue
                    batch.append((s, index))
                self._handed += 1
                yield batch
            point = self._normal((s + 1, 0, 0, 0, 0))

    # -- checkpointing ---------------------------------------------------------------------------

    def _sampler_state(self, s: int, epoch: int, position: int, base: int) -> dict[str, Any]:
        state = self._samplers[s].state_dict()
        state.update(epoch=epoch, position=position, offset=base)
        return state

    def _signature(self) -> list[list[int]]:
        return [
            [b, k, len(v), t]
            for b, k, v, t in zip(
                self._budgets, self._batch, self._views, self._tokens, strict=True
            )
        ]

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the run stands: ``{"version", "unit", "stages", "stage", "served", "step",
        "edits", "sampler"}``.

        ``stage`` is the stage of the next batch, ``served`` what that stage has served (in
        ``unit``, all ranks together), ``step`` the steps the run has served, ``sampler`` the
        stage's sampler state, ``edits`` every stage's ``{"skips", "replays"}`` (as its sampler
        state records them) and ``stages`` the ``[budget, batch_size, len(view), tokens per
        sample]`` of every stage (checked on load).

        Parameters
        ----------
        consumed : int, optional
            Batches of the most recent iterator the training loop consumed (``0 <= consumed <=``
            the batches it handed out); by default, all it handed out.
        """
        k = self._handed
        if consumed is not None:
            k = check_int(consumed, "consumed")
            if not 0 <= k <= self._handed:
                raise ValueError(
                    f"consumed={k}, but the current iterator has handed out {self._handed} "
                    f"batches; expected 0 <= consumed <= {self._handed}"
                )
        s, served, epoch, position, base = self._advance(self._point, k)
        last = min(s, len(self._budgets) - 1)
        edits = []
        for sampler in self._samplers:
            saved = sampler.state_dict()
            edits.append({"skips": saved["skips"], "replays": saved["replays"]})
        return {
            "version": STATE_VERSION,
            "unit": self._unit,
            "stages": self._signature(),
            "stage": s,
            "served": served,
            "step": self._step + k,
            "edits": edits,
            "sampler": self._sampler_state(last, epoch, position, base),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, saved at any world size (with every stage's edits).

        Raises
        ------
        mmpack.errors.StateMismatchError
            The state belongs to other stages or another unit (or its sampler state to another
            configuration: order, seed, block bounds); the message names both.
        mmpack.errors.FormatError
            A field is missing, unknown or malformed; the message names it and its value.
        """
        _check_fields(state)
        for field, ours in (("unit", self._unit), ("stages", self._signature())):
            saved = state[field]
            if isinstance(saved, (list, tuple)):
                saved = [list(x) if isinstance(x, (list, tuple)) else x for x in saved]
            if saved != ours:
                raise StateMismatchError(
                    f"Stages state was saved with {field}={saved!r} but this run has "
                    f"{field}={ours!r}"
                )
        stage, served, step = state["stage"], state["served"], state["step"]
        edits = _checked_edits(state, len(self._budgets))
        before = [sampler.state_dict() for sampler in self._samplers]
        try:
            for j, sampler in enumerate(self._samplers):
                if j == stage:
                    sampler.load_state_dict(state["sampler"])
                    continue
                try:
                    sampler.load_state_dict(
                        {**before[j], "epoch": 0, "position": 0, "offset": 0, **edits[j]}
                    )
                except FormatError as e:
                    raise FormatError(f"Stages state field edits[{j}]: {e}") from None
        except Exception:
            for sampler, saved in zip(self._samplers, before, strict=True):
                sampler.load_state_dict(saved)
            raise
        self._point, self._step, self._handed = (stage, 0, 0, 0, 0), step, 0
        if stage < len(self._budgets):
            where = self._samplers[stage].state_dict()
            self._point = (stage, served, where["epoch"], where["position"], where["offset"])


def _check_fields(state: Any) -> None:
    """Refuse a Stages state of other fields, another version or a bad stage/served/step."""
    if not isinstance(state, dict) or sorted(state) != sorted(_FIELDS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise FormatError(f"a Stages state has the fields {list(_FIELDS)}, got {got}")
    if state["version"] != STATE_VERSION:
        raise FormatError(
            f"Stages state has version {state['version']!r}, expected {STATE_VERSION}"
        )
    top = len(state["stages"]) if isinstance(state["stages"], (list, tuple)) else 0
    for name in ("stage", "served", "step"):
        value = state[name]
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < 0
            or (name == "stage" and value > top)
        ):
            raise FormatError(f"Stages state field {name} is out of range: {value!r}")


def _checked_edits(state: dict[str, Any], stages: int) -> list[dict[str, Any]]:
    """The ``edits`` field: one ``{"skips", "replays"}`` per stage, the current stage's equal to
    its sampler state's (the values are checked by each sampler's ``load_state_dict``)."""
    edits = state["edits"]
    if (
        not isinstance(edits, (list, tuple))
        or len(edits) != stages
        or not all(isinstance(e, dict) and sorted(e) == ["replays", "skips"] for e in edits)
    ):
        raise FormatError(
            f"Stages state field edits must hold one {{'skips', 'replays'}} per stage "
            f"({stages}), got {edits!r}"
        )
    stage, sampler = state["stage"], state["sampler"]
    if stage < stages and isinstance(sampler, dict):
        for name in ("skips", "replays"):
            if _lists(sampler.get(name)) != _lists(edits[stage][name]):
                raise FormatError(
                    f"Stages state field edits[{stage}] has {name}={edits[stage][name]!r} but "
                    f"its sampler state has {name}={sampler.get(name)!r}"
                )
    return [dict(e) for e in edits]


def _lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


def _order(
    shuffle: Any, view: Any, i: int, block_bytes: int, window_blocks: int
) -> tuple[bool | Literal["blocks"], dict[str, Any]]:
    """Stage ``i``'s order (:func:`~mmpack._src.core.sample_order.check_shuffle`) and its sampler's
    block-order arguments (none unless ``"blocks"``; by default at ``order_block_bytes``)."""
    order = check_shuffle(shuffle, view, block_bytes=block_bytes, window_blocks=window_blocks)
    if not (isinstance(order, str) and order == "blocks"):
        return order, {}
    if not callable(getattr(view, "block_bounds", None)):
        raise TypeError(
            f"shuffle='blocks' needs views with block_bounds, got stages[{i}] view "
            f"{type(view).__name__}"
        )
    size = block_bytes if shuffle is not None else order_block_bytes(view, block_bytes)
    return order, {"block_bounds": view.block_bounds(size), "window_blocks": window_blocks}


def _tokens_per_sample(view: Any, i: int) -> int:
    """Stage ``i``'s tokens per sample with ``unit="tokens"``: its view's ``seqlen`` (a mixture
    without one is refused naming its sources' ``seqlen``)."""
    seqlen = getattr(view, "seqlen", None)
    sources = getattr(view, "sources", None)
    if seqlen is None and isinstance(sources, (list, tuple)):
        each = [getattr(source, "seqlen", None) for source in sources]
        raise TypeError(
            f"stages[{i}] view.seqlen must be an integer, got None: unit='tokens' counts seqlen "
            f"tokens per sample, and a {type(view).__name__} has a seqlen only when all its "
            f"sources share one; its sources have seqlen {each}"
        )
    return _positive(seqlen, f"stages[{i}] view.seqlen")


def _positive(value: Any, name: str) -> int:
    v = check_int(value, name)
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v!r}")
    return v
