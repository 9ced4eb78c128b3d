"""TensorBoard's hparams dashboard and the item-embedding projector.

Scalars go through TFF's TensorBoardReleaseManager; these two plugins need
their own summaries, written with TensorBoard's plugin APIs.
"""

from __future__ import annotations

from collections.abc import Mapping
import os
import pathlib
from typing import Any

import numpy as np
import tensorflow as tf
from tensorboard.plugins import projector
from tensorboard.plugins.hparams import api as hparams_api


def _hparam_value(value: Any):
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_hparams(log_dir: os.PathLike | str, hparams: Mapping[str, Any]) -> None:
    """Records the run's settings for TensorBoard's hparams dashboard."""
    if not hparams:
        return
    writer = tf.summary.create_file_writer(str(pathlib.Path(log_dir)))
    with writer.as_default():
        hparams_api.hparams({k: _hparam_value(v) for k, v in hparams.items()})
    writer.close()


def write_item_projector(log_dir: os.PathLike | str, simulation) -> None:
    """Saves the GMF item embeddings for TensorBoard's projector.

    Args:
      log_dir: The TensorBoard folder.
      simulation: A `Simulation` with a current model.
    """
    log_dir = pathlib.Path(log_dir)
    projector_dir = log_dir / 'projector'
    projector_dir.mkdir(parents=True, exist_ok=True)
    item_gmf = simulation.global_weights[0]
    train_data = simulation.train_data
    popularity = np.bincount(train_data.items, minlength=train_data.num_items)
    (projector_dir / 'items.tsv').write_text(
        'item\ttrain_users\n'
        + ''.join(f'{i}\t{int(c)}\n' for i, c in enumerate(popularity))
    )
    embedding = tf.Variable(item_gmf, name='item_gmf_embedding')
    checkpoint = tf.train.Checkpoint(embedding=embedding)
    checkpoint.save(str(projector_dir / 'embedding.ckpt'))
    config = projector.ProjectorConfig()
    entry = config.embeddings.add()
    entry.tensor_name = 'embedding/.ATTRIBUTES/VARIABLE_VALUE'
    entry.metadata_path = 'items.tsv'
    projector.visualize_embeddings(str(projector_dir), config)
