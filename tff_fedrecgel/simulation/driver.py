"""The simulation driver: one population of users, any algorithm.

`Simulation` runs rounds over a split in one process: it samples each round's
cohort, builds the sampled users' round batches, hands them to the algorithm,
and evaluates every user (or a fixed sample of them, `eval_sample`). What differs between algorithms (FedRecGEL and its
settings, TFF's FedRecon) sits behind the small `Algorithm` protocol; the
training program (`program/`) only sees a `Simulation`.

Randomness is counter-based, so a checkpoint needs no generator state: the
cohort of round r comes from TFF's uniform sampling function seeded with
`seed` (a function of r), a user's batch from `default_rng([seed, r, user])`,
and the initial weights from `seed`.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import time
from typing import Any, Protocol

import numpy as np
import tensorflow_federated as tff

from tff_fedrecgel import sizes
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.data.client_data import FederatedTrainData
from tff_fedrecgel.data.client_data import heldout_users_for
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.evaluation import eval_sample
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.evaluation import reconstruction
from tff_fedrecgel.models import neumf

# Users who rebuild their embedding for evaluation draw their batches as
# "round 0" (training rounds are numbered from 1).
EVAL_ROUND = 0
# Users scored per call by an algorithm with per-user models (bounds the
# [users, num_items] scores in memory).
PERSONAL_SCORE_USERS = 256


class Algorithm(Protocol):
    """What the driver needs of a federated algorithm.

    Attributes:
      model_config: The NeuMF sizes.
      reconstruction: How a user without a stored embedding rebuilds it
        (`reconstruction_steps`, `local_lr` and the loss of the config).
      item_scores: None for a NeuMF; an algorithm that ranks by one score per
        item, the same for every user (item popularity), gives them here,
        float `[num_items]`, and the driver needs no embeddings.

    An algorithm whose users each score items with a model of their own
    (PFedRec, FedRAP) has a method `score_items(users, batches)` -> float
    `[len(users), num_items]`: training users (`batches` None) with their
    stored models, new users first fitted on their `batches`; the driver
    then ranks those scores and needs no embeddings either.
    """

    model_config: neumf.ModelConfig
    reconstruction: client_update.ClientWorkConfig
    item_scores: np.ndarray | None

    def initialize(self) -> None:
        """Sets round 0: initial weights (and every user's state)."""

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> Mapping[str, Any]:
        """Runs one round on the sampled `users`; returns nested metrics."""

    @property
    def global_weights(self) -> list[np.ndarray]:
        """The current global weights, `NeuMF.global_variables` order."""

    def local_tables(self) -> list[np.ndarray] | None:
        """Every user's stored embedding (`[num_users, dim]` tables), or None
        when users keep none and rebuild it (`reconstruction`)."""

    def get_state(self) -> Any:
        """A nested structure of arrays from which `restore` resumes."""

    def restore(self, state: Any) -> None:
        """Resumes from a `get_state()` structure."""


def clients_per_round_for(num_users: int, fraction: float) -> int:
    """int(fraction * num_users), at least 1 (docs/ALGORITHM.md, step 1)."""
    if not 0 < fraction <= 1:
        raise ValueError(f'client fraction must be in (0, 1], got {fraction}')
    return max(1, int(fraction * num_users))


def _flatten(value, prefix: str = '') -> dict[str, float]:
    """Nested metrics to {'a/b': float}; empty structures vanish."""
    if isinstance(value, Mapping):
        out = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f'{prefix}{key}/'))
        return out
    if isinstance(value, (list, tuple)):
        return {}
    return {prefix[:-1]: float(np.asarray(value))}


