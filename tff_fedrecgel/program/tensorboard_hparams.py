"""TensorBoard's HParams dashboard: the runs' settings and selected metrics.

Each run writes, in its own log folder, an hparams event file
(``*.hparams.v2``: the experiment config, the session and a text table of
every setting) when it starts or resumes, and a selected-metrics file
(``*.selected.v2``) when it ends. Both replace the folder's previous file of
their kind: TensorBoard keeps the first summary it reads for a tag, and one
file per kind keeps a resumed run from showing a setting or a selected
value twice. Beside them, ``dashboard.json`` keeps what the hparams file is
made from (the trial name, the settings, the metric columns).

Which settings are columns. TensorBoard 2.14's dashboard ticks the first
five settings of the experiment config and gives every column 10em, so at
1400 px five value columns fit beside the trial name. The config therefore
lists only the settings that tell the runs of a folder apart (for a lone
run, its `algorithm`), so that the metric columns stay on screen; every
setting of a run is in the TEXT dashboard's `settings` table, the ones it
changed from its task's defaults marked. TensorBoard reads one run's config
for a whole folder (the first it finds), so a run rewrites the config of
every run beside it (`index_logs`, under a lock): they all carry the same
one. `launch/tensorboard_index.py` does the same for any folder of runs.

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
import contextlib
import fcntl
import json
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

from tff_fedrecgel import setting_changes
from tff_fedrecgel.program import outputs
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.evaluation import protocols

# The order of the settings in the dashboard (before the others, sorted).
KEY_HPARAMS = ('algorithm', 'task', 'seed', 'local_lr', 'server_lr', 'rho_sh', 'rho_ns',
               'total_rounds', 'client_fraction', 'clients_per_round', 'num_negatives',
               'validation', 'eval_protocol', 'preset')
# Changed but long and alike across runs: listed after the other changes.
_LAST = ('data_dir',)
HPARAMS_SUFFIX = '.hparams.v2'
DASHBOARD_FILE = outputs.DASHBOARD_FILE
SELECTED_SUFFIX = '.selected.v2'


def metric_display_name(tag: str) -> str:
    """A metric's column title: 'test/hr@10' -> 'test HR@10',
    'selected/test_full/ndcg@10' -> 'NDCG@10 full'."""
    parts = tag.split('/')
    if parts[0] == 'selected' and len(parts) == 3:
        metric, _, k = parts[2].partition('@')
        protocol = protocols.of_group(parts[1]).name
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
        changed = set(setting_changes.changed_settings(hparams))
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


def compared_settings(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The settings that tell runs apart: the dashboard's setting columns.

    Args:
      runs: Every run's settings (as `session_hparams` gives them).

    Returns:
      The names whose value differs between the runs (a setting one run
      leaves unset counts as differing), in dashboard order; `['algorithm']`
      for a lone run or runs that differ in nothing.
    """
    names = {name for run in runs for name in run}
    differ = [n for n in names if len({repr(run.get(n)) for run in runs}) > 1]
    return sorted(differ, key=_rank) if differ else ['algorithm']


def _hparam_info(name: str, values: Sequence[Any]) -> api_pb2.HParamInfo:
    """A setting's declaration from its values in the runs. Strings get no
    domain: a discrete domain would hide every run whose value it does not
    list; floats get an open interval filter."""
    info = api_pb2.HParamInfo(name=name, differs=True)
    kinds = {type(v) for v in values if v is not None}
    if kinds == {bool}:
        info.type = api_pb2.DATA_TYPE_BOOL
        info.domain_discrete.extend([False, True])
    elif kinds == {float}:
        info.type = api_pb2.DATA_TYPE_FLOAT64
    else:
        info.type = api_pb2.DATA_TYPE_STRING
    return info


def settings_table(hparams: Mapping[str, Any]) -> str:
    """Every setting of a run as a Markdown table (the TEXT dashboard), the
    ones it changed from its task's defaults first and marked (the task and
    the algorithm first, unmarked: they say what the run is)."""
    values, shown = session_hparams(hparams)
    changed = set(shown) - {'algorithm', 'task'}
    rows = [f'| {name} | {value} | {"changed" if name in changed else ""} |'
            for name, value in values.items()]
    return '\n'.join(['| setting | value | |', '|---|---|---|', *rows])


