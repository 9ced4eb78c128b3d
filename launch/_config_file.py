"""`--config=RUN/hparams.json`: a run's settings file as the command's flags.

The file's settings stand where `--config` stands on the command line, as
`--flagfile` does, so flags after it win: `train.py
--config=runs/a/hparams.json --seed=1 --experiment_name=b` is run `a` again
with another seed. Only settings that are flags of the command and that the
recorded method takes are used; unset (null) ones are left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from tff_fedrecgel import methods
from tff_fedrecgel import tasks
from tff_fedrecgel.errors import DataError

FLAG = 'config'


def define_config_flag() -> None:
    """Defines `--config` (it is expanded before the flags are parsed)."""
    flags.DEFINE_string(
        'config', None, 'A run\'s hparams.json: its settings as flags at this place on the '
        'command line (flags after it win), e.g. --config=runs/a/hparams.json --seed=1.')


def flags_from_hparams(hparams: Mapping[str, Any], known: Sequence[str]) -> list[str]:
    """The command-line flags that give a recorded run's settings.

    Args:
      hparams: A run's `hparams.json`.
      known: The flag names the command defines.

    Returns:
      `--name=value` strings (`--name` / `--noname` for booleans).

    Raises:
      DataError: If the task or the method is unknown.
    """
    from tff_fedrecgel.launch import _data_flags  # pylint: disable=g-import-not-at-top

    task = tasks.get_task(hparams.get('task'))
    method = methods.get_method(hparams.get('algorithm', methods.FEDRECGEL))
    out = []
    for key, value in hparams.items():
        name = key
        if key.startswith('data_') and key[5:] in task.option_names:
            name = _data_flags.flag_of(key[5:])
        if value is None or name not in known or method.refused([key]):
            continue
        if isinstance(value, bool):
            out.append(f'--{"" if value else "no"}{name}')
        elif isinstance(value, list):  # A list flag: comma-separated.
            out.append(f'--{name}={",".join(map(str, value))}')
        else:
            out.append(f'--{name}={value}')
    return out


def expand(argv: Sequence[str], known: Sequence[str]) -> list[str]:
    """`argv` with each `--config=PATH` (or `--config PATH`) replaced by the
    file's flags.

    Raises:
      DataError: If a file cannot be read or is not a run's settings.
    """
    out, args = [], list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in (f'--{FLAG}', f'-{FLAG}') and i + 1 < len(args):
            path, i = args[i + 1], i + 2
        elif arg.startswith((f'--{FLAG}=', f'-{FLAG}=')):
            path, i = arg.split('=', 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        out.extend(flags_from_hparams(_read(path), known))
    return out


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding='utf-8') as f:
            content = json.load(f)
    except FileNotFoundError:
        raise DataError(f'--config: {path} not found') from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'--config: {path} is not a readable JSON file ({e})') from None
    if not isinstance(content, dict) or 'task' not in content:
        raise DataError(f'--config: {path} is not a run\'s hparams.json (no "task")')
    return content
