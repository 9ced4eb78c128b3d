"""TensorBoard's HParams dashboard: a run's settings and its selected metrics.

Each run writes, in its own log folder, an hparams event file
(``*.hparams.v2``: the experiment config and the session) when it starts or
resumes, and a selected-metrics file (``*.selected.v2``) when it ends. Both
replace the folder's previous file of their kind: TensorBoard keeps the first
summary it reads for a tag, and one file per kind keeps a resumed run from
showing a setting or a selected value twice.

Which settings are ticked. TensorBoard 2.14's dashboard ticks the first five
settings of the experiment config, those marked `differs` first. A run marks
`algorithm`, `task` and every setting it changed from its task's defaults
(`run_settings.changed_settings`), and lists them first, in `KEY_HPARAMS`
order then the rest (`data_dir` and reader options last); the unchanged
settings follow, one click away. In a folder of runs TensorBoard reads one
run's config (the first it finds) for the whole table.

How values read. The dashboard prints every number with five significant
digits (a seed of 0 as "0.0000"), so integer settings are written as their
decimal text; floats stay numbers (their filter is an interval).

The metric columns are `EvaluationPlan.selected_metrics`: HR@10 and NDCG@10
of the test item under each protocol the run evaluates, at the round its
selection chose (on the validation item when there is one), written under
`selected/` at that round's step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import os
import pathlib
import time
from typing import Any

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.hparams import api as hparams_api

from tff_fedrecgel import run_settings
from tff_fedrecgel.errors import DataError

# The order of the settings in the dashboard (before the others, sorted).
KEY_HPARAMS = ('algorithm', 'task', 'seed', 'local_lr', 'server_lr', 'rho_sh', 'rho_ns',
               'total_rounds', 'client_fraction', 'clients_per_round', 'num_negatives',
               'validation', 'eval_protocol', 'preset')
# Changed but long and alike across runs: listed after the other changes.
_LAST = ('data_dir',)
HPARAMS_SUFFIX = '.hparams.v2'
SELECTED_SUFFIX = '.selected.v2'


def metric_display_name(tag: str) -> str:
    """A metric's column title: 'test/hr@10' -> 'test HR@10',
    'selected/test_full/ndcg@10' -> 'NDCG@10 full'."""
    parts = tag.split('/')
    if parts[0] == 'selected' and len(parts) == 3:
        metric, _, k = parts[2].partition('@')
        protocol = 'full' if parts[1].endswith('_full') else 'sampled'
        return f'{metric.upper()}@{k} {protocol}' if k else f'{metric} {protocol}'
    split, _, name = tag.partition('/')
    metric, at, k = name.partition('@')
    metric = metric.upper() if at else metric
    return f'{split} {metric}{at}{k}'


def _value(value: Any) -> bool | float | str | None:
    """A setting as the dashboard gets it (None: left out)."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)  # Printed as written, not as 0.0000.
    if isinstance(value, (float, str)):
        return value
    return str(value)


def _rank(name: str) -> tuple:
    if name in KEY_HPARAMS:
        return 0, KEY_HPARAMS.index(name), name
    last = name in _LAST or name.startswith('data_')
    return (2 if last else 1), 0, name


def session_hparams(hparams: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The settings as the dashboard gets them, and which ones to tick.

    Args:
      hparams: Every setting of the run (its `hparams.json`, with `task`).

    Returns:
      `(values, shown)`: `values` in dashboard order (the shown settings
      first), unset settings (None) left out, ints as their text, bools,
      floats and strings as they are, anything else as its text; `shown`:
      `algorithm`, `task` and the settings the run changed from its task's
      defaults (none without a known task), in that order.
    """
    try:
        changed = set(run_settings.changed_settings(hparams))
    except DataError:  # No task to take defaults from: nothing marked changed.
        changed = set()
    changed |= {'algorithm', 'task'}
    order = sorted(hparams, key=lambda n: (n not in changed, _rank(n)))
    values = {}
    for name in order:
        value = _value(hparams[name])
        if value is not None:
            values[name] = value
    return values, [n for n in values if n in changed]


def _hparam_info(name: str, value: Any, shown: bool) -> api_pb2.HParamInfo:
    """A setting's declaration. Strings and ints get no domain: a discrete
    domain would hide, in a folder of runs, every run whose value it does
    not list; floats get an open interval filter."""
    info = api_pb2.HParamInfo(name=name, differs=shown)
    if isinstance(value, bool):
        info.type = api_pb2.DATA_TYPE_BOOL
        info.domain_discrete.extend([False, True])
    elif isinstance(value, float):
        info.type = api_pb2.DATA_TYPE_FLOAT64
    else:
        info.type = api_pb2.DATA_TYPE_STRING
    return info


def _replace(log_dir: pathlib.Path, suffix: str) -> tf.summary.SummaryWriter:
    """Removes the folder's file of a kind; returns a writer of a new one."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob(f'events.out.tfevents.*{suffix}'):
        old.unlink()
    return tf.summary.create_file_writer(str(log_dir), filename_suffix=suffix)


def write_hparams(log_dir: os.PathLike | str, *, hparams: Mapping[str, Any],
                  trial_id: str, metrics: Mapping[str, str]) -> pathlib.Path:
    """Writes (or rewrites) the run's experiment config and session.

    Call it whenever a run starts or resumes: the folder's previous hparams
    file is replaced, so the dashboard shows the current settings.

    Args:
      log_dir: The TensorBoard folder of the run (where its scalars are).
      hparams: Every setting of the run (with `task`); None values are left
        out.
      trial_id: The session's name in the dashboard (the experiment name).
      metrics: Scalar tag -> description of the dashboard's metric columns
        (the latest value of each), e.g. ``selected/test/hr@10``.

    Returns:
      The event file written.
    """
    log_dir = pathlib.Path(log_dir)
    values, shown = session_hparams(hparams)
    experiment = api_pb2.Experiment(
        time_created_secs=time.time(),
        hparam_infos=[_hparam_info(n, v, n in shown) for n, v in values.items()],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag),
                                         display_name=metric_display_name(tag),
                                         description=description)
                      for tag, description in metrics.items()])
    config = summary_pb2.Summary()
    config.value.add(
        tag=metadata.EXPERIMENT_TAG, tensor=metadata.NULL_TENSOR,
        metadata=metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(experiment=experiment)))
    writer = _replace(log_dir, HPARAMS_SUFFIX)
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(config.SerializeToString(), step=0)
        hparams_api.hparams(values, trial_id=trial_id)
    writer.close()
    (written,) = log_dir.glob(f'events.out.tfevents.*{HPARAMS_SUFFIX}')
    return written


def write_selected(log_dir: os.PathLike | str, *,
                   selected: Mapping[str, tuple[int, float, str]]) -> None:
    """Writes (or rewrites) the metrics at the selected rounds.

    Call it when a run ends (a resume included): the folder's previous file
    of selected metrics is replaced, so each tag holds one value.

    Args:
      log_dir: The TensorBoard folder of the run.
      selected: Tag -> (round, value, description), e.g.
        ``{'selected/test/hr@10': (12, 0.61, '...')}``; each value is written
        at its round's step.
    """
    writer = _replace(pathlib.Path(log_dir), SELECTED_SUFFIX)
    with writer.as_default():
        for tag, (round_num, value, description) in selected.items():
            tf.summary.scalar(tag, float(value), step=int(round_num),
                              description=description)
    writer.close()
