"""The one way a run takes its folder: lock, check, record, clean up.

Both front doors (`launch/train.py` and `api.Experiment.train`) train inside
`open_run`, so they lock, check and record a run the same way, and a run
that fails before its first checkpoint leaves nothing behind that would
refuse the corrected command as "a run with other settings".
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

from tff_fedrecgel.program import outputs


@contextlib.contextmanager
def open_run(*, root_output_dir: str | os.PathLike, experiment_name: str,
             hparams: Mapping[str, Any]) -> Iterator[outputs.ExperimentPaths]:
    """Locks the experiment folder, checks and records the run's settings.

    `hparams.json` is written unless it is missing from a folder that holds
    checkpoints: then the training program checks the checkpoint's own
    record and rebuilds the file from it. If the body raises before a round
    was trained (no checkpoint, no metrics row), everything this run created
    is removed (the folder
    and its empty parents included, when the run created them), so nothing
    blocks the corrected command.

    Args:
      root_output_dir: The root of all experiments.
      experiment_name: This experiment's folder name.
      hparams: Every setting of the run.

    Yields:
      The locked folder's `ExperimentPaths`.

    Raises:
      ExperimentLockedError: If another live process holds the folder.
      ValueError: If the folder holds a run with other settings.
      OSError: If the folder cannot be created or written.
    """
    folder = (pathlib.Path(root_output_dir) / experiment_name).absolute()
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    before = set(os.listdir(folder)) if not created else set()
    with outputs.lock_experiment(root_output_dir=root_output_dir,
                                 experiment_name=experiment_name) as paths:
        try:
            outputs.check_hparams(paths, hparams)
            if paths.hparams.exists() or not outputs.has_checkpoint(paths):
                outputs.prepare_experiment(root_output_dir=root_output_dir,
                                           experiment_name=experiment_name, hparams=hparams)
            yield paths
        except BaseException:
            if not _trained(paths):
                _remove_new(folder, created, before, lock=paths.lock.name)
            raise


def _trained(paths: outputs.ExperimentPaths) -> bool:
    """Whether a round was trained in the folder: a checkpoint, or a metrics
    row of a run that checkpoints never (its logs are all it has)."""
    if outputs.has_checkpoint(paths):
        return True
    try:
        with open(paths.metrics_csv, encoding='utf-8') as f:
            return sum(1 for _ in zip(range(2), f)) > 1
    except OSError:
        return False


def _remove_new(folder: pathlib.Path, created: list[pathlib.Path], before: set[str],
                lock: str) -> None:
    """Removes what a run that trained nothing wrote, while holding its lock.

    A folder the run created goes whole, then its parents the run created
    while they are empty. In a folder that was there before, the new entries
    go but the lock file stays (see `outputs.ExperimentLock.release`).
    """
    if created:
        shutil.rmtree(folder, ignore_errors=True)
        for parent in created[1:]:
            try:
                parent.rmdir()
            except OSError:
                break
        return
    for name in set(os.listdir(folder)) - before - {lock}:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
