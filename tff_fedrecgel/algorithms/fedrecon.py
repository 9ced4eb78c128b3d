"""FedRecon: TFF's Federated Reconstruction on this project's NeuMF.

The FedRecon baseline (Singhal et al., NeurIPS 2021) as TFF builds it:
`tff.learning.algorithms.build_fed_recon` for training and
`build_fed_recon_eval` for evaluation, on the same NeuMF split into global
layers (item embeddings, tower, prediction) and local layers (the user's
embedding rows) that FedRecGEL uses. TFF composes that round from a
distributor, a client work, an aggregator and a finalizer, the shape of
FedRecGEL's round, and its distributor is FedRecGEL's
(`round_parts.build_distributor`). Nothing of a user persists between
rounds: each round the user embedding restarts from zeros, takes
`reconstruction_steps` Adam steps on the user's batch with the global weights
frozen, and then the global weights take one SGD step of rate 1 on the same
batch, so the uploaded `initial - final` is the gradient of the mean loss, the
same quantity FedRecGEL's clients upload (without SAM). The server applies
the unweighted mean with Adam, as FedRecGEL does.

A client's data is one batch: its training positives with freshly sampled
negatives (`train_dataset`). For evaluation (`eval_dataset`) a second batch
holds the held-out item and its negatives; the first reconstructs, the second
is ranked by the sampled protocol's Keras metrics
(`evaluation.keras_metrics.RankMetric`).

For simulation speed, `build_fedrecon_process(group_size=...)` lets one TFF
client stand for a group of users (`group_train_dataset`), still through
`build_fed_recon`; it computes the same round as one user per client.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import algorithm_config
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.algorithms import round_parts
from tff_fedrecgel.evaluation import keras_metrics
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.models import neumf

_WORK = algorithm_config.CLIENT_WORK
_SERVER = algorithm_config.SERVER
# The sampled protocol's Keras metrics (re-exported: part of this module's API).
RankMetric = keras_metrics.RankMetric
rank_metrics = keras_metrics.rank_metrics


def train_dataset(items: np.ndarray, labels: np.ndarray) -> tf.data.Dataset:
    """A client's training data: all its examples as one batch."""
    items = np.asarray(items, np.int32).reshape(-1)
    labels = np.asarray(labels, np.float32).reshape(-1)
    if items.shape != labels.shape or not items.size:
        raise ValueError(f'need matching, non-empty items and labels; got '
                         f'{items.size} items and {labels.size} labels')
    return tf.data.Dataset.from_tensors((items, labels))


def eval_dataset(items: np.ndarray, labels: np.ndarray,
                 candidates: np.ndarray) -> tf.data.Dataset:
    """A client's evaluation data: its training batch, then its candidates.

    Args:
      items: Training items (positives and negatives) to reconstruct from.
      labels: Their labels.
      candidates: The held-out item first, then its negatives.

    Returns:
      A two-element dataset of `(items, labels)` batches.
    """
    candidates = np.asarray(candidates, np.int32).reshape(-1)
    candidate_labels = np.zeros(candidates.size, np.float32)
    candidate_labels[0] = 1.0
    return train_dataset(items, labels).concatenate(
        tf.data.Dataset.from_tensors((candidates, candidate_labels)))


def group_train_dataset(batches) -> tf.data.Dataset:
    """Training data of a TFF client simulating a group of users.

    Args:
      batches: One `(items, labels)` pair per user of the group.

    Returns:
      One batch `((slots, items), targets)`: `slots` is each example's user
      row in the group, `targets` is `[n, 2]` of (label, 1 / the user's
      example count), so the weighted sum of the losses is the sum of the
      users' mean losses.
    """
    slots, items, targets = [], [], []
    for slot, (user_items, user_labels) in enumerate(batches):
        user_items = np.asarray(user_items, np.int32).reshape(-1)
        user_labels = np.asarray(user_labels, np.float32).reshape(-1)
        if user_items.shape != user_labels.shape or not user_items.size:
            raise ValueError(f'user {slot}: need matching, non-empty items and labels')
        slots.append(np.full(user_items.size, slot, np.int32))
        items.append(user_items)
        targets.append(np.stack(
            [user_labels, np.full(user_items.size, 1.0 / user_items.size, np.float32)],
            axis=1))
    if not slots:
        raise ValueError('a group needs at least one user')
    return tf.data.Dataset.from_tensors(
        ((np.concatenate(slots), np.concatenate(items)), np.concatenate(targets)))


