"""NeuMF trained centrally on the pooled training split: the non-federated ceiling.

Not a federated method: one Keras model holds every user's embedding rows
and the item side (the weights of a `neumf.NeuMF` with `group_size=num_users`,
scored with `neumf.neumf_logits`, the federated model's math) and is trained
with `model.fit` on all users' examples at once. Each epoch draws fresh
negatives (the clients' sampler, `num_negatives` per unique training
positive), shuffles, and runs one pass of Adam on the mean binary
cross-entropy (docs/ALGORITHM.md, "One round": Adam 0.001, batch 256, 4
negatives). Evaluation is the federated models' `evaluation.sampled.evaluate_users`.

`CentralTrainer` offers the simulation's interface (`initialize`, `run_round`
= one epoch, `round_num`, `evaluate`, `global_weights`, `local_tables`,
`get_state` / `restore`), so the same program loop can drive it.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import time

import numpy as np
import tensorflow as tf

from tff_fedrecgel import sizes
from tff_fedrecgel.data.client_data import FederatedTrainData
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.evaluation import sampled
from tff_fedrecgel.models import neumf

DEFAULT_LEARNING_RATE = 0.001
DEFAULT_BATCH_SIZE = 256
DEFAULT_NUM_NEGATIVES = sizes.TRAINING_NEGATIVES
# Seeds the user tables' draw apart from the item tables' (NeuMF's own seeds).
_USER_TABLE_STREAM = 0xCE17


def _restore_keras_v2_classes() -> None:
    """Undoes Keras's process-wide switch to its graph-mode (v1) classes.

    Building a Keras layer inside a `tf.Graph`, as the federated code does
    while tracing (e.g. `client_work.global_weight_specs`, called by every
    evaluation), rebases that layer's classes, `tf.keras.Model` included, onto
    Keras's v1 implementation for the whole process; `fit` then fails. Building
    any model eagerly rebases `tf.keras.Model` back. NeuMF's own class stays
    rebased, which is why `_PooledNeuMF` does not call NeuMF's layers.
    """
    tf.keras.Model()


class _PooledNeuMF(tf.keras.Model):
    """Keras model over a NeuMF's variables; input `(users, items)`.

    It does not call the NeuMF's layers (see `_restore_keras_v2_classes`).
    """

    def __init__(self, model: neumf.NeuMF):
        super().__init__()
        self.config = model.config
        self.global_weights = list(model.global_variables)
        self.local_weights = list(model.local_variables)

    def call(self, inputs, training=False):
        users, items = (tf.cast(tf.reshape(x, [-1]), tf.int32) for x in inputs)
        item_gmf, item_mlp, tower, prediction = neumf.split_global_weights(
            self.config, self.global_weights)
        use_mlp = self.config.use_mlp
        return neumf.neumf_logits(
            tf.gather(self.local_weights[0], users),
            tf.gather(self.local_weights[1], users) if use_mlp else None,
            tf.gather(item_gmf, items),
            tf.gather(item_mlp, items) if use_mlp else None,
            tower,
            prediction,
        )


class CentralTrainer:
    """Centralized NeuMF on the pooled training split, one epoch at a time."""

    def __init__(
        self,
        *,
        split: Split,
        model_config: neumf.ModelConfig,
        seed: int = 0,
        learning_rate: float = DEFAULT_LEARNING_RATE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        num_negatives: int = DEFAULT_NUM_NEGATIVES,
        users: Sequence[int] | None = None,
    ):
        """Builds the model and the per-user training data.

        Args:
          split: The preprocessed dataset.
          model_config: The NeuMF sizes (`num_items` must match the split).
          seed: Seed of the initial weights, the negatives and the shuffling.
          learning_rate: Adam learning rate.
          batch_size: Examples per Adam step.
          num_negatives: Fresh negatives per positive, every epoch.
          users: The users whose data it trains on (default: all); the others'
            rows of the user tables keep their initial draw.

        Raises:
          ValueError: On inconsistent sizes or non-positive settings.
        """
        if model_config.num_items != split.num_items:
            raise ValueError(
                f'model has {model_config.num_items} items, data {split.num_items}')
        if learning_rate <= 0 or batch_size < 1 or num_negatives < 0:
            raise ValueError('learning_rate and batch_size must be positive, '
                             'num_negatives >= 0')
        self.split = split
        self.model_config = model_config
        self.seed = int(seed)
        self.learning_rate = float(learning_rate)
        self.batch_size = int(batch_size)
        self.num_negatives = int(num_negatives)
        self.train_data = FederatedTrainData.from_split(split)
        self.users = (np.arange(split.num_users) if users is None
                      else np.asarray(users, np.int64))
        self.round_num = 0
        self.model = None

    def initialize(self) -> None:
        """Fresh weights (a function of the seed), epoch 0."""
        num_users = self.split.num_users
        weights = neumf.NeuMF(self.model_config, seed=self.seed,
                              group_size=num_users)
        # The group model's user tables start at zeros; draw them as the
        # federated users' embeddings are drawn, N(0, 0.01^2).
        rng = np.random.default_rng([self.seed, _USER_TABLE_STREAM])
        for variable in weights.local_variables:
            variable.assign(rng.normal(0.0, neumf.EMBEDDING_STDDEV,
                                       variable.shape).astype(np.float32))
        model = _PooledNeuMF(weights)
        model.compile(
            optimizer=tf.keras.optimizers.Adam(learning_rate=self.learning_rate),
            loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
        self.model = model
        self.round_num = 0

    def _check_initialized(self) -> None:
        if self.model is None:
            raise RuntimeError('call initialize() first')

    def _epoch_examples(self, epoch: int) -> tuple[np.ndarray, ...]:
        """All users' examples of one epoch, shuffled: (users, items, labels)."""
        users = self.users
        batches = self.train_data.round_batches(
            users, seed=self.seed, round_num=epoch,
            num_negatives=self.num_negatives)
        sizes = [len(items) for items, _ in batches]
        slots = np.repeat(users, sizes).astype(np.int32)
        items = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        order = np.random.default_rng([self.seed, epoch, _USER_TABLE_STREAM]
                                      ).permutation(len(items))
        return slots[order], items[order], labels[order]

    def run_epoch(self) -> dict[str, float]:
        """Trains one more epoch.

        Returns:
          `loss` (mean training loss over the epoch), `examples` and
          `round_seconds` (the epoch's wall time).
        """
        self._check_initialized()
        epoch = self.round_num + 1
        start = time.perf_counter()
        slots, items, labels = self._epoch_examples(epoch)
        _restore_keras_v2_classes()
        history = self.model.fit(
            (slots, items), labels, batch_size=self.batch_size, epochs=1,
            shuffle=False, verbose=0)
        self.round_num = epoch
        return {
            'loss': float(history.history['loss'][-1]),
            'examples': float(len(items)),
            'round_seconds': time.perf_counter() - start,
        }

    run_round = run_epoch  # The simulation's name for one step of training.

    @property
    def global_weights(self) -> list[np.ndarray]:
        """Item-side weights in `NeuMF.global_variables` order."""
        self._check_initialized()
        return [v.numpy() for v in self.model.global_weights]

    def local_tables(self) -> list[np.ndarray]:
        """Every user's GMF and MLP rows, `[num_users, dim]` each."""
        self._check_initialized()
        return [v.numpy() for v in self.model.local_weights]

    def evaluate(self, which: str = 'test') -> dict[str, float]:
        """HR@K and NDCG@K over all users, as for the federated models."""
        metrics = sampled.evaluate_users(
            self.model_config, self.global_weights, self.local_tables(),
            self.split.candidates(which))
        return {k: float(v) for k, v in metrics.items()}

    def _optimizer_variables(self) -> list[tf.Variable]:
        optimizer = self.model.optimizer
        # Adam's slots exist only once built (a no-op after the first step).
        optimizer.build(self.model.trainable_variables)
        return list(optimizer.variables)

    def get_state(self) -> collections.OrderedDict:
        """Everything needed to resume: weights, Adam state, epoch, seed."""
        self._check_initialized()
        return collections.OrderedDict(
            round_num=np.int64(self.round_num),
            seed=np.int64(self.seed),
            weights=[v.numpy() for v in self.model.trainable_variables],
            optimizer=[v.numpy() for v in self._optimizer_variables()],
        )

    def restore(self, state: Mapping) -> None:
        """Resumes from a `get_state()` structure.

        Raises:
          ValueError: If the state was made with another seed or model.
        """
        if int(state['seed']) != self.seed:
            raise ValueError(
                f'checkpoint was made with seed {int(state["seed"])}, not {self.seed}')
        if self.model is None:
            self.initialize()
        variables = self.model.trainable_variables
        optimizer_variables = self._optimizer_variables()
        if len(state['weights']) != len(variables) or len(
                state['optimizer']) != len(optimizer_variables):
            raise ValueError('checkpoint does not match this model')
        for variable, value in zip(variables + optimizer_variables,
                                   list(state['weights']) + list(state['optimizer'])):
            variable.assign(np.asarray(value).reshape(variable.shape))
        self.round_num = int(state['round_num'])
