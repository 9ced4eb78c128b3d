"""One root folder per experiment: logs, metrics, hparams, checkpoints.

<root_output_dir>/<experiment_name>/
  run.lock            held (flock) by the run writing here; names its holder
  hparams.json        every setting of the run, written once
  metrics.csv         one row per round, rewritten whole after each round
  tensorboard/<name>/ scalars, hparams and the item-embedding projector;
                      dashboard.json: what its hparams file is made from
  checkpoints/        TFF FileProgramStateManager program states
    selected/         the state of the round chosen on the validation item
  user_states/        --user_state_store=disk: every user's state, memory-mapped,
                      and its undo journal (checkpoints name a version of it)
  summary.json        the final summary (also the last printed line)

One run at a time: `lock_experiment` takes an exclusive `fcntl.flock` on
`run.lock` and a second run is refused at once, naming the holder. The kernel
drops the lock when its holder dies, however it dies, so a stale lock never
blocks.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import fcntl
import gc
import json
import os
import pathlib
import socket
from collections.abc import Mapping
from typing import Any

# In a run's TensorBoard folder: its trial name, settings and metric columns
# (program/tensorboard_hparams.py).
DASHBOARD_FILE = 'dashboard.json'
# Settings that may change between a run and its resumption.
RESUMABLE_CHANGES = frozenset(
    {'total_rounds', 'rounds_per_eval', 'rounds_per_checkpoint', 'progress',
     'simulation', 'max_group_examples', 'early_stopping_patience'}
)
# What a refusal of a busy run folder tells the user to change.
_ELSEWHERE = '--experiment_name'


def run_state_io(loop, coroutine) -> Any:
    """Runs a TFF program-state save or load to its end; returns its result.

    TFF's `FileProgramStateManager` holds every array of a state in a
    `tf.Variable` of a SavedModel module that only Python's cycle collector
    frees. A method with per-user state (FedRAP's rows on Amazon-Video, about
    2 GiB by round 100) kept those copies for many rounds, so each save and
    load is followed by a collection.
    """
    result = loop.run_until_complete(coroutine)
    gc.collect()
    return result


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
        """The folder to give `tensorboard --logdir`."""
        return self.root / 'tensorboard'

    @property
    def tensorboard_run(self) -> pathlib.Path:
        """Where the run's event files go: a subfolder named after the
        experiment, so TensorBoard names the run after it."""
        return self.tensorboard / self.root.name

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.root / 'checkpoints'

    @property
    def user_states(self) -> pathlib.Path:
        return self.root / 'user_states'

    @property
    def selected(self) -> pathlib.Path:
        """The state of the validation-selected round (what is served)."""
        return self.checkpoints / 'selected'

    @property
    def summary(self) -> pathlib.Path:
        return self.root / 'summary.json'

    @property
    def lock(self) -> pathlib.Path:
        return self.root / 'run.lock'


class OutputError(OSError):
    """An output could not be written (e.g. a full disk); a one-line message."""


class ExperimentLockedError(ValueError):
    """Another live process holds the experiment folder."""


def check_experiment_name(experiment_name: str) -> None:
    """Refuses names that are not one plain folder name.

    Args:
      experiment_name: The experiment's folder name.

    Raises:
      ValueError: If empty, `.` or `..`, or holding a path separator or a
        NUL (it would write outside the output root).
    """
    name = experiment_name or ''
    separators = [os.sep] + ([os.altsep] if os.altsep else [])
    if (not name.strip() or name in ('.', '..')
            or any(s in name for s in separators) or '\0' in name):
        raise ValueError(
            f'invalid experiment name {experiment_name!r}: give one folder name '
            '(no "/", not "." or "..")')


class ExperimentLock:
    """An exclusive lock on an experiment folder, held until `release`.

    Attributes:
      paths: The experiment's `ExperimentPaths`.
    """

    def __init__(self, paths: ExperimentPaths, handle):
        self.paths = paths
        self._handle = handle

    def release(self) -> None:
        """Releases the lock (idempotent). The lock file stays: removing it
        could let two runs lock two different files."""
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> ExperimentPaths:
        return self.paths

    def __exit__(self, *exc_info) -> None:
        self.release()


def _in_use(root: pathlib.Path, holder: str, elsewhere: str) -> ExperimentLockedError:
    return ExperimentLockedError(f'{root} is in use by {holder}; wait for that run to end or '
                                 f'use another {elsewhere}')


def lock_experiment(
    *, root_output_dir: str | os.PathLike, experiment_name: str,
    elsewhere: str = _ELSEWHERE
) -> ExperimentLock:
    """Creates the experiment folder and locks it for this process.

    Args:
      root_output_dir: The root of all experiments.
      experiment_name: This experiment's folder name.
      elsewhere: What the refusal of a busy folder tells the user to change.

    Returns:
      The held `ExperimentLock` (a context manager releasing it).

    Raises:
      ValueError: On an invalid name.
      ExperimentLockedError: If another live process holds the folder.
      OSError: If the folder cannot be created or written.
    """
    check_experiment_name(experiment_name)
    root = pathlib.Path(root_output_dir) / experiment_name
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f'cannot create output folder {root}: {e.strerror or e}') from e
    if not os.access(root, os.W_OK | os.X_OK):
        raise OSError(f'output folder {root} is not writable')
    paths = ExperimentPaths(root)
    try:
        handle = open(paths.lock, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
    except OSError as e:
        raise OSError(f'cannot create {paths.lock}: {e.strerror or e}') from e
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        handle.seek(0)
        holder = ' '.join(handle.read().split()) or 'another process'
        handle.close()
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise _in_use(root, holder, elsewhere) from None
        raise OSError(f'cannot lock {paths.lock}: {e.strerror or e}') from e
    started = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f'pid {os.getpid()} on {socket.gethostname()} since {started}\n')
        handle.flush()
    except OSError as e:
        handle.close()
        raise OSError(f'cannot write {paths.lock}: {e.strerror or e}') from e
    return ExperimentLock(paths, handle)


def check_output_root(root_output_dir: str | os.PathLike | None) -> None:
    """Refuses an empty output root (it would write into the current folder)
    and one that is a file or not writable, creating nothing.

    Raises:
      ValueError: If empty or None.
      OSError: If a file is in the way or the nearest existing folder is not
        writable.
    """
    if root_output_dir is None or not os.fspath(root_output_dir).strip():
        raise ValueError('the output root folder must not be empty (give '
                         '--root_output_dir a folder, e.g. runs)')
    path = pathlib.Path(root_output_dir).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OSError(f'cannot create output folder {path}: {existing} is not a folder')
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OSError(f'cannot create output folder {path}: {existing} is not writable')


def check_not_in_use(*, root_output_dir: str | os.PathLike, experiment_name: str,
                     elsewhere: str = _ELSEWHERE) -> None:
    """Refuses at once a folder another live run holds, creating nothing (so
    a busy folder is said before the data load and TensorFlow's import;
    `lock_experiment` takes the lock itself later).

    Args:
      root_output_dir: The root of all experiments.
      experiment_name: This experiment's folder name.
      elsewhere: What the refusal tells the user to change.

    Raises:
      ExperimentLockedError: If another live process holds the folder.
      OSError: If the experiment path is a file.
    """
    root = pathlib.Path(root_output_dir) / experiment_name
    if root.exists() and not root.is_dir():
        raise OSError(f'cannot create output folder {root}: a file is in the way')
    lock = ExperimentPaths(root).lock
    try:
        handle = open(lock, 'r', encoding='utf-8')  # pylint: disable=consider-using-with
    except OSError:
        return  # No lock file (or unreadable: lock_experiment says why).
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                holder = ' '.join(handle.read().split()) or 'another process'
                raise _in_use(root, holder, elsewhere) from None
            return
        fcntl.flock(handle, fcntl.LOCK_UN)


def has_checkpoint(paths: ExperimentPaths) -> bool:
    """Whether the folder holds a saved program state (a run trained in it)."""
    return paths.checkpoints.is_dir() and any(
        p.is_dir() and p.name[len('program_state_'):].isdigit()
        for p in paths.checkpoints.glob('program_state_*'))


def _changed_settings(previous: Mapping[str, Any], hparams: Mapping[str, Any]) -> list[str]:
    from tff_fedrecgel import run_settings  # pylint: disable=g-import-not-at-top

    # A setting added since a run was recorded has its default there.
    def before(k):
        return previous[k] if k in previous else run_settings.recorded_default(k)

    return sorted(
        k for k in set(previous) | set(hparams)
        if k not in RESUMABLE_CHANGES and before(k) != hparams.get(k))


def check_hparams(paths: ExperimentPaths, hparams: Mapping[str, Any]) -> None:
    """Refuses a folder holding a run with other settings (writes nothing).

    Args:
      paths: The experiment's folders.
      hparams: Every setting of the run.

    Raises:
      ValueError: If `hparams.json` is unreadable or differs.
    """
    if not paths.hparams.exists():
        return
    try:
        previous = json.loads(paths.hparams.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f'{paths.hparams} is unreadable: {e}') from e
    if not isinstance(previous, dict):
        raise ValueError(f'{paths.hparams} is unreadable: not a JSON object')
    changed = _changed_settings(previous, hparams)
    if changed:
        untrained = ('; nothing was trained in it (no checkpoint): remove it or use another '
                     '--experiment_name') if not has_checkpoint(paths) else (
                         '; use another --experiment_name')
        raise ValueError(
            f'{paths.root} holds a run with other settings ({", ".join(changed)})'
            + untrained)


def prepare_experiment(
    *, root_output_dir: str | os.PathLike, experiment_name: str, hparams: Mapping[str, Any]
) -> ExperimentPaths:
    """Creates the experiment folder and records (or checks) its hparams.

    A folder that already holds a run with other settings is refused, so a
    resumed run cannot silently mix two configurations. Hold the folder's
    `lock_experiment` lock around this and the run.

    Args:
      root_output_dir: The root of all experiments.
      experiment_name: This experiment's folder name.
      hparams: Every setting of the run (JSON-serializable values).

    Returns:
      The `ExperimentPaths`.

    Raises:
      OSError: If the folder cannot be created or written.
      ValueError: If the name is invalid or the folder holds a run with
        different settings.
    """
    check_experiment_name(experiment_name)
    root = pathlib.Path(root_output_dir) / experiment_name
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f'cannot create output folder {root}: {e.strerror or e}') from e
    if not os.access(root, os.W_OK | os.X_OK):
        raise OSError(f'output folder {root} is not writable')
    paths = ExperimentPaths(root)
    check_hparams(paths, hparams)
    write_atomically(paths.hparams, json.dumps(dict(hparams), indent=2, sort_keys=True) + '\n')
    return paths


def write_atomically(path: pathlib.Path, text: str) -> None:
    """Replaces `path` with `text` whole, or leaves it as it was.

    Raises:
      OutputError: If it cannot be written (one line naming the file).
    """
    temp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
    try:
        with open(temp, 'w', encoding='utf-8') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except OSError as e:
        try:
            temp.unlink()
        except OSError:
            pass
        raise OutputError(f'cannot write {path}: {e.strerror or e}') from None
