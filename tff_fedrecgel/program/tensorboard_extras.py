"""TensorBoard: per-round scalars, the hparams dashboard and the projector.

Scalars go through `ScalarReleaseManager`, a `tff.program.ReleaseManager`
like TFF's `TensorBoardReleaseManager` that also marks where a run resumes;
the hparams dashboard and the projector need their own summaries, written
with TensorBoard's plugin APIs.
"""

from __future__ import annotations

from collections.abc import Mapping
import os
import pathlib
import time
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins import projector
from tensorboard.plugins.hparams import api as hparams_api
import tree
# `import_event` writes a whole Event proto; no public tf.summary API does.
from tensorflow.python.ops import summary_ops_v2  # pylint: disable=g-direct-tensorflow-import


class ScalarReleaseManager(tff.program.ReleaseManager):
    """Releases each round's metrics as TensorBoard scalars, step = round.

    A run resumed from an older checkpoint writes again the rounds after it;
    its event file starts with a `SessionLog.START` event at the first round
    it writes, and TensorBoard then drops the steps from that round on that
    the interrupted run had written (its orphaned-data purge), so every round
    shows once, with the resumed run's values. TensorBoard's reader takes the
    first START of a folder as its beginning and purges on the later ones, so
    two are written (also right for folders written before this marker).
    The marker must come before the run's scalars in reading order, hence
    one writer for both (TFF's manager keeps its writer private).
    """

    def __init__(self, summary_dir: os.PathLike | str, *, first_step: int):
        """Opens the event file and marks the run's start.

        Args:
          summary_dir: The TensorBoard folder.
          first_step: The first round this run releases.
        """
        self._writer = tf.summary.create_file_writer(str(summary_dir))
        start = event_pb2.Event(
            step=int(first_step), wall_time=time.time(),
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
        with self._writer.as_default():
            for _ in range(2):
                summary_ops_v2.import_event(tf.constant(start.SerializeToString()))
        self._writer.flush()

    async def release(self, value: Any, key: int) -> None:
        """Writes every number of `value` at step `key` and flushes.

        Args:
          value: A nested structure of numbers (names joined by '/').
          key: The round.
        """
        with self._writer.as_default():
            for path, leaf in tree.flatten_with_path(value):
                array = np.asarray(leaf)
                if array.dtype.kind not in 'biuf':
                    continue
                name = '/'.join(map(str, path))
                if array.shape:
                    tf.summary.histogram(name, array, step=key)
                else:
                    tf.summary.scalar(name, array, step=key)
        self._writer.flush()  # Write errors (a full disk) surface here.

    def close(self) -> None:
        self._writer.close()


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
      simulation: A `FedRecSimulation` with a current model.
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
