"""Simulation of the FedRecon baseline (TFF's Federated Reconstruction).

Same interface as `FedRecSimulation` (initialize, run_round, evaluate,
get_state, restore), so the training program, checkpoints and outputs are
shared. By default one TFF client simulates a group of users
(`fedrecon.build_fedrecon_process(group_size=...)`), which computes the same
round as one user per client (`grouped=False`) far faster.
"""

from __future__ import annotations

import collections
import time
from typing import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import evaluation
from tff_fedrecgel.algorithms import fedrecon
from tff_fedrecgel.data.client_data import FederatedTrainData
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import simulation as simulation_lib



class FedReconSimulation:
    """FedRecon over a population of users."""

    def __init__(
        self,
        *,
        split: Split,
        model_config: neumf.ModelConfig,
        clients_per_round: int,
        seed: int = 0,
        server_lr: float = 0.001,
        local_lr: float = 0.1,
        reconstruction_steps: int = 5,
        num_negatives: int = 4,
        grouped: bool = True,
        max_group_examples: int = 16384,
    ):
        """Builds the TFF processes and the per-user data.

        Args:
          split: The preprocessed dataset.
          model_config: The model sizes (`num_items` must match the split).
          clients_per_round: Cohort size.
          seed: Seed of sampling, negatives and initial weights.
          server_lr: Learning rate of the server Adam.
          local_lr: Learning rate of the reconstruction Adam.
          reconstruction_steps: Reconstruction steps per round.
          num_negatives: Training negatives per positive.
          grouped: Simulate several users per TFF client (same results).
          max_group_examples: With `grouped`, examples per TFF client stay
            under this unless one user alone exceeds it.

        Raises:
          ValueError: On inconsistent sizes or settings.
        """
        if model_config.num_items != split.num_items:
            raise ValueError(
                f'model has {model_config.num_items} items, data {split.num_items}')
        if not 1 <= clients_per_round <= split.num_users:
            raise ValueError(f'clients_per_round must be in [1, {split.num_users}], '
                             f'got {clients_per_round}')
        self.split = split
        self.model_config = model_config
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.num_negatives = num_negatives
        self.local_lr = local_lr
        self.reconstruction_steps = reconstruction_steps
        # The project's reconstruct work computing FedRecon's embeddings, for
        # the fast all-users evaluation (tests check both paths agree).
        self.work = fedrecon.matching_client_work(
            reconstruction_steps=reconstruction_steps, local_lr=local_lr)
        self.train_data = FederatedTrainData.from_split(split)
        if max_group_examples < 1:
            raise ValueError('max_group_examples must be positive')
        self.grouped = grouped
        self.max_group_examples = max_group_examples
        self.process = fedrecon.build_fedrecon_process(
            model_config=model_config, reconstruction_steps=reconstruction_steps,
            local_lr=local_lr, server_lr=server_lr, init_seed=seed,
            group_size=clients_per_round if grouped else None,
            clients_per_round=clients_per_round)
        self._eval_process = None
        self._sample = tff.simulation.build_uniform_sampling_fn(
            range(split.num_users), replace=False, random_seed=seed)
        self.state = None
        self.round_num = 0
        self._tables = None  # (round, tables) of the last evaluation.

    def initialize(self) -> None:
        """Sets round 0: the initial global weights and server state."""
        self.state = self.process.initialize()
        self.round_num = 0
        self._tables = None

    def sample_clients(self, round_num: int) -> list[int]:
        """The cohort of `round_num` (uniform, without replacement)."""
        return [int(u) for u in self._sample(round_num, self.clients_per_round)]

    def _batches(self, users, round_num):
        return self.train_data.round_batches(
            users, seed=self.seed, round_num=round_num, num_negatives=self.num_negatives)

    def run_round(self) -> dict[str, float]:
        """Runs the next round; returns its training metrics (flat floats)."""
        if self.state is None:
            raise RuntimeError('call initialize() or restore() first')
        round_num = self.round_num + 1
        start = time.perf_counter()
        users = self.sample_clients(round_num)
        batches = self._batches(users, round_num)
        if self.grouped:
            groups = self._groups(batches)
            datasets = [fedrecon.group_train_dataset([batches[i] for i in group])
                        for group in groups]
        else:
            datasets = [fedrecon.train_dataset(items, labels) for items, labels in batches]
        output = self.process.next(self.state, datasets)
        self.state = output.state
        self.round_num = round_num
        loss = float(output.metrics['client_work']['train']['loss'])
        if self.grouped:
            # TFF averages the groups' losses, each a sum of user losses / users.
            loss *= len(datasets)
        return {'loss': loss, 'tff_clients': float(len(datasets)),
                'round_seconds': time.perf_counter() - start}

    def _groups(self, batches) -> list[list[int]]:
        """Consecutive users under the example budget (at least one each)."""
        groups, current, size = [], [], 0
        for i, (items, _) in enumerate(batches):
            if current and size + len(items) > self.max_group_examples:
                groups.append(current)
                current, size = [], 0
            current.append(i)
            size += len(items)
        groups.append(current)
        return groups

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.process.get_model_weights(self.state).trainable]

    def local_tables(self) -> list[np.ndarray]:
        """Every user's embedding as FedRecon's evaluation reconstructs it.

        Kept for the round, so test and validation share one reconstruction.
        """
        if self._tables is None or self._tables[0] != self.round_num:
            batches = self._batches(range(self.split.num_users), simulation_lib.EVAL_ROUND)
            self._tables = (self.round_num, evaluation.reconstruct_local_tables(
                self.model_config, self.work, self.global_weights, batches))
        return self._tables[1]

    def evaluate(self, which: str = 'test') -> dict[str, float]:
        """HR@K and NDCG@K over all users (the fast batched path).

        Computes what `evaluate_federated` computes through TFF's
        `build_fed_recon_eval`, for all users in a few batched calls.
        """
        metrics = evaluation.evaluate_users(
            self.model_config, self.global_weights, self.local_tables(),
            self.split.candidates(which))
        return {k: float(v) for k, v in metrics.items()}

    def evaluate_federated(self, which: str = 'test',
                           users=None) -> dict[str, float]:
        """HR@K and NDCG@K through TFF's `build_fed_recon_eval`, one client per user.

        Args:
          which: 'test' or 'valid'.
          users: Users to evaluate (default: all).

        Returns:
          Metrics named like `evaluate`'s, means over the users.
        """
        if self._eval_process is None:
            self._eval_process = fedrecon.build_fedrecon_evaluation(
                model_config=self.model_config,
                reconstruction_steps=self.reconstruction_steps, local_lr=self.local_lr)
        users = list(range(self.split.num_users) if users is None else users)
        candidates = self.split.candidates(which)
        batches = self._batches(users, simulation_lib.EVAL_ROUND)
        datasets = [fedrecon.eval_dataset(items, labels, candidates[u])
                    for u, (items, labels) in zip(users, batches)]
        eval_state = self._eval_process.set_model_weights(
            self._eval_process.initialize(), self.process.get_model_weights(self.state))
        metrics = self._eval_process.next(eval_state, datasets).metrics
        current = metrics['client_work']['eval']['current_round_metrics']
        return {name.replace('_at_', '@'): float(value)
                for name, value in current.items() if '_at_' in name}

    def get_state(self) -> collections.OrderedDict:
        """Everything needed to resume: the process state (flattened) and round."""
        return collections.OrderedDict(
            round_num=np.int64(self.round_num), seed=np.int64(self.seed),
            server_state=[np.asarray(x) for x in tf.nest.flatten(self.state)])

    def restore(self, state: Mapping) -> None:
        """Resumes from a `get_state()` structure."""
        if int(state['seed']) != self.seed:
            raise ValueError(
                f'checkpoint was made with seed {int(state["seed"])}, not {self.seed}')
        template = self.process.initialize()
        self.state = tf.nest.pack_sequence_as(template, list(state['server_state']))
        self.round_num = int(state['round_num'])
        self._tables = None
