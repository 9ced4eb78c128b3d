"""One root folder per experiment: logs, metrics, hparams, checkpoints.

<root_output_dir>/<experiment_name>/
  hparams.json        every setting of the run, written once
  metrics.csv         one row per round (TFF's CSVFileReleaseManager)
  tensorboard/        scalars, hparams and the item-embedding projector
  checkpoints/        TFF FileProgramStateManager program states
  summary.json        the final summary (also the last printed line)
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

# Settings that may change between a run and its resumption.
RESUMABLE_CHANGES = frozenset(
    {'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'progress',
     'simulation', 'max_group_examples'}
)


@dataclasses.dataclass(frozen=True)
class ExperimentPaths:
    """Where an experiment writes its outputs."""

    root: pathlib.Path

    @property
    def hparams(self) -> pathlib.Path:
        return self.root / 'hparams.json'

    @property
    def metrics_csv(self) -> pathlib.Path:
        return self.root / 'metrics.csv'

    @property
    def tensorboard(self) -> pathlib.Path:
        return self.root / 'tensorboard'

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.root / 'checkpoints'

    @property
    def summary(self) -> pathlib.Path:
        return self.root / 'summary.json'


def prepare_experiment(
    *, root_output_dir: str | os.PathLike, experiment_name: str, hparams: Mapping[str, Any]
) -> ExperimentPaths:
    """Creates the experiment folder and records (or checks) its hparams.

    A folder that already holds a run with other settings is refused, so a
    resumed run cannot silently mix two configurations.

    Args:
      root_output_dir: The root of all experiments.
      experiment_name: This experiment's folder name.
      hparams: Every setting of the run (JSON-serializable values).

    Returns:
      The `ExperimentPaths`.

    Raises:
      OSError: If the folder cannot be created or written.
      ValueError: If the folder holds a run with different settings.
    """
    if not experiment_name or os.sep in experiment_name:
        raise ValueError(f'invalid experiment name {experiment_name!r}')
    root = pathlib.Path(root_output_dir) / experiment_name
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f'cannot create output folder {root}: {e.strerror or e}') from e
    if not os.access(root, os.W_OK | os.X_OK):
        raise OSError(f'output folder {root} is not writable')
    paths = ExperimentPaths(root)
    hparams = dict(hparams)
    if paths.hparams.exists():
        try:
            previous = json.loads(paths.hparams.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f'{paths.hparams} is unreadable: {e}') from e
        changed = sorted(
            k
            for k in set(previous) | set(hparams)
            if k not in RESUMABLE_CHANGES and previous.get(k) != hparams.get(k)
        )
        if changed:
            raise ValueError(
                f'{root} holds a run with other settings ({", ".join(changed)}); '
                'use another --experiment_name'
            )
    try:
        paths.hparams.write_text(json.dumps(hparams, indent=2, sort_keys=True) + '\n')
    except OSError as e:
        raise OSError(f'cannot write {paths.hparams}: {e.strerror or e}') from e
    return paths