def _replace(log_dir: pathlib.Path, suffix: str) -> tf.summary.SummaryWriter:
    """Removes the folder's file of a kind; returns a writer of a new one."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in log_dir.glob(f'events.out.tfevents.*{suffix}'):
        old.unlink()
    return tf.summary.create_file_writer(str(log_dir), filename_suffix=suffix)


def _write_log(log_dir: pathlib.Path, run: Mapping[str, Any], experiment) -> None:
    """Rewrites a run's hparams file: the shared config, its session and its
    settings table."""
    config = summary_pb2.Summary()
    config.value.add(
        tag=metadata.EXPERIMENT_TAG, tensor=metadata.NULL_TENSOR,
        metadata=metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(experiment=experiment)))
    writer = _replace(log_dir, HPARAMS_SUFFIX)
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(config.SerializeToString(), step=0)
        hparams_api.hparams(session_hparams(run['hparams'])[0], trial_id=run['trial_id'])
        tf.summary.text('settings', settings_table(run['hparams']), step=0,
                        description='Every setting of the run; "changed": not its '
                        'task\'s default.')
    writer.close()


def _read_dashboard(log_dir: pathlib.Path) -> dict[str, Any] | None:
    try:
        return json.loads((log_dir / DASHBOARD_FILE).read_text())
    except (OSError, ValueError):
        return None  # Not a run's log folder (or one written before it existed).


def index_logs(log_dirs: Sequence[os.PathLike | str]) -> list[str]:
    """Gives the runs' log folders one experiment config (TensorBoard shows
    one config for a whole logdir): the settings that differ between them,
    every run's metric columns.

    Args:
      log_dirs: Log folders holding a `dashboard.json` (others are skipped).

    Returns:
      The setting columns (`compared_settings`).
    """
    runs = {}
    for log_dir in map(pathlib.Path, log_dirs):
        run = _read_dashboard(log_dir)
        if run is not None:
            runs[log_dir] = run
    if not runs:
        return []
    values = [session_hparams(run['hparams'])[0] for run in runs.values()]
    columns = compared_settings(values)
    metrics = {}
    for run in runs.values():
        for tag, description in run['metrics'].items():
            metrics.setdefault(tag, description)
    experiment = api_pb2.Experiment(
        time_created_secs=time.time(),
        hparam_infos=[_hparam_info(n, [v.get(n) for v in values]) for n in columns],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag),
                                         display_name=metric_display_name(tag),
                                         description=description)
                      for tag, description in metrics.items()])
    for log_dir, run in runs.items():
        _write_log(log_dir, run, experiment)
    return columns


@contextlib.contextmanager
def _folder_lock(folder: pathlib.Path):
    """Serializes the rewriting of a folder's runs (runs started at once).
    The lock is on the folder itself: no file is left in it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # Releases the lock.


def write_hparams(log_dir: os.PathLike | str, *, hparams: Mapping[str, Any],
                  trial_id: str, metrics: Mapping[str, str],
                  runs_folder: os.PathLike | str | None = None) -> pathlib.Path:
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
      runs_folder: The folder of this run and its siblings
        (``<runs_folder>/<name>/tensorboard/<name>/``): every sibling's
        config is rewritten to the shared one. None: this run alone.

    Returns:
      The event file written.
    """
    log_dir = pathlib.Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    record = {'trial_id': trial_id, 'metrics': dict(metrics),
              'hparams': {k: _json_value(v) for k, v in hparams.items()}}
    (log_dir / DASHBOARD_FILE).write_text(json.dumps(record, indent=1) + '\n')
    if runs_folder is None:
        index_logs([log_dir])
    else:
        folder = pathlib.Path(runs_folder)
        with _folder_lock(folder):
            siblings = sorted(folder.glob(f'*/tensorboard/*/{DASHBOARD_FILE}'))
            index_logs({log_dir, *(p.parent for p in siblings)})
    (written,) = log_dir.glob(f'events.out.tfevents.*{HPARAMS_SUFFIX}')
    return written


def _json_value(value: Any) -> Any:
    """A setting as dashboard.json keeps it (what `_value` reads back)."""
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


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
