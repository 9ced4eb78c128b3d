"""The trained model as a TensorFlow SavedModel, for serving without this project.

`export_saved_model` writes the trained global weights, every user's
embedding and training items, and the item ids, with these functions,
loadable with plain `tf.saved_model.load`. Ids are the data's original ids as
text (as `items.csv` and `users.csv` of the split write them):

  recommend(user_ids string[U], k int32[], exclude string[n] = seen items)
      -> {'item_ids': string[U, k], 'scores': float32[U, k]}
      each user's top-k by the exported embedding; `exclude` replaces (for
      every user given) the default, the items each user has in training.
  recommend_for_items(item_ids string[L], k int32[], exclude string[n] = the items)
      -> {'item_ids': string[k], 'scores': float32[k], 'embedding': float32[1, D]}
      a new user who interacted with these items: its batch (each item
      followed by negatives drawn as the library draws them) and its
      embedding rebuilt inside, then its top-k.
  user_embedding(user_ids string[U]) -> {'embedding': float32[U, D]}
  embedding_for_items(item_ids string[L]) -> {'embedding': float32[1, D]}
  score(embedding float32[U, D]) -> {'scores': float32[U, num_items]}

A user's embedding is its GMF row followed by its MLP row (D = the sum of
the widths): its stored row where users keep one, otherwise rebuilt at
export time from its training interactions exactly as the library rebuilds
it. Scores are NeuMF logits: sigmoid(score) is the model's probability that
the user interacts with the item; they rank items for one user and are not
calibrated across users. Items without an original id are never
recommended; a row with fewer than k candidates ends with '' and -inf.
Unknown ids or k < 1 raise `InvalidArgumentError` naming them.

`recommend`, `recommend_for_items` (both without `exclude`) and `score` are
also signatures. Beside the SavedModel: `model.json` (what the model is and
where it came from) and `items.csv` (index, original id).
"""

from __future__ import annotations

from collections.abc import Mapping
import csv
import json
import os
import pathlib
from typing import Any

import numpy as np
import tensorflow as tf

from tff_fedrecgel import serving_ops
from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.models import neumf
from tff_fedrecgel.recommendation import TrainedModel

SAVED_MODEL_DIR = 'saved_model'
MODEL_JSON = 'model.json'
ITEMS_CSV = 'items.csv'
FORMAT = 2

_IDS = tf.TensorSpec([None], tf.string)
_K = tf.TensorSpec([], tf.int32)

_FUNCTIONS = {
    'recommend': 'user_ids string[U], k int32, exclude string[n] (default: each '
                 "user's training items) -> item_ids string[U, k], scores float32[U, k]",
    'recommend_for_items': 'item_ids string[L], k int32, exclude string[n] (default: '
                           'the items) -> item_ids string[k], scores float32[k], '
                           'embedding float32[1, D]',
    'user_embedding': 'user_ids string[U] -> embedding float32[U, D]',
    'embedding_for_items': 'item_ids string[L] -> embedding float32[1, D]',
    'score': 'embedding float32[U, D] -> scores float32[U, num_items]',
}
SCORES = ('NeuMF logits: sigmoid(score) is the predicted probability of an '
          'interaction; comparable within one user, not across users')


