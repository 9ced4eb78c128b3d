"""Reads a run folder back: its settings and its latest checkpoint.

A run folder (`outputs.ExperimentPaths`) holds `hparams.json` and the
program states the training program saves with TFF's
`FileProgramStateManager` under `checkpoints/program_state_<round>`: each a
SavedModel whose one function returns the nested state. Reading changes
nothing in the folder (a run may still be writing it: TFF writes a state
under a temporary name and renames it when complete). Only `load_checkpoint`
imports TensorFlow.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import re
import sys
from typing import Any

from tff_fedrecgel.errors import DataError
from tff_fedrecgel.program.outputs import ExperimentPaths

# The training program's checkpoint folders (`training_program._Checkpoints`)
# and the validation-selected round's (`selected_state.SelectedState`).
CHECKPOINT_PREFIX = 'program_state_'
SELECTED_PREFIX = 'selected_state_'
_CHECKPOINT = re.compile(re.escape(CHECKPOINT_PREFIX) + r'(\d+)')
_SELECTED = re.compile(re.escape(SELECTED_PREFIX) + r'(\d+)')
# Which state a served model comes from.
SELECTED, LATEST = 'selected', 'latest'
CHECKPOINT_CHOICES = (SELECTED, LATEST)


class RunFolderError(DataError):
    """A run folder that cannot be read back (a one-line message)."""


def run_paths(run_dir: str | os.PathLike) -> ExperimentPaths:
    """The paths of an existing run folder.

    Raises:
      RunFolderError: If the folder or its `hparams.json` is missing.
    """
    root = pathlib.Path(run_dir).expanduser()
    if root.exists() and not root.is_dir():
        raise RunFolderError(f'{root}: not a folder, expected a run folder (the folder '
                             'holding hparams.json)')
    if not root.is_dir():
        raise RunFolderError(f'{root}: run folder not found')
    paths = ExperimentPaths(root.resolve())
    if not paths.hparams.is_file():
        raise RunFolderError(f'{root}: not a run folder (no hparams.json; '
                             'launch/train.py or the Python API writes one)')
    return paths


def read_hparams(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The settings a run recorded in `hparams.json`.

    Raises:
      RunFolderError: If the folder or the file is missing or unreadable.
    """
    paths = run_paths(run_dir)
    try:
        hparams = json.loads(paths.hparams.read_text(encoding='utf-8'))
    except (OSError, ValueError) as e:
        raise RunFolderError(f'{paths.hparams} is unreadable: {e}') from None
    if not isinstance(hparams, dict) or 'task' not in hparams:
        raise RunFolderError(f'{paths.hparams} is unreadable: no task recorded')
    return hparams


def checkpoint_rounds(run_dir: str | os.PathLike) -> list[int]:
    """Rounds of the complete checkpoints of a run, oldest first."""
    folder = run_paths(run_dir).checkpoints
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    rounds = [int(m.group(1)) for m in map(_CHECKPOINT.fullmatch, names) if m]
    return sorted(r for r in rounds if (folder / f'{CHECKPOINT_PREFIX}{r}').is_dir())


def selected_round(run_dir: str | os.PathLike) -> int | None:
    """The round of the kept validation-selected state, or None (a run
    without a validation item keeps none)."""
    folder = run_paths(run_dir).selected
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    rounds = [int(m.group(1)) for m in map(_SELECTED.fullmatch, names) if m
              and (folder / m.group(0)).is_dir()]
    return max(rounds) if rounds else None


def check_has_checkpoint(run_dir: str | os.PathLike) -> int:
    """The latest checkpoint's round.

    Raises:
      RunFolderError: If the run has no checkpoint (or no folder).
    """
    rounds = checkpoint_rounds(run_dir)
    if not rounds:
        raise RunFolderError(
            f'{run_paths(run_dir).root}: no checkpoint yet (checkpoints/ is empty; '
            'the run saves one every rounds_per_checkpoint rounds and at its end)')
    return rounds[-1]


def _read_state(path: pathlib.Path) -> Any:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tree  # pylint: disable=g-import-not-at-top

    state = tree.map_structure(
        lambda v: v.numpy() if isinstance(v, (tf.Tensor, tf.Variable)) else v,
        tf.saved_model.load(str(path))())
    gc.collect()  # The loaded module's variables sit in reference cycles.
    return state


def load_checkpoint(run_dir: str | os.PathLike, *, round_num: int | None = None,
                    checkpoint: str = LATEST) -> tuple[int, dict[str, Any]]:
    """A checkpoint's program state as nested numpy arrays.

    Without `round_num`, the validation-selected state (`checkpoint=
    'selected'`, where the run kept one) or the latest readable checkpoint:
    an unreadable one (a run killed while writing) is reported on stderr and
    the one before used.

    Args:
      run_dir: The run folder.
      round_num: The round of the checkpoint to read (None: as `checkpoint`).
      checkpoint: 'selected' (the round chosen on the validation item, else
        the latest) or 'latest'.

    Returns:
      `(round, state)`; `state['simulation']` is what `Simulation.restore`
      takes.

    Raises:
      RunFolderError: If there is no (readable) checkpoint, or none of
        `round_num`.
    """
    if checkpoint not in CHECKPOINT_CHOICES:
        raise RunFolderError(f'checkpoint must be one of {CHECKPOINT_CHOICES}, got '
                             f'{checkpoint!r}')
    paths = run_paths(run_dir)
    chosen = selected_round(run_dir) if checkpoint == SELECTED else None
    if round_num is None and chosen is not None:
        path = paths.selected / f'{SELECTED_PREFIX}{chosen}'
        try:
            return chosen, _read_state(path)
        except Exception as e:  # pylint: disable=broad-except
            reason = ' '.join(str(e).split())[:200] or type(e).__name__
            raise RunFolderError(f'{path}: the selected round\'s state is unreadable '
                                 f'({reason}); --checkpoint=latest serves the latest '
                                 'checkpoint') from None
    rounds = checkpoint_rounds(run_dir)
    if round_num is not None:
        if round_num not in rounds:
            raise RunFolderError(
                f'{paths.root}: no checkpoint of round {round_num} (there are: '
                f'{", ".join(map(str, rounds)) or "none"})')
        rounds = [round_num]
    check_has_checkpoint(run_dir)
    problems = []
    for version in reversed(rounds):
        path = paths.checkpoints / f'{CHECKPOINT_PREFIX}{version}'
        try:
            state = _read_state(path)
        except Exception as e:  # pylint: disable=broad-except
            reason = ' '.join(str(e).split())[:200] or type(e).__name__
            problems.append(f'round {version}: {reason}')
            print(f'warning: the checkpoint of round {version} is unreadable ({reason})',
                  file=sys.stderr, flush=True)
            continue
        if not isinstance(state, dict) or 'simulation' not in state:
            problems.append(f'round {version}: not a training program state')
            continue
        return version, state
    raise RunFolderError(f'{paths.root}: no readable checkpoint ({"; ".join(problems)})')
