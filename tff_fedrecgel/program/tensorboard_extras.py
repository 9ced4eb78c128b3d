"""TensorBoard: per-round scalars, the hparams dashboard and the projector.

Scalars go through `ScalarReleaseManager`, a `tff.program.ReleaseManager`
like TFF's `TensorBoardReleaseManager` that also marks where a run resumes
(TensorBoard then drops the steps an interrupted run had written). Each
released metric gets its TensorBoard tag and a description (`scalar_tag`):
the ranking metrics keep their group (`test/hr@10`), the losses stay under
`train/`, and what counts or times the round goes under `workload/`. The other
plugins need their own files, written with TensorBoard's plugin APIs.
Everything lands in the run's own log folder, `<run>/tensorboard/<experiment
name>/` (`run_log_dir`), so `tensorboard --logdir <run>/tensorboard` shows
every plugin under the experiment's name, and a folder of runs shows each
under its own:

- custom scalars: each ranking metric's curves beside item popularity's
  figure on the same split, a flat line (`ScalarReleaseManager.write_floor`);
- hparams: `tensorboard_hparams` (the settings and the selected metrics);
- projector: ``projector_config.pbtxt`` at the top of the folder, its tables
  and labels in ``projector/`` as TSV files, so that no checkpoint is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import os
import pathlib
import re
import time
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins import projector
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import summary as custom_scalar_summary
import tree
# `import_event` writes a whole Event proto; no public tf.summary API does.
from tensorflow.python.ops import summary_ops_v2  # pylint: disable=g-direct-tensorflow-import

from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.evaluation import protocols


# Released metrics that count or time the round rather than measure the
# model, shown apart from the losses; and what each says. TensorBoard orders
# groups by name: this one sorts after every metric group (test, train,
# valid and their _full and heldout kin).
WORKLOAD_GROUP = 'workload'
_WORKLOAD_METRICS = {
    'train/clients': 'Users sampled this round (the cohort).',
    'train/dropped_clients': ('Sampled users whose update was not finite, left out '
                              'of the average (their state unchanged).'),
    'train/examples_per_client': ('Mean length of the cohort\'s round batches '
                                  '(positives and their negatives).'),
    'train/round_seconds': ('Wall seconds of the round\'s training: cohort, batches '
                            'and the TFF round.'),
    'eval_seconds': 'Wall seconds of the round\'s evaluation, every group.',
}
_TRAIN_METRICS = {
    'loss': ('Mean over the cohort of the training loss at the received weights '
             '(the base pass).'),
    'sam_loss_global': ('Mean loss with the global part moved by rho_sh along its '
                        'normalized gradient (SAM\'s point; the base loss at rho_sh = 0).'),
    'sam_loss_local': ('Mean loss with the user embedding moved by rho_ns along its '
                       'normalized gradient (SAM\'s point; the base loss at rho_ns = 0).'),
    'sharpness_global': ('sam_loss_global minus loss: how much the loss rises within '
                         'radius rho_sh of the global part. SAM lowers it.'),
    'sharpness_local': ('sam_loss_local minus loss: how much the loss rises within '
                        'radius rho_ns of the user embedding.'),
    'probe_sharpness_global': ('Loss rise at the --sharpness_probe radius along the '
                               'global gradient: one radius for every method.'),
    'probe_sharpness_local': ('Loss rise at the --sharpness_probe radius along the '
                              'user embedding\'s gradient.'),
    'dp_epsilon': 'Differential privacy: the epsilon spent so far, at the run\'s delta.',
}
_HELD_OUT = {
    'test': 'the test item (each user\'s latest interaction)',
    'valid': 'the validation item (each user\'s second-latest interaction)',
    'heldout': ('the test item of the users never trained on, their embedding '
                'rebuilt from their own data'),
}
_RANKING = {
    'hr': 'HR@{k}: the share of users whose held-out item ranks in the top {k}',
    'ndcg': ('NDCG@{k}: the mean over users of 1 / log2(rank + 2) when the held-out '
             'item ranks in the top {k}, else 0'),
    'mrr': 'MRR: the mean over users of 1 / (rank + 1)',
}


def scalar_tag(name: str) -> tuple[str, str]:
    """The TensorBoard tag and description of a released metric.

    Args:
      name: The metric's flattened name, as in metrics.csv (`test/hr@10`,
        `train/round_seconds`, `eval_seconds`).

    Returns:
      `(tag, description)`: counters and timings move to `workload/`; every
      other name is kept.
    """
    if name in _WORKLOAD_METRICS:
        return f'{WORKLOAD_GROUP}/{name.rpartition("/")[2]}', _WORKLOAD_METRICS[name]
    group, _, metric = name.partition('/')
    if group == 'train':
        if metric in _TRAIN_METRICS:
            return name, _TRAIN_METRICS[metric]
        if metric.startswith('aggregation/'):
            return name, f'A measurement of the aggregator: {metric[12:]}.'
        return name, f'Training metric {metric}.'
    protocol = protocols.of_group(group)
    base = group[:len(group) - len(protocol.suffix)] if protocol.suffix else group
    kind, _, k = metric.partition('@')
    if base in _HELD_OUT and kind in _RANKING:
        return name, (f'{_RANKING[kind].format(k=k)}; {_HELD_OUT[base]} ranked '
                      f'{protocol.candidates}, ties counted against it.')
    return name, f'{name}, as released by the run.'


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
                tag, description = scalar_tag('/'.join(map(str, path)))
                if array.shape:
                    tf.summary.histogram(tag, array, step=key, description=description)
                else:
                    tf.summary.scalar(tag, array, step=key, description=description)
        self._writer.flush()  # Write errors (a full disk) surface here.

    def write_floor(self, floor: Mapping[str, float], *, steps: Sequence[int]) -> None:
        """Writes item popularity's metrics on the run's split as flat lines
        (`popularity/test_full/hr@10`, ...) over `steps`, and a custom-scalars
        layout that draws each test HR@10 and NDCG@10 curve beside them.

        Args:
          floor: `EvaluationPlan.popularity`'s metrics.
          steps: The rounds the lines span (this run's first and last).
        """
        names = [n for n in floor if n.partition('/')[2] in FLOOR_METRICS]
        with self._writer.as_default():
            for name in names:
                description = ('Item popularity on the same split (the floor): '
                               + scalar_tag(name)[1])
                for step in sorted(set(steps)):
                    tf.summary.scalar(f'{FLOOR_GROUP}/{name}', floor[name], step=step,
                                      description=description)
            tf.summary.experimental.write_raw_pb(
                custom_scalar_summary.pb(_floor_layout(names)).SerializeToString(), step=0)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


# The group of the floor's flat lines, and its custom-scalars category.
FLOOR_GROUP = 'popularity'
FLOOR_CATEGORY = 'against item popularity'
FLOOR_METRICS = ('hr@10', 'ndcg@10')


def _floor_layout(names: Sequence[str]) -> layout_pb2.Layout:
    """One chart per protocol and metric: the training users' test-item
    curve (what the floor measures too) with the floor's line."""
    charts = []
    for name in names:
        group, _, metric = name.partition('/')
        pattern = '|'.join(re.escape(t) for t in (name, f'{FLOOR_GROUP}/{name}'))
        charts.append(layout_pb2.Chart(
            title=f'{name} against item popularity ({protocols.of_group(group).name} '
                  'protocol)',
            multiline=layout_pb2.MultilineChartContent(tag=[f'^({pattern})$'])))
    return layout_pb2.Layout(category=[layout_pb2.Category(title=FLOOR_CATEGORY,
                                                           chart=charts)])


PROJECTOR_DIR = 'projector'
ITEMS_FILE = 'items.tsv'


def _label(value: Any) -> str:
    # TSV cells: no tabs or line breaks.
    return ' '.join(str(value).split()) or '""'


def popularity_deciles(popularity: np.ndarray) -> np.ndarray:
    """Each item's popularity decile, 1 (least) to 10 (most popular).

    An item's decile is 1 + floor(10 * share of items strictly less popular
    than it): items of equal popularity share one decile, and the items no
    one trained on are all in the first.

    Args:
      popularity: int [num_items] counts.

    Returns:
      int [num_items] deciles.
    """
    popularity = np.asarray(popularity)
    below = np.searchsorted(np.sort(popularity), popularity, side='left')
    return 1 + (10 * below) // max(len(popularity), 1)


def write_item_projector(log_dir: os.PathLike | str, *,
                         item_tables: Mapping[str, np.ndarray],
                         split: Split) -> None:
    """Writes item embedding tables for TensorBoard's projector.

    Each item is labelled by its original id (`split.item_ids`; an index past
    the map, never seen in the data, by ``#<index>``), with its index, its
    number of training users (`train_users`) and its popularity decile
    (`popularity_decile`, `popularity_deciles`) as further columns: the
    projector colours by either ("Color by").

    Args:
      log_dir: The TensorBoard folder of the run (where its scalars are).
      item_tables: Name -> float [num_items, dim] table, e.g. ``item_gmf``.
      split: The run's data (labels and popularity).

    Raises:
      ValueError: If a table does not have one row per item.
    """
    log_dir = pathlib.Path(log_dir)
    assets = log_dir / PROJECTOR_DIR
    assets.mkdir(parents=True, exist_ok=True)
    num_items = split.num_items
    pairs = np.unique(split.train_users.astype(np.int64) * num_items
                      + split.train_items)
    popularity = np.bincount(pairs % num_items, minlength=num_items)
    deciles = popularity_deciles(popularity)
    ids = [] if split.item_ids is None else split.item_ids.tolist()
    rows = ['item\tindex\ttrain_users\tpopularity_decile']
    for index in range(num_items):
        label = _label(ids[index]) if index < len(ids) else f'#{index}'
        rows.append(f'{label}\t{index}\t{int(popularity[index])}\t{int(deciles[index])}')
    (assets / ITEMS_FILE).write_text('\n'.join(rows) + '\n', encoding='utf-8')

    config = projector.ProjectorConfig()
    for name, table in item_tables.items():
        table = np.asarray(table, dtype=np.float32)
        if table.ndim != 2 or table.shape[0] != num_items:
            raise ValueError(f'{name}: expected [{num_items}, dim], got {table.shape}')
        np.savetxt(assets / f'{name}.tsv', table, fmt='%.6g', delimiter='\t')
        entry = config.embeddings.add()
        entry.tensor_name = name
        entry.tensor_path = f'{PROJECTOR_DIR}/{name}.tsv'
        entry.tensor_shape.extend(table.shape)
        entry.metadata_path = f'{PROJECTOR_DIR}/{ITEMS_FILE}'
    projector.visualize_embeddings(str(log_dir), config)
