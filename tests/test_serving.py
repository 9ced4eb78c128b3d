"""The SavedModel's graph pieces against the library's Python paths.

`serving_ops.new_user_batch` must draw exactly the batch
`FederatedTrainData.round_batch` draws for a new user, and `serving_ops.top_k`
must rank as `TrainedModel.top_k` does (TensorFlow alone, no TFF).
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrecgel import serving_ops
from tff_fedrecgel.data import client_data


@pytest.mark.parametrize('num_items, positives, k, seed', [
    (50, [7, 3, 49, 0, 12], 4, 0),
    (20, [19, 18, 17, 16], 4, 5),   # The negatives crowd into the low items.
    (9, [4, 2, 8, 0, 6], 4, 1),     # Exactly k items left.
    (30, [11], 0, 2),               # No negatives.
    (300, list(range(0, 240, 3)), 7, 3),
])
def test_new_user_batch_is_the_library_batch(num_items, positives, k, seed):
    positives = np.asarray(positives, np.int32)
    one_user = client_data.FederatedTrainData(
        num_users=1, num_items=num_items, indptr=np.array([0, len(positives)]),
        items=positives, sorted_items=np.sort(positives))
    items, labels = one_user.round_batch(0, seed=seed, round_num=0, num_negatives=k)
    # The table is longer than this user needs: a prefix serves it.
    uniforms = client_data.user_uniforms(seed=seed, round_num=0, user=0,
                                         length=num_items * (1 + k))
    got_items, got_labels = serving_ops.new_user_batch(
        tf.constant(positives), tf.constant(uniforms), num_items=num_items, num_negatives=k)
    np.testing.assert_array_equal(got_items.numpy(), items)
    np.testing.assert_array_equal(got_labels.numpy(), labels)


def test_new_user_batch_refuses_too_few_items_left():
    uniforms = tf.constant(client_data.user_uniforms(seed=0, round_num=0, user=0, length=50))
    with pytest.raises(tf.errors.InvalidArgumentError, match='too few items left'):
        serving_ops.new_user_batch(tf.constant([0, 1, 2, 3, 4, 5, 6], tf.int32), uniforms,
                                   num_items=10, num_negatives=4)


def test_top_k_ranks_like_the_library_and_pads_short_rows():
    scores = tf.constant([[0.5, 0.9, 0.9, 0.1, 0.7], [0.3, 0.2, 0.1, 0.0, 0.4]])
    excluded = tf.constant([[False, False, False, True, False],
                            [True, True, True, False, False]])
    has_id = tf.constant([True, True, True, True, False])  # The last has no id.
    ids = tf.constant(['a', 'b', 'c', 'd', ''])
    top = serving_ops.top_k(scores, excluded, has_id, ids, tf.constant(3))
    assert top['item_ids'].numpy().astype(str).tolist() == [['b', 'c', 'a'], ['d', '', '']]
    np.testing.assert_array_equal(top['scores'].numpy()[1], [0.0, -np.inf, -np.inf])


def test_lookup_names_the_unknown_ids():
    table = serving_ops.id_table(['10', '20'])
    assert serving_ops.lookup(table, tf.constant(['20', '10']), 'item').numpy().tolist() == [1, 0]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r'unknown item ids[\s\S]*30'):
        serving_ops.lookup(table, tf.constant(['10', '30']), 'item')
