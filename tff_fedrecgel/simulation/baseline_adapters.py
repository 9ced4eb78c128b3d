"""The floor and the ceiling behind the driver's protocol.

* `ItemPop`: item popularity learned federatedly (`algorithms/itempop.py`):
  every sampled user uploads the counts of its training rows, the server
  accumulates them and ranks items by them. The no-learning floor.
* `Central`: the same NeuMF trained centrally on the pooled training split
  with Keras (`central.py`); a round is one epoch over every training user.
  Not a federated method: the non-federated ceiling.

Both run through the same driver, evaluation and program as the federated
methods, so their figures sit in the same tables.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tff_fedrecgel import central
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import itempop
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.models import neumf


class ItemPop:
    """Federated item popularity (an `Algorithm` of the driver)."""

    def __init__(self, *, split: Split, model_config: neumf.ModelConfig,
                 model_aggregator=None):
        """Builds the TFF process.

        Args:
          split: The dataset (each user uploads the counts of its training
            rows, repeats included).
          model_config: Only `num_items` is used.
          model_aggregator: An unweighted `tff.aggregators` factory (default a
            plain sum; DP or secure sums plug in).
        """
        self.model_config = model_config
        self.reconstruction = client_update.ClientWorkConfig()
        self.process = itempop.build_itempop_process(
            num_items=model_config.num_items, model_aggregator=model_aggregator)
        order = np.argsort(split.train_users, kind='stable')
        self._items = np.asarray(split.train_items, np.int32)[order]
        self._indptr = np.concatenate(
            [[0], np.cumsum(np.bincount(split.train_users, minlength=split.num_users))])
        self.state = None

    def initialize(self) -> None:
        self.state = self.process.initialize()

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict:
        del batches  # A client uploads its training rows' counts, not a batch.
        uploads = [self._items[self._indptr[u]:self._indptr[u + 1]] for u in users]
        self.state, metrics = self.process.next(self.state, uploads)
        return {'clients': float(metrics['clients'])}

    @property
    def item_scores(self) -> np.ndarray:
        return np.asarray(self.state['counts'])

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [self.item_scores]

    def local_tables(self) -> None:
        return None

    def get_state(self) -> list[np.ndarray]:
        return [np.asarray(x) for x in tf.nest.flatten(self.state)]

    def restore(self, state) -> None:
        self.state = tf.nest.pack_sequence_as(self.process.initialize(), list(state))


class Central:
    """NeuMF trained centrally, one epoch a round (an `Algorithm` of the driver)."""

    def __init__(self, *, split: Split, model_config: neumf.ModelConfig,
                 work: client_update.ClientWorkConfig, users: Sequence[int], seed: int = 0,
                 num_negatives: int = central.DEFAULT_NUM_NEGATIVES,
                 learning_rate: float = central.DEFAULT_LEARNING_RATE):
        """Builds the Keras model.

        Args:
          split: The dataset.
          model_config: The NeuMF sizes.
          work: How held-out users rebuild their embedding.
          users: The training users (held-out users are never trained on).
          seed: Seed of the weights, negatives and shuffling.
          num_negatives: Fresh negatives per positive, every epoch.
          learning_rate: The Adam rate.
        """
        self.model_config = model_config
        self.reconstruction = work
        self.item_scores = None
        self.trainer = central.CentralTrainer(
            split=split, model_config=model_config, seed=seed,
            num_negatives=num_negatives, users=users, learning_rate=learning_rate)

    def initialize(self) -> None:
        self.trainer.initialize()

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict:
        del users, batches  # Every training user, every epoch.
        metrics = self.trainer.run_epoch()
        return {'loss': metrics['loss'], 'examples': metrics['examples']}

    @property
    def global_weights(self) -> list[np.ndarray]:
        return self.trainer.global_weights

    def local_tables(self) -> list[np.ndarray]:
        return self.trainer.local_tables()

    def get_state(self) -> collections.OrderedDict:
        return self.trainer.get_state()

    def restore(self, state) -> None:
        self.trainer.restore(state)


def build_itempop(method, context) -> ItemPop:
    """The popularity floor's algorithm (its `methods.Method.builder`)."""
    del method
    return ItemPop(split=context.split, model_config=context.model_config,
                   model_aggregator=context.model_aggregator)


def build_central(method, context) -> Central:
    """The central ceiling's algorithm (its `methods.Method.builder`);
    `work.lr_scale` scales its Adam rate, as the tuner's ceiling searches it."""
    del method
    return Central(split=context.split, model_config=context.model_config,
                   work=context.work, seed=context.seed,
                   num_negatives=context.num_negatives, users=context.training_users,
                   learning_rate=central.DEFAULT_LEARNING_RATE * context.work.lr_scale)
