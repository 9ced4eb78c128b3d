"""TFF's Federated Reconstruction behind the driver's protocol.

The round is `tff.learning.algorithms.build_fed_recon`
(`algorithms/fedrecon.py`). By default one TFF client simulates a group of
users (`group_size`), which computes the same round as one user per client
(`grouped=False`) far faster. Users keep no state: for evaluation the driver
rebuilds every embedding with `reconstruction`, the project's reconstruction
that computes what FedRecon's clients compute (tests check both agree).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_fedrecgel import algorithm_config
from tff_fedrecgel.algorithms import fedrecon
from tff_fedrecgel.data import batching
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.models import neumf

_WORK = algorithm_config.CLIENT_WORK
_SERVER = algorithm_config.SERVER


class FedRecon:
    """FedRecon over a population (an `Algorithm` of the driver)."""

    def __init__(self, *, model_config: neumf.ModelConfig, clients_per_round: int,
                 seed: int = 0, server_lr: float = _SERVER.learning_rate,
                 local_lr: float = _WORK.local_lr,
                 reconstruction_steps: int = _WORK.reconstruction_steps, grouped: bool = True,
                 max_group_examples: int = batching.DEFAULT_MAX_GROUP_EXAMPLES):
        """Builds the TFF process.

        Args:
          model_config: The model sizes.
          clients_per_round: Users per round.
          seed: Seed of the initial weights.
          server_lr: Learning rate of the server Adam.
          local_lr: Learning rate of the reconstruction Adam.
          reconstruction_steps: Reconstruction steps per round.
          grouped: Simulate several users per TFF client (same results).
          max_group_examples: With `grouped`, examples per TFF client stay
            under this unless one user alone exceeds it.

        Raises:
          ValueError: On inconsistent settings.
        """
        if max_group_examples < 1:
            raise ValueError('max_group_examples must be positive')
        self.model_config = model_config
        self.item_scores = None  # A NeuMF: users are ranked with their embeddings.
        self.reconstruction = fedrecon.matching_client_work(
            reconstruction_steps=reconstruction_steps, local_lr=local_lr)
        self.seed = seed
        self.grouped = grouped
        self.max_group_examples = max_group_examples
        self.process = fedrecon.build_fedrecon_process(
            model_config=model_config, reconstruction_steps=reconstruction_steps,
            local_lr=local_lr, server_lr=server_lr, init_seed=seed,
            group_size=clients_per_round if grouped else None,
            clients_per_round=clients_per_round)
        self.state = None

    def initialize(self) -> None:
        self.state = self.process.initialize()

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict[str, float]:
        if self.grouped:
            groups = batching.group_by_length(
                [len(items) for items, _ in batches], max_examples=self.max_group_examples,
                multiple=1)
            datasets = [fedrecon.group_train_dataset([batches[i] for i in group])
                        for group in groups]
        else:
            datasets = [fedrecon.train_dataset(items, labels) for items, labels in batches]
        output = self.process.next(self.state, datasets)
        self.state = output.state
        loss = float(output.metrics['client_work']['train']['loss'])
        if self.grouped:
            # TFF averages the groups' losses, each a sum of user losses / users.
            loss *= len(datasets)
        return {'loss': loss, 'tff_clients': float(len(datasets))}

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.process.get_model_weights(self.state).trainable]

    def local_tables(self) -> None:
        return None  # Users keep nothing; the driver rebuilds the embeddings.

    def evaluate_federated(self, batches: Sequence[Batch],
                           candidates: np.ndarray) -> dict[str, float]:
        """HR@K and NDCG@K through TFF's `build_fed_recon_eval`, a client per user.

        Args:
          batches: The users' reconstruction batches.
          candidates: Their candidates (held-out item first), one row per user.

        Returns:
          Metrics named like `Simulation.evaluate`'s, means over the users.
        """
        process = fedrecon.build_fedrecon_evaluation(
            model_config=self.model_config,
            reconstruction_steps=self.reconstruction.reconstruction_steps,
            local_lr=self.reconstruction.local_lr)
        datasets = [fedrecon.eval_dataset(items, labels, candidates[i])
                    for i, (items, labels) in enumerate(batches)]
        state = process.set_model_weights(process.initialize(),
                                          self.process.get_model_weights(self.state))
        metrics = process.next(state, datasets).metrics
        current = metrics['client_work']['eval']['current_round_metrics']
        return {name.replace('_at_', '@'): float(value)
                for name, value in current.items() if '_at_' in name}

    def get_state(self) -> list[np.ndarray]:
        return [np.asarray(x) for x in tf.nest.flatten(self.state)]

    def restore(self, state) -> None:
        self.state = tf.nest.pack_sequence_as(self.process.initialize(), list(state))


def build(method, context) -> FedRecon:
    """FedRecon's algorithm (its `methods.Method.builder`).

    Args:
      method: The `methods.Method`.
      context: The run's `simulation.context.BuildContext`.
    """
    del method
    return FedRecon(
        model_config=context.model_config, clients_per_round=context.clients_per_round,
        seed=context.seed, server_lr=context.server_lr, local_lr=context.work.local_lr,
        reconstruction_steps=context.work.reconstruction_steps,
        grouped=context.users_per_client != 1,
        max_group_examples=context.max_group_examples)