class WeightedBinaryCrossentropy(tf.keras.losses.Loss):
    """Sum over examples of weight x BCE(logits); targets are (label, weight)."""

    def __init__(self, name: str = 'weighted_bce'):
        super().__init__(reduction=tf.keras.losses.Reduction.SUM, name=name)

    def call(self, y_true, y_pred):
        return y_true[:, 1] * tf.nn.sigmoid_cross_entropy_with_logits(
            labels=y_true[:, 0], logits=tf.reshape(y_pred, [-1]))


def _model_fn(model_config: neumf.ModelConfig, init_seed: int | None):
    return lambda: neumf.build_reconstruction_model(
        model_config, seed=init_seed, zero_local=True)


def _group_model_fn(model_config: neumf.ModelConfig, init_seed: int | None,
                    group_size: int):
    def model_fn():
        model = neumf.NeuMF(model_config, seed=init_seed, group_size=group_size)
        input_spec = (
            (tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)),
            tf.TensorSpec([None, 2], tf.float32),
        )
        return tff.learning.models.ReconstructionModel.from_keras_model_and_layers(
            model, global_layers=model.global_layers,
            local_layers=model.local_layers, input_spec=input_spec)
    return model_fn


def _loss_fn():
    return tf.keras.losses.BinaryCrossentropy(from_logits=True)


def _reconstruction_optimizer(local_lr: float):
    return tff.learning.optimizers.build_adam(
        learning_rate=local_lr, epsilon=local_training.ADAM_EPSILON)


def _distributor(model_fn) -> tff.learning.templates.DistributionProcess:
    """FedRecGEL's distributor (`round_parts.build_distributor`) for the model's weights."""

    @tff.tensorflow.computation
    def global_weights():
        return tff.learning.models.ReconstructionModel.get_global_variables(model_fn())

    return round_parts.build_distributor(global_weights.type_signature.result)


def _check(reconstruction_steps: int, local_lr: float) -> None:
    if reconstruction_steps < 1:
        raise ValueError(f'reconstruction_steps must be >= 1, got {reconstruction_steps}')
    if local_lr <= 0:
        raise ValueError(f'local_lr must be positive, got {local_lr}')


