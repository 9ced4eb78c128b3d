"""Item popularity learned federatedly: the no-learning floor of every table.

Each sampled client uploads the counts of its training items (a dense vector
of length `num_items`), the uploads go through a `tff.aggregators` factory
(a plain sum by default; a DP or secure-sum factory plugs in the same way),
and the server adds the aggregate to its running counts. Items are ranked by
those counts.

  initialize() -> state@SERVER
  next(state@SERVER, items@CLIENTS) -> (state@SERVER, metrics@SERVER)

State: OrderedDict(counts float32 [num_items], aggregator_state, round_num
int32). A client's data is the int32 vector of its training items; in
simulation one TFF client may stand for several users by concatenating their
items (the sum is the same, but a DP factory then clips per group).
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff



def build_itempop_process(
    *,
    num_items: int,
    model_aggregator: tff.aggregators.UnweightedAggregationFactory | None = None,
) -> tff.templates.IterativeProcess:
    """Builds the federated popularity counter.

    Args:
      num_items: Size of the item index space (length of the count vector).
      model_aggregator: An unweighted `tff.aggregators` factory for the count
        vectors. Default: `tff.aggregators.SumFactory()`. A mean-like factory
        (e.g. DP) scales the counts, which does not change the ranking.

    Returns:
      A `tff.templates.IterativeProcess` (types in the module docstring);
      `next` also returns OrderedDict(clients, aggregation) metrics.

    Raises:
      ValueError: If `num_items` is not positive.
      TypeError: If `model_aggregator` is a weighted factory.
    """
    if num_items < 1:
        raise ValueError(f'num_items must be positive, got {num_items}')
    if model_aggregator is None:
        model_aggregator = tff.aggregators.SumFactory()
    if not isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
        raise TypeError(
            'model_aggregator must be an unweighted tff.aggregators factory, '
            f'got {type(model_aggregator).__name__}')
    counts_type = tff.TensorType(np.float32, [num_items])
    items_type = tff.TensorType(np.int32, [None])
    aggregation = model_aggregator.create(counts_type)

    @tff.tensorflow.computation
    def server_init():
        return collections.OrderedDict(
            counts=tf.zeros([num_items], tf.float32),
            round_num=tf.constant(0, tf.int32),
        )

    @tff.federated_computation
    def initialize_fn():
        server = tff.federated_eval(server_init, tff.SERVER)
        return tff.federated_zip(collections.OrderedDict(
            counts=server.counts,
            aggregator_state=aggregation.initialize(),
            round_num=server.round_num,
        ))

    state_type = initialize_fn.type_signature.result.member

    @tff.tensorflow.computation(items_type)
    def client_counts(items):
        # Out-of-range ids raise (segment ids are checked on CPU).
        return tf.math.unsorted_segment_sum(
            tf.ones_like(items, tf.float32), items, num_items)

    @tff.tensorflow.computation(items_type)
    def one(items):
        del items
        return tf.constant(1, tf.int32)

    @tff.tensorflow.computation(state_type.counts, state_type.round_num,
                                counts_type)
    def server_update(counts, round_num, aggregated):
        return collections.OrderedDict(counts=counts + aggregated,
                                       round_num=round_num + 1)

    @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                               tff.FederatedType(items_type, tff.CLIENTS))
    def next_fn(state, items):
        uploads = tff.federated_map(client_counts, items)
        aggregated = aggregation.next(state.aggregator_state, uploads)
        server = tff.federated_map(
            server_update, (state.counts, state.round_num, aggregated.result))
        new_state = tff.federated_zip(collections.OrderedDict(
            counts=server.counts,
            aggregator_state=aggregated.state,
            round_num=server.round_num,
        ))
        metrics = tff.federated_zip(collections.OrderedDict(
            clients=tff.federated_sum(tff.federated_map(one, items)),
            aggregation=aggregated.measurements,
        ))
        return new_state, metrics

    return tff.templates.IterativeProcess(initialize_fn, next_fn)
