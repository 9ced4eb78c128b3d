"""What a run changed from its task's defaults: the names TensorBoard's
HParams shows for a run, and the start-up line saying what a preset
changed. Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
from typing import Any

from tff_fedrecgel import recipes
from tff_fedrecgel import tasks
from tff_fedrecgel.run_settings import Settings
from tff_fedrecgel.run_settings import task_default


def changed_settings(hparams: Mapping[str, Any]) -> list[str]:
    """The recorded settings a run changed from its task's defaults.

    A `Settings` field counts when its value differs from `task_default`
    (whatever changed it: a flag, a preset or the method); a recorded name
    that is not a field (a reader option ``data_*``, a privacy setting)
    counts when it is set (neither None nor False).

    Args:
      hparams: A run's `hparams.json` (with its `task`).

    Returns:
      The changed names, in the order of `hparams`.

    Raises:
      DataError: If the task is unknown.
    """
    spec = tasks.get_task(hparams.get('task'))
    fields = {f.name for f in dataclasses.fields(Settings)} - {'task', 'data_options'}
    changed = []
    for name, value in hparams.items():
        if name in fields:
            if (tuple(value) if isinstance(value, list) else value) != task_default(spec, name):
                changed.append(name)
        elif name != 'task' and value is not None and value is not False:
            changed.append(name)
    return changed


def _shown(value) -> str:
    """A setting's value in the banner: numbers short, anything else as is
    (a default may be None)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'{value:g}'
    return str(value)


def preset_banner(run: Settings, data_profile: recipes.DataProfile | None) -> str:
    """One line saying which preset a run uses and every setting it changed.

    Args:
      run: The run's settings.
      data_profile: The data's profile (as given to `settings`).
    """
    spec = tasks.get_task(run.task)
    if run.preset == recipes.PAPER:
        return ('preset paper: the paper\'s protocol, which ranks near item popularity '
                '(docs/RESULTS.md); --preset=auto learns')
    changed = []
    for name, value in spec.preset(run.preset, data_profile).items():
        before = task_default(spec, name)
        if getattr(run, name, None) == value and value != before:
            changed.append(f'{name} {_shown(before)} -> {_shown(value)}')
    tuned_for = recipes.preset_algorithm(run.preset)
    if tuned_for is not None:  # Said, since the method changes what the settings do.
        changed.insert(0, f'tuned for {tuned_for}' + (
            '' if tuned_for == run.algorithm else f', run as {run.algorithm}'))
    line = f'preset {run.preset}: ' + (', '.join(changed) or 'changes nothing here')
    if run.preset == recipes.AUTO and data_profile is not None:
        line += f' ({recipes.describe_auto(data_profile)})'
    return line