def build_fedrecon_process(
    *,
    model_config: neumf.ModelConfig,
    reconstruction_steps: int = _WORK.reconstruction_steps,
    local_lr: float = _WORK.local_lr,
    server_lr: float = _SERVER.learning_rate,
    init_seed: int | None = 0,
    group_size: int | None = None,
    clients_per_round: int | None = None,
) -> tff.learning.templates.LearningProcess:
    """FedRecon training through `tff.learning.algorithms.build_fed_recon`.

    With `group_size`, one TFF client simulates up to that many users at
    once (`group_train_dataset`): the model's local tables hold one row per
    user and the loss is the sum of the users' mean losses, so each row's
    gradient, and hence its Adam reconstruction, is that user's alone; the
    global step's loss is scaled by 1 / `clients_per_round` and the server
    sums the groups' updates, which gives the mean over the round's users of
    the per-user uploads, i.e. the same round as one user per client
    (tests check this to float rounding).

    Args:
      model_config: The NeuMF sizes.
      reconstruction_steps: Adam steps that reconstruct the user embedding
        from zeros on the client's batch each round.
      local_lr: Learning rate of that Adam (epsilon 1e-8).
      server_lr: Learning rate of the server Adam (epsilon 1e-8).
      init_seed: Seed of the initial global weights (None: fresh draw).
      group_size: Users per TFF client (None: one, the deployable form).
      clients_per_round: Users per round; required with `group_size`.

    Returns:
      A `tff.learning.templates.LearningProcess` whose `next` takes
      `(state, [train_dataset(...) per client])`, or with `group_size`
      `(state, [group_train_dataset(...) per group])`; the groups of a round
      must hold `clients_per_round` users in all.

    Raises:
      ValueError: On a non-positive step count, learning rate or size.
    """
    _check(reconstruction_steps, local_lr)
    if server_lr <= 0:
        raise ValueError(f'server_lr must be positive, got {server_lr}')
    server_optimizer = tff.learning.optimizers.build_adam(
        learning_rate=server_lr, epsilon=local_training.ADAM_EPSILON)
    if group_size is not None:
        if group_size < 1 or not clients_per_round or clients_per_round < 1:
            raise ValueError('group_size and clients_per_round must be positive')
        scale = [1.0, 1.0 / clients_per_round]  # Per target column.
        model_fn = _group_model_fn(model_config, init_seed, group_size)
        return tff.learning.algorithms.build_fed_recon(
            model_fn=model_fn,
            loss_fn=WeightedBinaryCrossentropy,
            server_optimizer_fn=server_optimizer,
            client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
            reconstruction_optimizer_fn=_reconstruction_optimizer(local_lr),
            dataset_split_fn=lambda data: (
                data.repeat(reconstruction_steps),
                data.map(lambda x, y: (x, y * scale))),
            client_weighting=tff.learning.ClientWeighting.UNIFORM,
            model_distributor=_distributor(model_fn),
            model_aggregator_factory=tff.aggregators.SumFactory(),
        )
    model_fn = _model_fn(model_config, init_seed)
    return tff.learning.algorithms.build_fed_recon(
        model_fn=model_fn,
        loss_fn=_loss_fn,
        server_optimizer_fn=server_optimizer,
        # One step of rate 1 on the whole batch: the upload is the gradient.
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        reconstruction_optimizer_fn=_reconstruction_optimizer(local_lr),
        dataset_split_fn=lambda data: (data.repeat(reconstruction_steps), data),
        client_weighting=tff.learning.ClientWeighting.UNIFORM,
        model_distributor=_distributor(model_fn),
    )


def build_fedrecon_evaluation(
    *,
    model_config: neumf.ModelConfig,
    reconstruction_steps: int = _WORK.reconstruction_steps,
    local_lr: float = _WORK.local_lr,
    top_ks=protocols.TOP_KS,
) -> tff.learning.templates.LearningProcess:
    """FedRecon evaluation through `tff.learning.algorithms.build_fed_recon_eval`.

    Each client reconstructs its embedding from the first batch of its
    `eval_dataset` exactly as in training, then ranks the second batch.
    Set the weights to evaluate with `process.set_model_weights(state,
    training_process.get_model_weights(training_state))`.

    Args:
      model_config: The NeuMF sizes.
      reconstruction_steps: As in `build_fedrecon_process`.
      local_lr: As in `build_fedrecon_process`.
      top_ks: Cut-offs K of the HR/NDCG metrics.

    Returns:
      A `tff.learning.templates.LearningProcess`; `next(state, datasets)`
      reports `client_work.eval.current_round_metrics` with `hr_at_k`, `ndcg_at_k`
      (means over clients) and 'loss'.

    Raises:
      ValueError: On a non-positive step count or learning rate.
    """
    _check(reconstruction_steps, local_lr)
    top_ks = tuple(top_ks)
    return tff.learning.algorithms.build_fed_recon_eval(
        model_fn=_model_fn(model_config, None),
        loss_fn=_loss_fn,
        metrics_fn=lambda: protocols.SAMPLED.keras_metrics(top_ks),
        reconstruction_optimizer_fn=_reconstruction_optimizer(local_lr),
        dataset_split_fn=lambda data: (
            data.take(1).repeat(reconstruction_steps), data.skip(1)),
    )


def matching_client_work(*, reconstruction_steps: int = _WORK.reconstruction_steps,
                         local_lr: float = _WORK.local_lr) -> client_update.ClientWorkConfig:
    """The project's 'reconstruct' client work that computes what FedRecon does.

    Zeros, then `reconstruction_steps` Adam steps on the mean loss, no SAM:
    `evaluation.reconstruct_local_tables` with it gives the embeddings
    FedRecon's clients reconstruct, for the fast all-users evaluation.
    """
    return client_update.ClientWorkConfig(
        rho_sh=0.0, rho_ns=0.0, local_lr=local_lr, loss_reduction='mean',
        local_state='reconstruct', reconstruction_steps=reconstruction_steps)