class _Serving(tf.Module):
    """The trained model's variables and the functions that use them."""

    def __init__(self, model: TrainedModel):
        super().__init__(name='fedrecgel_model')
        config = model.model_config
        work = model.reconstruction
        k = model.num_negatives
        num_items = config.num_items
        self.weights = [tf.Variable(w, trainable=False, name=f'global_{i}')
                        for i, w in enumerate(model.global_weights)]
        item_ids = model.items.as_strings()
        user_ids = model.users.as_strings()
        self.item_ids = tf.Variable(np.array(item_ids, dtype=object), trainable=False,
                                    dtype=tf.string, name='item_ids')
        self.user_ids = tf.Variable(np.array(user_ids, dtype=object), trainable=False,
                                    dtype=tf.string, name='user_ids')
        self.embedding_widths = tf.Variable(list(config.local_dims), trainable=False,
                                            dtype=tf.int32, name='embedding_widths')
        self.user_embeddings = tf.Variable(
            np.concatenate(model.all_user_tables(), axis=1), trainable=False,
            name='user_embeddings')
        indptr, seen = model.seen_items_csr()
        self.seen_row_splits = tf.Variable(indptr, trainable=False, name='seen_row_splits')
        self.seen_items = tf.Variable(seen, trainable=False, name='seen_items')
        has_id = np.zeros(num_items, bool)
        has_id[:model.items.num_with_id] = True
        self._has_id = tf.Variable(has_id, trainable=False, name='has_id')
        # A new user's draw: one table serves every length (a prefix of it).
        self._uniforms = tf.Variable(model.new_user_uniforms(num_items * (1 + k)),
                                     trainable=False, name='new_user_uniforms')
        self._item_index = serving_ops.id_table(item_ids[:model.items.num_with_id])
        self._user_index = serving_ops.id_table(user_ids[:model.users.num_with_id])
        widths = list(config.local_dims)

        def scores_of(embedding):
            tables = tf.split(embedding, widths, axis=1)
            items = tf.tile(tf.range(num_items)[tf.newaxis, :], [tf.shape(embedding)[0], 1])
            return neumf.score_items(config, self.weights, tables, items)

        def excluded_items(exclude, users):
            indices = serving_ops.lookup(self._item_index, exclude, 'item')
            one = serving_ops.rows_mask(tf.RaggedTensor.from_row_lengths(
                indices, tf.size(indices)[tf.newaxis]), num_items)
            return tf.tile(one, [users, 1])

        def rebuild(item_ids):
            positives, _ = tf.unique(serving_ops.lookup(self._item_index, item_ids, 'item'))
            items, labels = serving_ops.new_user_batch(
                positives, self._uniforms, num_items=num_items, num_negatives=k)
            length = tf.size(items)
            weights = local_training.example_weights(
                length[tf.newaxis], length, loss_reduction=work.loss_reduction,
                chunk_size=work.chunk_size)
            tables, _ = local_training.reconstruct(
                config, self.weights, items[tf.newaxis], labels[tf.newaxis], weights,
                steps=work.reconstruction_steps, learning_rate=work.local_lr)
            return positives, tf.concat(tables, axis=1)

        @tf.function(input_signature=[tf.TensorSpec([None, sum(widths)], tf.float32)])
        def score(embedding):
            return {'scores': scores_of(embedding)}

        @tf.function(input_signature=[_IDS])
        def user_embedding(user_ids):
            users = serving_ops.lookup(self._user_index, user_ids, 'user')
            return {'embedding': tf.gather(self.user_embeddings, users)}

        @tf.function(input_signature=[_IDS])
        def embedding_for_items(item_ids):
            return {'embedding': rebuild(item_ids)[1]}

        @tf.function
        def recommend(user_ids, k, exclude=None):
            users = serving_ops.lookup(self._user_index, user_ids, 'user')
            embedding = tf.gather(self.user_embeddings, users)
            if exclude is None:
                seen = tf.RaggedTensor.from_row_splits(self.seen_items, self.seen_row_splits)
                excluded = serving_ops.rows_mask(tf.gather(seen, users), num_items)
            else:
                excluded = excluded_items(exclude, tf.size(users))
            return serving_ops.top_k(scores_of(embedding), excluded, self._has_id,
                                     self.item_ids, k)

        @tf.function
        def recommend_for_items(item_ids, k, exclude=None):
            positives, embedding = rebuild(item_ids)
            if exclude is None:
                excluded = serving_ops.rows_mask(tf.RaggedTensor.from_row_lengths(
                    positives, tf.size(positives)[tf.newaxis]), num_items)
            else:
                excluded = excluded_items(exclude, 1)
            top = serving_ops.top_k(scores_of(embedding), excluded, self._has_id,
                                    self.item_ids, k)
            return {'item_ids': top['item_ids'][0], 'scores': top['scores'][0],
                    'embedding': embedding}

        # Traced with and without `exclude`: the loaded functions take both.
        recommend.get_concrete_function(_IDS, _K, _IDS)
        recommend_for_items.get_concrete_function(_IDS, _K, _IDS)
        self.signature_functions = {
            'recommend': recommend.get_concrete_function(_IDS, _K),
            'recommend_for_items': recommend_for_items.get_concrete_function(_IDS, _K),
            'score': score}
        self.score, self.user_embedding = score, user_embedding
        self.embedding_for_items = embedding_for_items
        self.recommend, self.recommend_for_items = recommend, recommend_for_items


def export_saved_model(model: TrainedModel, output_dir: str | os.PathLike, *,
                       metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Writes the trained model for serving.

    Args:
      model: The trained model.
      output_dir: Folder to write `saved_model/`, `model.json` and `items.csv`
        into (created if missing).
      metadata: Recorded in `model.json` (e.g. the run's settings).

    Returns:
      The contents of `model.json`.

    Raises:
      OSError: If the folder cannot be written.
    """
    root = pathlib.Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    module = _Serving(model)
    tf.saved_model.save(module, str(root / SAVED_MODEL_DIR),
                        signatures=module.signature_functions)
    with open(root / ITEMS_CSV, 'w', newline='', encoding='utf-8') as f:
        writer = csv.writer(f)
        writer.writerow(['item', 'original_id'])
        writer.writerows(enumerate(model.items.as_strings()[:model.items.num_with_id]))
    work = model.reconstruction
    config = model.model_config
    info = {
        'format': FORMAT,
        'saved_model': SAVED_MODEL_DIR,
        'num_items': config.num_items,
        'num_items_with_id': model.items.num_with_id,
        'num_users': model.split.num_users,
        'embedding_widths': list(config.local_dims),
        'user_embeddings': ('stored' if model.local_tables is not None
                            and not model.rebuilt_users else
                            'rebuilt' if model.local_tables is None else
                            'stored, rebuilt for the users held out of training'),
        'model': {'gmf_dim': config.gmf_dim, 'mlp_dim': config.mlp_dim,
                  'mlp_layers': list(config.mlp_layers), 'use_mlp': config.use_mlp},
        'reconstruction': {'steps': work.reconstruction_steps, 'learning_rate': work.local_lr,
                           'loss_reduction': work.loss_reduction,
                           'chunk_size': work.chunk_size,
                           'negatives_per_positive': model.num_negatives},
        'functions': dict(_FUNCTIONS),
        'scores': SCORES,
        **({'metadata': dict(metadata)} if metadata else {}),
    }
    (root / MODEL_JSON).write_text(json.dumps(info, indent=2) + '\n', encoding='utf-8')
    return info
