"""The trained model as a TensorFlow SavedModel, for serving without this project.

`export_saved_model` writes the trained global weights with three functions
(also as signatures), loadable with plain `tf.saved_model.load`:

  score(embedding float32[U, D]) -> {'scores': float32[U, num_items]}
      NeuMF logits of every item (`neumf.score_items`); a user's embedding
      is its GMF row followed by its MLP row (D = sum of the widths).
  reconstruct(items int32[L], labels float32[L]) -> {'embedding': float32[1, D]}
      a user's embedding rebuilt from its interactions with the global part
      fixed: `local_training.reconstruct` with the run's steps, learning rate
      and loss, as the library rebuilds users who keep no embedding. The
      batch lists each positive item (label 1) followed by its negatives
      (label 0: items the user never interacted with, 4 per positive in
      training).
  recommend(embedding float32[1, D], exclude int32[None], k int32[])
      -> {'items', 'item_ids', 'scores'}: the top-k item indices, their
      original ids (as text) and logits, `exclude` (indices) left out.

and the variables `item_ids` (string[num_items], '' where an index has no
original id) and `embedding_widths`. Beside it: `model.json` (what the model
is and where it came from) and `items.csv` (index, original id).
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

from tff_fedrecgel.algorithms import local_training
from tff_fedrecgel.models import neumf
from tff_fedrecgel.recommendation import TrainedModel

SAVED_MODEL_DIR = 'saved_model'
MODEL_JSON = 'model.json'
ITEMS_CSV = 'items.csv'
FORMAT = 1


class _Serving(tf.Module):
    """The trained global weights and the functions that use them."""

    def __init__(self, model: TrainedModel):
        super().__init__(name='fedrecgel_model')
        config = model.model_config
        work = model.reconstruction
        self._config = config
        self.weights = [tf.Variable(w, trainable=False, name=f'global_{i}')
                        for i, w in enumerate(model.global_weights)]
        ids = model.items.as_strings()
        self.item_ids = tf.Variable(np.array(ids, dtype=object), trainable=False,
                                    dtype=tf.string, name='item_ids')
        self.embedding_widths = tf.Variable(list(config.local_dims), trainable=False,
                                            dtype=tf.int32, name='embedding_widths')
        has_id = np.zeros(config.num_items, bool)
        has_id[:model.items.num_with_id] = True
        self._has_id = tf.Variable(has_id, trainable=False, name='has_id')
        width = sum(config.local_dims)

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32)])
        def score(embedding):
            tables = tf.split(embedding, list(config.local_dims), axis=1)
            items = tf.tile(tf.range(config.num_items)[tf.newaxis, :],
                            [tf.shape(embedding)[0], 1])
            return {'scores': neumf.score_items(config, self.weights, tables, items)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32),
                                      tf.TensorSpec([None], tf.float32)])
        def reconstruct(items, labels):
            length = tf.size(items)
            weights = local_training.example_weights(
                length[tf.newaxis], length, loss_reduction=work.loss_reduction,
                chunk_size=work.chunk_size)
            tables, _ = local_training.reconstruct(
                config, self.weights, items[tf.newaxis], labels[tf.newaxis], weights,
                steps=work.reconstruction_steps, learning_rate=work.local_lr)
            return {'embedding': tf.concat(tables, axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([1, width], tf.float32),
                                      tf.TensorSpec([None], tf.int32),
                                      tf.TensorSpec([], tf.int32)])
        def recommend(embedding, exclude, k):
            scores = score(embedding)['scores'][0]
            excluded = tf.scatter_nd(exclude[:, tf.newaxis],
                                     tf.ones_like(exclude, tf.bool), [config.num_items])
            allowed = tf.logical_and(self._has_id, tf.logical_not(excluded))
            masked = tf.where(allowed, scores, -np.inf)
            k = tf.minimum(k, tf.reduce_sum(tf.cast(allowed, tf.int32)))
            top = tf.math.top_k(masked, k=k)
            return {'items': top.indices, 'item_ids': tf.gather(self.item_ids, top.indices),
                    'scores': top.values}

        self.score, self.reconstruct, self.recommend = score, reconstruct, recommend


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
    tf.saved_model.save(module, str(root / SAVED_MODEL_DIR), signatures={
        'score': module.score, 'reconstruct': module.reconstruct,
        'recommend': module.recommend})
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
        'embedding_widths': list(config.local_dims),
        'model': {'gmf_dim': config.gmf_dim, 'mlp_dim': config.mlp_dim,
                  'mlp_layers': list(config.mlp_layers), 'use_mlp': config.use_mlp},
        'reconstruction': {'steps': work.reconstruction_steps, 'learning_rate': work.local_lr,
                           'loss_reduction': work.loss_reduction,
                           'chunk_size': work.chunk_size,
                           'negatives_per_positive': model.num_negatives},
        'functions': {
            'score': 'embedding float32[U, D] -> scores float32[U, num_items]',
            'reconstruct': 'items int32[L], labels float32[L] -> embedding float32[1, D]',
            'recommend': 'embedding float32[1, D], exclude int32[n], k int32 -> '
                         'items, item_ids, scores',
        },
        **({'metadata': dict(metadata)} if metadata else {}),
    }
    (root / MODEL_JSON).write_text(json.dumps(info, indent=2) + '\n', encoding='utf-8')
    return info