class Simulation:
    """Rounds of a federated algorithm over a population of users."""

    def __init__(self, *, split: Split, algorithm: Algorithm, clients_per_round: int,
                 seed: int = 0, num_negatives: int = sizes.TRAINING_NEGATIVES, heldout_fraction: float = 0.0,
                 eval_users: int | None = None, top_ks: Sequence[int] = sizes.TOP_KS,
                 eval_scoring: str = protocols.DEFAULT_SCORING):
        """Prepares the per-user data and the cohort sampling.

        Args:
          split: The preprocessed dataset.
          algorithm: The algorithm (`num_items` of its model must match).
          clients_per_round: Cohort size (fixed, so TFF never retraces).
          seed: Seed of sampling and negatives (the algorithm's initial
            weights take the same seed).
          num_negatives: Training negatives per positive.
          heldout_fraction: A fixed random fraction of users
            (`heldout_users_for`) that never trains and is never sampled;
            `evaluate(heldout=True)` measures them with embeddings rebuilt
            from their own training interactions.
          eval_users: Evaluate this many users of each population (the
            training users, the held-out users), the same sample every round
            (`eval_sample.sample_positions`), with standard errors; None:
            everyone.
          top_ks: Cut-offs K of HR@K and NDCG@K.
          eval_scoring: How full ranking scores the users
            (`protocols.SCORINGS`).

        Raises:
          ValueError: On inconsistent sizes.
        """
        if algorithm.model_config.num_items != split.num_items:
            raise ValueError(f'model has {algorithm.model_config.num_items} items, '
                             f'data {split.num_items}')
        self.heldout_users = heldout_users_for(split.num_users, heldout_fraction)
        held = np.zeros(split.num_users, bool)
        held[self.heldout_users] = True
        self.train_users = np.flatnonzero(~held)
        if not 1 <= clients_per_round <= len(self.train_users):
            raise ValueError(f'clients_per_round must be in [1, {len(self.train_users)}], '
                             f'got {clients_per_round}')
        if num_negatives < 0:
            raise ValueError(f'num_negatives must be >= 0, got {num_negatives}')
        if eval_users is not None and eval_users < 1:
            raise ValueError(f'eval_users must be >= 1, got {eval_users}')
        if eval_scoring not in protocols.SCORINGS:
            raise ValueError(f'eval_scoring must be one of {protocols.SCORINGS}, '
                             f'got {eval_scoring!r}')
        self.split = split
        self.algorithm = algorithm
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.num_negatives = num_negatives
        self.eval_users = eval_users
        self.eval_scoring = eval_scoring
        self.top_ks = protocols.check_top_ks(top_ks)
        self.train_data = FederatedTrainData.from_split(split)
        population = (range(split.num_users) if not len(self.heldout_users)
                      else self.train_users.tolist())
        self._sample = tff.simulation.build_uniform_sampling_fn(
            population, replace=False, random_seed=seed)
        self.round_num = 0
        self._started = False
        self._rebuilt = {}  # Users who rebuild their embedding: key -> (round, tables).

    def initialize(self) -> None:
        """Sets round 0."""
        self.algorithm.initialize()
        self.round_num, self._started, self._rebuilt = 0, True, {}

    def sample_clients(self, round_num: int) -> list[int]:
        """The cohort of `round_num` (uniform, without replacement)."""
        return [int(u) for u in self._sample(round_num, self.clients_per_round)]

    def batches(self, users: Sequence[int], round_num: int) -> list[Batch]:
        """The users' round batches (`FederatedTrainData.round_batches`)."""
        return self.train_data.round_batches(users, seed=self.seed, round_num=round_num,
                                             num_negatives=self.num_negatives)

    def run_round(self) -> dict[str, float]:
        """Runs the next round; returns its training metrics (flat floats)."""
        if not self._started:
            raise RuntimeError('call initialize() or restore() first')
        round_num = self.round_num + 1
        start = time.perf_counter()
        users = self.sample_clients(round_num)
        metrics = _flatten(self.algorithm.next(users, self.batches(users, round_num)))
        self.round_num = round_num
        for part in ('global', 'local'):
            if f'sam_loss_{part}' in metrics:
                metrics[f'sharpness_{part}'] = metrics[f'sam_loss_{part}'] - metrics['loss']
        metrics['round_seconds'] = time.perf_counter() - start
        return metrics

    @property
    def global_weights(self) -> list[np.ndarray]:
        return self.algorithm.global_weights

    def _rebuild(self, key: str, users: np.ndarray) -> list[np.ndarray]:
        """`users`' embeddings rebuilt from their training data, kept for the round."""
        if key not in self._rebuilt or self._rebuilt[key][0] != self.round_num:
            self._rebuilt[key] = (self.round_num, reconstruction.reconstruct_local_tables(
                self.algorithm.model_config, self.algorithm.reconstruction,
                self.global_weights, self.batches(users, EVAL_ROUND)))
        return self._rebuilt[key][1]

    def evaluated_users(self, *, heldout: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """The users an evaluation covers and where they sit in their population.

        Returns:
          `(users, positions)`: user indices, and their positions in
          `train_users` (or `heldout_users`), or None when everyone is
          evaluated.
        """
        population = self.heldout_users if heldout else self.train_users
        positions = eval_sample.sample_positions(len(population), self.eval_users)
        return (population, None) if positions is None else (population[positions], positions)

    def evaluation_sample(self) -> dict[str, Any] | None:
        """What the summary says of a sampled evaluation (None: everyone)."""
        sizes = {'train': len(self.train_users), 'heldout': len(self.heldout_users)}
        sampled = {name: size for name, size in sizes.items()
                   if eval_sample.sample_positions(size, self.eval_users) is not None}
        if not sampled:
            return None
        return {'eval_users': int(self.eval_users),
                'populations': {name: {'evaluated': min(int(self.eval_users), size),
                                       'of': int(size)} for name, size in sizes.items() if size},
                'note': ('metrics are means over a fixed random sample of users (the same '
                         'every round, method and seed); <metric>_se is the standard error '
                         'of each mean over its population')}

    def _evaluation_tables(self, heldout: bool, users: np.ndarray,
                           positions: np.ndarray | None) -> list[np.ndarray]:
        """The evaluated users' embeddings (only they rebuild theirs)."""
        if positions is None:
            return self.local_tables(heldout=heldout)
        if heldout or self.algorithm.local_tables() is None:
            return self._rebuild('heldout_sample' if heldout else 'train_sample', users)
        rows = getattr(self.algorithm, 'local_rows', None)
        if rows is not None:  # Only the sample's rows (a disk store's stay on disk).
            return rows(users)
        return [t[users] for t in self.algorithm.local_tables()]

    def local_tables(self, *, heldout: bool = False) -> list[np.ndarray]:
        """The embeddings of the training (or held-out) users, one row each.

        Training users: stored, or rebuilt from their data when the algorithm
        keeps none. Held-out users: always rebuilt, the global part frozen.
        Rows follow `train_users` (or `heldout_users`).
        """
        if heldout:
            return self._rebuild('heldout', self.heldout_users)
        tables = self.algorithm.local_tables()
        if tables is None:
            return self._rebuild('train', self.train_users)
        if len(self.heldout_users):
            return [t[self.train_users] for t in tables]
        return tables

    def evaluate(self, which: str = 'test', *, heldout: bool = False,
                 protocol: str = protocols.SAMPLED.name) -> dict[str, float]:
        """Ranking metrics of the training (or held-out) users' `which` items.

        Args:
          which: 'test' or 'valid'.
          heldout: Evaluate the held-out users instead of the training users.
          protocol: A name of `evaluation.protocols.NAMES`: 'sampled', the
            item among its sampled negatives (HR@K, NDCG@K; the paper's
            protocol); 'full', among every item the user did not train on
            (HR@K, NDCG@K, MRR).

        Returns:
          Means over the users (the fast batched paths); with `eval_users`
          over the fixed sample, each followed by its standard error
          (`<metric>_se`).

        Raises:
          ValueError: If `heldout` and the run holds no users out, or on an
            unknown protocol.
        """
        if heldout and not len(self.heldout_users):
            raise ValueError('this simulation holds no users out')
        ranker = protocols.get(protocol)
        users, positions = self.evaluated_users(heldout=heldout)
        sample_of = None if positions is None else len(
            self.heldout_users if heldout else self.train_users)
        if getattr(self.algorithm, 'score_items', None) is not None:
            return self._evaluate_personal(which, users, heldout=heldout, protocol=ranker,
                                           sample_of=sample_of)
        held_out = ranker.held_out(self.split, self.train_data, which, users)
        if self.algorithm.item_scores is not None:
            metrics = ranker.evaluate_item_scores(self.algorithm.item_scores, held_out,
                                                  top_ks=self.top_ks, sample_of=sample_of)
        else:
            metrics = ranker.evaluate_model(
                self.algorithm.model_config, self.global_weights,
                self._evaluation_tables(heldout, users, positions), held_out,
                top_ks=self.top_ks, sample_of=sample_of, scoring=self.eval_scoring)
        return {k: float(v) for k, v in metrics.items()}

    def popularity(self, which: str = 'test', *,
                   protocol: str = protocols.SAMPLED.name) -> dict[str, float]:
        """The popularity floor on this split: `evaluate`'s metrics (training
        users, `which` item) with items ranked by their count in the training
        users' rows, the counts `--algorithm=itempop` reaches once every
        training user has uploaded."""
        ranker = protocols.get(protocol)
        users, positions = self.evaluated_users()
        held = np.zeros(self.split.num_users, bool)
        held[self.heldout_users] = True
        rows = ~held[self.split.train_users]
        counts = np.bincount(self.split.train_items[rows],
                             minlength=self.split.num_items).astype(np.float32)
        metrics = ranker.evaluate_item_scores(
            counts, ranker.held_out(self.split, self.train_data, which, users),
            top_ks=self.top_ks, sample_of=None if positions is None else len(self.train_users))
        return {k: float(v) for k, v in metrics.items()}

    def _evaluate_personal(self, which: str, users: np.ndarray, *, heldout: bool,
                           protocol: protocols.Protocol,
                           sample_of: int | None) -> dict[str, float]:
        """`evaluate` for an algorithm whose users score with their own models."""
        per_user = collections.defaultdict(list)
        for start in range(0, len(users), PERSONAL_SCORE_USERS):
            chunk = users[start:start + PERSONAL_SCORE_USERS]
            scores = self.algorithm.score_items(
                chunk, self.batches(chunk, EVAL_ROUND) if heldout else None)
            metrics = protocol.user_metrics(
                scores, protocol.held_out(self.split, self.train_data, which, chunk),
                top_ks=self.top_ks)
            for key, values in metrics.items():
                per_user[key].append(np.asarray(values))
        return {k: float(v) for k, v in eval_sample.summarize(
            {k: np.concatenate(v) for k, v in per_user.items()}, sample_of).items()}

    def use_state_folder(self, folder) -> None:
        """Where an algorithm keeping per-user state on disk keeps it
        (`--user_state_store=disk`); call before `initialize`.

        Args:
          folder: The run's `user_states/` (`outputs.ExperimentPaths.user_states`).
        """
        use = getattr(self.algorithm, 'use_state_folder', None)
        if use is not None:
            use(folder)

    def get_state(self, *, whole: bool = False) -> collections.OrderedDict:
        """Everything needed to resume: the algorithm's state and the round.

        Args:
          whole: Every user's state itself even where the algorithm keeps it
            on disk (whose checkpoints name a version of it): for a state
            kept apart from the checkpoints.
        """
        full_state = getattr(self.algorithm, 'full_state', None)
        return collections.OrderedDict(
            round_num=np.int64(self.round_num), seed=np.int64(self.seed),
            algorithm=full_state() if whole and full_state else self.algorithm.get_state())

    def restore(self, state: Mapping, *, resume: bool = False) -> None:
        """Resumes from a `get_state()` structure.

        Args:
          state: The structure.
          resume: Training goes on from it (a disk store of user states is
            rolled back in place; else its version is read into memory).

        Raises:
          ValueError: If the state was made with another seed.
        """
        if int(state['seed']) != self.seed:
            raise ValueError(f'checkpoint was made with seed {int(state["seed"])}, '
                             f'not {self.seed}')
        if resume and getattr(self.algorithm, 'use_state_folder', None) is not None:
            self.algorithm.restore(state['algorithm'], resume=True)
        else:
            self.algorithm.restore(state['algorithm'])
        self.round_num, self._started, self._rebuilt = int(state['round_num']), True, {}
