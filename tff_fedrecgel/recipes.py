"""Presets: named sets of settings that fill in what a run does not set.

* ``paper``: nothing changed, the paper's protocol (docs/ALGORITHM.md).
* ``tuned``: the task's own settings, chosen on its validation item
  (`tasks.Task.tuned`); they do not transfer to other data.
* ``auto``: a rule chosen for transfer by leave-one-dataset-out
  (docs/RESULTS.md, "Transfer"): by the data's history length, one of two
  recipes, with its training negatives derived from the data, and with a
  validation item to choose the round, `AUTO_VALIDATED_ROUNDS` rounds,
  ranked against every item as often as the data's size allows
  (`auto_recipe`).
* a path to a ``.json`` file: the settings a tuner (or a person) wrote.

Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
import dataclasses
import json
import math
import os
from typing import Any

from tff_fedrecgel.errors import DataError

PAPER, TUNED, AUTO = 'paper', 'tuned', 'auto'
PRESETS = (PAPER, TUNED, AUTO)

# The auto recipe's two branches (docs/RESULTS.md, "Transfer"): users with
# short histories take five local epochs uploading the change; users with
# long ones one SAM gradient a round, with a server Adam ten times the
# paper's rate and twice its cohort. Each draws training negatives by the
# data, so that a user draws about `*_NEGATIVES` negatives per round whatever
# its history length (`auto_negatives`).
AUTO_GRADIENT = {'server_lr': 0.01, 'client_fraction': 0.2}
AUTO_GRADIENT_NEGATIVES = 300
AUTO_EPOCHS = {'update': 'model_delta', 'local_epochs': 5, 'server_lr': 0.003}
AUTO_EPOCHS_NEGATIVES = 250
# Interactions per user from which the gradient branch is taken: between
# the transfer study's two generated logs (20 and 100 per user).
AUTO_LONG_HISTORY = 50
AUTO_NEGATIVES_RANGE = (4, 32)
# With a validation item, `auto` runs this many rounds and serves the round
# it chooses (without one, the task's rounds: the last round is served, and
# past its peak a model may decline).
AUTO_VALIDATED_ROUNDS = 300
# Ranking every user against every item costs by the score (users x
# items): `auto` ranks about this many scores a round on average, at most
# every `AUTO_MAX_FULL_EVERY` rounds, so the validation item choosing among
# 300 rounds does not cost more than their training (LastFM-2K, ranked every
# round: 19 s an evaluation against a 2 s round).
AUTO_SCORES_PER_ROUND = 2_000_000
AUTO_MAX_FULL_EVERY = 20
# A new tuner search tries this recipe first (`tuning.TuneConfig`).
TUNER_STARTS_FROM_AUTO = True
# A search's trials to reach, and the share of its wall-clock budget one
# trial may take before it is stopped (so one slow setting cannot spend it).
TUNER_TRIALS = 20
TUNER_TRIAL_SHARE = 0.25
# The share of a trial's rounds it runs before the median pruner may stop it
# on its metric (0: from its first evaluation).
TUNER_PRUNE_AFTER = 0.0
# Completed trials before the pruner may stop any: from the first on (the
# `auto` recipe when the search starts from it), a trial is stopped when its
# best so far falls below the completed trials' median at the same round.
# Three left every expensive search unpruned for its whole budget (LastFM-2K,
# 800-round trials: 40 minutes each, one of them ten local epochs a round).
TUNER_PRUNE_FROM_TRIALS = 1


@dataclasses.dataclass(frozen=True)
class DataProfile:
    """What a data-dependent preset may read of the data.

    Attributes:
      users: Users kept by the split.
      items: Items of the catalog.
      interactions: Interactions kept (training, validation and test).
      validated: Whether every user holds a validation item.
    """

    users: int
    items: int
    interactions: int
    validated: bool = False

    @classmethod
    def of(cls, split) -> 'DataProfile':
        """The profile of a `data.Split`."""
        stats = split.summary()
        return cls(users=stats['users'], items=stats['items'],
                   interactions=stats['interactions'], validated=stats['valid_users'] > 0)

    @property
    def interactions_per_user(self) -> float:
        return self.interactions / max(1, self.users)


def auto_negatives(profile: DataProfile, per_user: float = AUTO_GRADIENT_NEGATIVES) -> int:
    """Training negatives per positive under ``auto``:
    ``round(per_user / interactions per user)``, clipped to
    `AUTO_NEGATIVES_RANGE`."""
    low, high = AUTO_NEGATIVES_RANGE
    wanted = math.floor(per_user / profile.interactions_per_user + 0.5)
    return int(min(high, max(low, wanted)))


def auto_branch(profile: DataProfile) -> tuple[dict[str, Any], float]:
    """The ``auto`` branch for data of this profile: its settings and its
    negatives per user (short histories: `AUTO_EPOCHS`; from
    `AUTO_LONG_HISTORY` interactions per user: `AUTO_GRADIENT`)."""
    if profile.interactions_per_user < AUTO_LONG_HISTORY:
        return dict(AUTO_EPOCHS), AUTO_EPOCHS_NEGATIVES
    return dict(AUTO_GRADIENT), AUTO_GRADIENT_NEGATIVES


def auto_full_every(profile: DataProfile) -> int:
    """Rounds between two full-ranking evaluations under ``auto``:
    ``ceil(users x items / AUTO_SCORES_PER_ROUND)``, 1 to
    `AUTO_MAX_FULL_EVERY`."""
    wanted = math.ceil(profile.users * profile.items / AUTO_SCORES_PER_ROUND)
    return int(min(AUTO_MAX_FULL_EVERY, max(1, wanted)))


def auto_recipe(profile: DataProfile | None) -> dict[str, Any]:
    """The ``auto`` preset's settings for data of this profile.

    Args:
      profile: The data's profile; None gives nothing (every setting of the
        recipe follows the data; used to check flags before it is read).

    Returns:
      Settings by their command-line names.
    """
    if profile is None:
        return {}
    recipe, per_user = auto_branch(profile)
    recipe['num_negatives'] = auto_negatives(profile, per_user)
    if profile.validated:
        recipe['total_rounds'] = AUTO_VALIDATED_ROUNDS
        every = auto_full_every(profile)
        if every > 1:  # 1 is every evaluation already.
            recipe['rounds_per_full_eval'] = every
    return recipe


def describe_auto(profile: DataProfile) -> str:
    """How ``auto`` read the data, for the start-up banner."""
    history = profile.interactions_per_user
    _, per_user = auto_branch(profile)
    low, high = AUTO_NEGATIVES_RANGE
    side = '<' if history < AUTO_LONG_HISTORY else '>='
    every = auto_full_every(profile)
    rounds = '' if not profile.validated else (
        f'; a validation item: {AUTO_VALIDATED_ROUNDS} rounds'
        + (f', ranked against every item every {every}' if every > 1 else ''))
    return (f'{history:.1f} interactions per user {side} {AUTO_LONG_HISTORY:g}; negatives '
            f'{per_user:g} / {history:.1f}, within {low}-{high}{rounds}')


def is_preset_file(name: str) -> bool:
    """Whether `name` names a preset file rather than a built-in preset."""
    return isinstance(name, str) and name.endswith('.json')


def _load_preset_file(path: str) -> Any:
    try:
        with open(os.path.expanduser(path), encoding='utf-8') as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError(f'{path}: preset file not found') from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path}: not a readable JSON preset ({e})') from None


def preset_algorithm(name: str) -> str | None:
    """The method a preset file was tuned for (`launch/tune.py` records it
    beside the settings it holds under ``"settings"``), or None (a built-in
    preset, or a file without one).

    Raises:
      DataError: If the file is missing or unreadable.
    """
    if not is_preset_file(name):
        return None
    content = _load_preset_file(name)
    if not (isinstance(content, Mapping) and isinstance(content.get('settings'), Mapping)):
        return None  # A bare object of settings, which may not set the method.
    algorithm = content.get('algorithm')
    return algorithm if isinstance(algorithm, str) else None


def read_preset_file(path: str) -> dict[str, Any]:
    """The settings of a preset file: a JSON object, or one holding them
    under ``"settings"`` (as `launch/tune.py` writes).

    Raises:
      DataError: If the file is missing or not such an object.
    """
    content = _load_preset_file(path)
    if isinstance(content, Mapping) and isinstance(content.get('settings'), Mapping):
        content = content['settings']
    if not isinstance(content, Mapping) or not all(isinstance(k, str) for k in content):
        raise DataError(f'{path}: a preset file holds a JSON object of settings')
    return dict(content)


def check_preset_name(name: Any) -> None:
    """Refuses a preset that is neither built in nor a ``.json`` file.

    Raises:
      DataError: If it is neither.
    """
    if name in PRESETS or is_preset_file(name):
        return
    raise DataError(f'unknown preset {name!r}; choose one of {", ".join(PRESETS)} '
                    'or a .json preset file')


def preset_values(name: str, tuned: Mapping[str, Any],
                  profile: DataProfile | None) -> dict[str, Any]:
    """The settings a preset fills in.

    Args:
      name: A name of `PRESETS` or a ``.json`` path.
      tuned: The task's ``tuned`` settings.
      profile: The data's profile (``auto`` derives a setting from it).

    Returns:
      Settings by their command-line names.

    Raises:
      DataError: For an unknown preset or an unreadable preset file.
    """
    check_preset_name(name)
    if name == PAPER:
        return {}
    if name == TUNED:
        return dict(tuned)
    if name == AUTO:
        return auto_recipe(profile)
    return read_preset_file(name)


def needs_data(name: str) -> bool:
    """Whether the preset derives settings from the data."""
    return name == AUTO
