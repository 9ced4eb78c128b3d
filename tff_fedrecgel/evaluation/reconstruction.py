"""Rebuilding the embeddings of users who keep none, for evaluation.

Users without a stored embedding (the 'reconstruct' local-state mode,
FedRecon, users never seen in training) first rebuild it from their data with
`local_training.reconstruct`: for all users at once with
`reconstruct_local_tables` (then any protocol ranks them), or per client in
`build_federated_reconstruction_evaluation` (the sampled protocol's
federated computation, after the rebuild).
"""

from __future__ import annotations

from collections.abc import Sequence
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.data import batching
from tff_fedrecgel.evaluation import ranking
from tff_fedrecgel.evaluation import sampled
from tff_fedrecgel.models import neumf

# Reconstruction keeps activations of every padded example for the gradient;
# this bounds users * padded length per batch (about 4 KB per example).
DEFAULT_MAX_BATCH_EXAMPLES = 1 << 16


def _reconstruct_group(config, work, global_weights, items, labels, lengths):
    weights = local_training.example_weights(
        lengths, tf.shape(items)[1], loss_reduction=work.loss_reduction,
        chunk_size=work.chunk_size)
    local, _ = local_training.reconstruct(
        config, global_weights, items, labels, weights,
        steps=work.reconstruction_steps, learning_rate=work.local_lr)
    return local


@functools.lru_cache(maxsize=32)
def _batch_reconstructor(config: neumf.ModelConfig, work: client_update.ClientWorkConfig):
    """One compiled batched reconstruction per (config, work)."""
    return tf.function(
        functools.partial(_reconstruct_group, config, work), autograph=False,
        input_signature=[neumf.global_weight_specs(config),
                         tf.TensorSpec([None, None], tf.int32),
                         tf.TensorSpec([None, None], tf.float32),
                         tf.TensorSpec([None], tf.int32)])


def reconstruct_local_tables(
    model_config: neumf.ModelConfig,
    work: client_update.ClientWorkConfig,
    global_weights: Sequence[np.ndarray],
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    max_batch_examples: int = DEFAULT_MAX_BATCH_EXAMPLES,
) -> list[np.ndarray]:
    """Every user's embedding as a reconstruction derives it.

    `local_training.reconstruct` with `work.reconstruction_steps`,
    `work.local_lr` and the loss of `work` (`loss_reduction`, `chunk_size`),
    for users packed into padded batches of similar length.

    Args:
      model_config: The NeuMF sizes.
      work: The client work config.
      global_weights: Arrays in `NeuMF.global_variables` order.
      batches: One `(items, labels)` pair per user, any lengths.
      max_batch_examples: Bound on users x padded length per batch (memory).

    Returns:
      `[num_users, dim]` float32 tables in `NeuMF.local_variables` order.

    Raises:
      ValueError: On mismatched items/labels, no users, or bad weights.
    """
    if not len(batches):
        raise ValueError('batches is empty')
    weights_in = neumf.global_tensors(model_config, global_weights)
    reconstruct = _batch_reconstructor(model_config, work)
    tables = [np.zeros((len(batches), d), np.float32) for d in model_config.local_dims]
    groups = batching.group_by_length([len(i) for i, _ in batches],
                                      max_examples=max_batch_examples)
    for users in groups:
        group = batching.pad_batches([batches[u] for u in users])
        result = reconstruct(weights_in, group.items, group.labels, group.lengths)
        for table, part in zip(tables, result):
            table[users] = part.numpy()
    return tables


def build_federated_reconstruction_evaluation(
    model_config: neumf.ModelConfig,
    work: client_update.ClientWorkConfig,
    *,
    top_ks: Sequence[int] = ranking.TOP_KS,
) -> tff.Computation:
    """Federated evaluation of users who rebuild their embedding first.

    Type: `(global_weights@SERVER, data@CLIENTS) -> metrics@SERVER`, where
    `data` is OrderedDict(items=int32[N], labels=float32[N], candidates=
    int32[C]): each client reconstructs its embedding from `(items, labels)`
    as the client work does, then ranks its candidates. `metrics` is the
    unweighted `federated_mean` of the clients' HR/NDCG values.

    Args:
      model_config: The NeuMF sizes.
      work: The client work config (see `reconstruct_local_tables`).
      top_ks: Cut-offs K.

    Returns:
      A `tff.Computation`.
    """
    top_ks = ranking.check_top_ks(top_ks)
    global_type = tff.types.tensorflow_to_type(neumf.global_weight_specs(model_config))
    data_spec = client_update.client_data_spec(single_user=True)
    data_spec['candidates'] = tf.TensorSpec([None], tf.int32)
    data_type = tff.types.tensorflow_to_type(data_spec)

    @tff.tensorflow.computation(global_type, data_type)
    def client_eval(global_weights, data):
        items = data['items']
        local = _reconstruct_group(model_config, work, global_weights, items[tf.newaxis],
                                   data['labels'][tf.newaxis], tf.size(items)[tf.newaxis])
        return sampled.client_metrics(model_config, global_weights, local, data['candidates'],
                               top_ks)

    @tff.federated_computation(tff.FederatedType(global_type, tff.SERVER),
                               tff.FederatedType(data_type, tff.CLIENTS))
    def evaluate(global_weights, data):
        metrics = tff.federated_map(client_eval,
                                    (tff.federated_broadcast(global_weights), data))
        return sampled.named_mean(metrics, top_ks)

    return evaluate
