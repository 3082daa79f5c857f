"""Sequence-length stages: views of one store at different ``seqlen`` and batch sizes, in turn.

``Stages([(budget_0, view_0, batch_size_0), (budget_1, view_1, batch_size_1), ...])`` serves
stage 0's batches, then stage 1's, and so on, as one resumable run.  Stage ``i`` draws its samples
from its own :class:`~mmpack.torch.sampler.ResumableSampler` over ``range(len(view_i))``, keyed by
a seed derived from ``(seed, i)``: each stage's order is independent of the others and of the
budgets, and epoch follows epoch inside a stage (a batch may hold the end of one epoch and the
start of the next).

A *step* is one batch on every rank: ``batch_size_i * world_size`` samples, each counting
``view_i.seqlen`` tokens with ``unit="tokens"`` (the input length of a sample; a view of
``seqlen`` tokens serves exactly that many, padding included).  Stage ``i`` ends at the first step
boundary where the samples (or tokens) it served on all ranks together reach ``budget_i``:
``ceil((budget_i - served) / per step)`` more steps from any point, so every rank ends a stage on
the same step.  At another world size (an elastic resume) the steps are larger or smaller, and
the rule applies to what is left.

The position is ``(stage, served, the stage sampler's epoch / position / offset)``: arithmetic,
O(stages) to advance over any number of batches; ``state_dict`` names the stage and holds the
stage sampler's state (:mod:`mmpack.sampling.sampler_state`), so a resume at any world size continues
the stage exactly as an elastic resume of its sampler does (:mod:`mmpack.torch.elastic`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from mmpack.core.validation import check_int
from mmpack.errors import FormatError, StateMismatchError
from mmpack.sampling.dealing import share_length
from mmpack.sampling.sampler_state import STATE_VERSION
from mmpack.torch.sampler import ResumableSampler

__all__ = ["StageDataset", "Stages", "stage_seed"]

UNITS = ("samples", "tokens")
_FIELDS = ("version", "unit", "stages", "stage", "served", "sampler")

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


class Stages:
    """A run over stages of (budget, view, batch size), with one resumable position.

    Parameters
    ----------
    stages : sequence of (int, view, int)
        ``(budget, view, batch_size)`` per stage: the stage's budget in ``unit`` (``>= 1``), its
        dataset (``len(view) >= 1``; with ``unit="tokens"`` it has an int ``seqlen``) and the
        batch size of each rank (``>= 1``).
    seed : int, default 0
        Stage ``i``'s order is keyed by :func:`stage_seed` ``(seed, i)``.
    unit : "samples" or "tokens", default "samples"
        What budgets count (see the module docstring for the rule that ends a stage).
    rank, world_size, shuffle, drop_last
        As for :class:`~mmpack.torch.sampler.ResumableSampler`, for every stage's sampler.

    Notes
    -----
    Iterating yields, per step, this rank's batch: a list of ``(stage, index)`` pairs (``index``
    an :class:`~mmpack.core.validation.EpochIndex`).  Give it to a DataLoader as
    ``batch_sampler`` with :attr:`dataset`: each batch then holds ``batch_size`` samples of its
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
        shuffle: bool = True,
        drop_last: bool = False,
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
                tokens = _positive(getattr(view, "seqlen", None), f"stages[{i}] view.seqlen")
            self._tokens.append(tokens)
            self._views.append(view)
            sampler = ResumableSampler(
                len(view),
                seed=stage_seed(seed, i),
                rank=rank,
                world_size=world_size,
                shuffle=shuffle,
                drop_last=drop_last,
                fingerprint=f"stages[{i}]: {len(view)} samples of {tokens} {unit}",
            )
            if len(sampler) == 0:
                raise ValueError(
                    f"stages[{i}]'s view has {len(view)} samples: too few for one per rank "
                    f"(world_size={world_size}, drop_last={drop_last})"
                )
            self._samplers.append(sampler)
        self._world_size = world_size
        self._point: Point = (0, 0, 0, 0, 0)
        self._handed = 0
        self.dataset = StageDataset(self._views)
        """The map-style dataset to give a DataLoader with ``batch_sampler=self``."""

    @property
    def stage(self) -> int:
        """The stage of the next batch (``len(stages)`` once the run is over)."""
        return self._normal(self.position)[0]

    @property
    def position(self) -> Point:
        """``(stage, served, epoch, position, offset)`` where the next batch starts."""
        return self._advance(self._point, self._handed)

    def batch_size(self, stage: int) -> int:
        return self._batch[stage]

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

    def _draws(self, s: int, epoch: int, position: int, base: int, d: int) -> tuple[int, int, int]:
        """The stage sampler's ``(epoch, position, offset)`` after ``d`` more draws."""
        n, ws, dl = len(self._views[s]), self._world_size, self._samplers[s].drop_last
        rest = share_length(n, base, ws, dl) - position
        if d <= rest:  # an epoch drawn to its end stays the point (another world size may deal
            return epoch, position + d, base  # a tail this one dropped)
        d -= rest
        per_epoch = share_length(n, 0, ws, dl)
        epoch, d = epoch + 1 + (d - 1) // per_epoch, (d - 1) % per_epoch + 1
        return epoch, d, 0

    def _advance(self, point: Point, k: int) -> Point:
        """The point ``k`` batches after ``point``."""
        point = self._normal(point)
        while k > 0 and point[0] < len(self._budgets):
            s, served, epoch, position, base = point
            t = min(k, self._steps_left(s, served))
            epoch, position, base = self._draws(s, epoch, position, base, t * self._batch[s])
            point = self._normal((s, served + t * self._per_step(s), epoch, position, base))
            k -= t
        return point

    # -- batches -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        self._point, self._handed = self.position, 0
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
                    if index is None:  # the epoch is over: the next one follows
                        sampler.set_epoch(sampler.epoch + 1)
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
        """Where the run stands: ``{"version", "unit", "stages", "stage", "served", "sampler"}``.

        ``stage`` is the stage of the next batch, ``served`` what that stage has served (in
        ``unit``, all ranks together), ``sampler`` its sampler's state and ``stages`` the
        ``[budget, batch_size, len(view), tokens per sample]`` of every stage (checked on load).

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
        return {
            "version": STATE_VERSION,
            "unit": self._unit,
            "stages": self._signature(),
            "stage": s,
            "served": served,
            "sampler": self._sampler_state(last, epoch, position, base),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, saved at any world size.

        Raises
        ------
        mmpack.errors.StateMismatchError
            The state belongs to other stages or another unit (or its sampler state to another
            configuration); the message names both.
        mmpack.errors.FormatError
            A field is missing, unknown or malformed; the message names it and its value.
        """
        if not isinstance(state, dict) or sorted(state) != sorted(_FIELDS):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise FormatError(f"a Stages state has the fields {list(_FIELDS)}, got {got}")
        if state["version"] != STATE_VERSION:
            raise FormatError(
                f"Stages state has version {state['version']!r}, expected {STATE_VERSION}"
            )
        for field, ours in (("unit", self._unit), ("stages", self._signature())):
            saved = state[field]
            if isinstance(saved, (list, tuple)):
                saved = [list(x) if isinstance(x, (list, tuple)) else x for x in saved]
            if saved != ours:
                raise StateMismatchError(
                    f"Stages state was saved with {field}={saved!r} but this run has "
                    f"{field}={ours!r}"
                )
        stage, served = state["stage"], state["served"]
        for name, value, top in (("stage", stage, len(self._budgets)), ("served", served, None)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 0
                or (top is not None and value > top)
            ):
                raise FormatError(f"Stages state field {name} is out of range: {value!r}")
        if stage == len(self._budgets):
            self._point, self._handed = (stage, 0, 0, 0, 0), 0
            return
        sampler = self._samplers[stage]
        sampler.load_state_dict(state["sampler"])
        where = sampler.state_dict()
        self._point = (stage, served, where["epoch"], where["position"], where["offset"])
        self._handed = 0


def _positive(value: Any, name: str) -> int:
    v = check_int(value, name)
    if v < 1:
        raise ValueError(f"{name} must be >= 1, got {v!r}")
    return v
