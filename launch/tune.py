r"""Searches a method's settings on the validation item (Optuna), federated.

Examples (from the repository root)::

    .venv/bin/python launch/tune.py --task=csv --data_dir=ratings.csv --trials=20
    .venv/bin/python launch/tune.py --task=lastfm_2k \
        --data_dir=/path/to/lastfm_2k --trials=30 --max_minutes=60
    .venv/bin/python launch/train.py --task=csv --data_dir=ratings.csv \
        --preset=runs/tune_csv_fedrecgel/best_preset.json

Every trial is a run folder under <root_output_dir>/trials/ (one TensorBoard
logdir compares them all in the HParams dashboard); the study is kept in
<root_output_dir>/study.db, so the same command resumes a search that was
stopped or killed. Settings given as flags are fixed for every trial and
left out of the search; `--space` narrows it further. The best trial's
settings are written to <root_output_dir>/best_preset.json, which
`launch/train.py --preset=PATH` and the API's `preset=PATH` accept. Then,
unless `--noframe`, the central model is searched with the same trials and
budget (<root_output_dir>/ceiling), and one table sets the tuned method
between item popularity on the same split (which every run's summary
carries) and that ceiling, at their validation-selected rounds. The last
printed line is the search's record as one JSON object.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import sys

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags

from tff_fedrecgel.launch import _algorithm_flags as algo
from tff_fedrecgel.launch import _client_flags
from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel.launch import _model_flags
from tff_fedrecgel.launch import _ranking_flags
from tff_fedrecgel.launch import _server_flags
from tff_fedrecgel.launch import _tree_flags
from tff_fedrecgel import methods
from tff_fedrecgel import recipes
from tff_fedrecgel import run_settings
from tff_fedrecgel import settings_tree
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

flags.adopt_module_key_flags(algo)
flags.adopt_module_key_flags(_client_flags)
flags.adopt_module_key_flags(_server_flags)
flags.adopt_module_key_flags(_data_flags)
flags.adopt_module_key_flags(_model_flags)
flags.adopt_module_key_flags(_ranking_flags)

_TRIALS = flags.DEFINE_integer('trials', recipes.TUNER_TRIALS, 'Finished trials to '
                               'reach (a resumed search counts the earlier ones).')
_MAX_MINUTES = flags.DEFINE_float('max_minutes', None,
                                  'Wall-clock budget of this call, in minutes.')
_TRIAL_MINUTES = flags.DEFINE_float(
    'trial_minutes', None, 'Wall-clock limit of one trial, in minutes: a trial past it '
    f'is pruned (default: {recipes.TUNER_TRIAL_SHARE:g} of --max_minutes); one the '
    'budget\'s end cuts runs on from its last checkpoint when the search resumes.')
_OBJECTIVE = flags.DEFINE_string(
    'objective', 'valid_full/ndcg@10',
    'Validation metric to maximize: valid_full/<metric> (full ranking) or '
    'valid/<metric> (sampled), e.g. valid/hr@10.')
_SPACE = flags.DEFINE_list(
    'space', None, 'Search these settings, or the default space plus +NAME ones '
    '(default: every dimension of tff_fedrecgel.tuning.SEARCH_SPACE the method can '
    'use; total_rounds only when named, e.g. --space=+total_rounds).')
_ROUNDS_SEARCH = settings_tree.SETTINGS['total_rounds'].search
_TOTAL_ROUNDS = flags.DEFINE_integer(
    'total_rounds', None, 'Rounds of every trial (default: the task\'s; '
    f'--space=+total_rounds searches them, {_ROUNDS_SEARCH.low:g} to '
    f'{_ROUNDS_SEARCH.high:g}, for federated methods).')
_ROUNDS_PER_FULL_EVAL = flags.DEFINE_integer(
    'rounds_per_full_eval', None, 'Full-ranking evaluation every this many rounds '
    '(default: every round).')
_FRAME = flags.DEFINE_bool(
    'frame', True, 'After the search: the central model searched with the same trials '
    'and budget (<folder>/ceiling), and one table of the tuned method between item '
    'popularity and it, at their validation-selected rounds.')
_START_FROM_AUTO = flags.DEFINE_bool(
    'start_from_auto', recipes.TUNER_STARTS_FROM_AUTO, 'A new search\'s first trial is '
    'the --preset=auto recipe for this data (within the searched settings), so the '
    'search starts from what an untuned run would use.')
_PRUNE_AFTER = flags.DEFINE_float(
    'prune_after', recipes.TUNER_PRUNE_AFTER, 'The share of a trial\'s rounds it runs '
    'before the median pruner may stop it on its metric (0: from its first evaluation).')
_ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', None, 'The tuning folder (default: runs/tune_<task>_<algorithm>).')

# Of the evaluation settings a search leaves to the user: who never trains
# (trials then report heldout/... as a run does), and when a trial past its
# peak ends (so a large --total_rounds is a cap, not a cost). Listed with
# this file's flags.
_tree_flags.define('evaluation', flags.FLAGS.find_module_defining_flag('trials'),
                   only=('heldout_users', 'early_stopping_patience'))

# Settings a search never takes from the flags: they are the search's own.
_FIXED_BY_THE_SEARCH = ('validation', 'eval_protocol', 'preset')


def _fixed_settings(task) -> dict:
    """Settings flags given on the command line: fixed for every trial."""
    fixed = {}
    for field in dataclasses.fields(run_settings.Settings):
        name = field.name
        if name in flags.FLAGS and flags.FLAGS[name].present and name not in (
                'task', 'algorithm', 'data_dir', 'seed', *_FIXED_BY_THE_SEARCH):
            fixed[name] = flags.FLAGS[name].value
    if _TOTAL_ROUNDS.value is not None:
        fixed['total_rounds'] = _TOTAL_ROUNDS.value
    if _ROUNDS_PER_FULL_EVAL.value is not None:
        fixed['rounds_per_full_eval'] = _ROUNDS_PER_FULL_EVAL.value
    fixed['data_dir'] = _data_flags.DATA_DIR.value
    fixed['data_options'] = _data_flags.task_options(task)
    return fixed


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv
    task = algo.selected_task()
    given = [f'--{n}' for n in _FIXED_BY_THE_SEARCH if n in flags.FLAGS and flags.FLAGS[n].present]
    if given:
        raise DataError(f'a search sets {", ".join(given)} itself (trials train on '
                        'the validation item); drop them')
    method = methods.get_method(algo.selected_algorithm())
    if not method.tunable:
        tunable = ', '.join(m.name for m in methods.METHODS.values() if m.tunable)
        raise DataError(f'--algorithm={method.name}: the search covers {tunable}')
    fixed = _fixed_settings(task)
    from tff_fedrecgel import program  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tuning  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tuning_frame  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tuning_study  # pylint: disable=g-import-not-at-top

    # Every fixed value is checked now, before anything is written.
    config = tuning.TuneConfig.create(
        task.name, algorithm=method.name, space=_SPACE.value, fixed=fixed,
        objective=_OBJECTIVE.value, trials=_TRIALS.value, max_minutes=_MAX_MINUTES.value,
        trial_minutes=_TRIAL_MINUTES.value, seed=algo.SEED.value,
        start_from_auto=_START_FROM_AUTO.value, prune_after=_PRUNE_AFTER.value)
    framed = _FRAME.value and method.name != tuning_frame.CEILING
    ceiling = tuning_frame.ceiling_config(config) if framed else None  # Checked now too.
    space = config.space
    root = _ROOT_OUTPUT_DIR.value or os.path.join('runs', f'tune_{task.name}_{method.name}')
    root_dir = os.path.abspath(root)
    # Said before the data load; the search takes the folder's lock itself.
    program.check_not_in_use(root_output_dir=os.path.dirname(root_dir),
                             experiment_name=os.path.basename(root_dir),
                             elsewhere=tuning.TUNING_FOLDER)
    tuning_study.check_folder(pathlib.Path(root_dir), config.definition)
    if ceiling is not None:
        tuning_study.check_folder(pathlib.Path(root_dir) / tuning_frame.CEILING_DIR,
                                  ceiling.definition)
    split = task.load_split(data_dir=fixed['data_dir'], validation=True,
                            eval_negatives=_ranking_flags.EVAL_NEGATIVES.value,
                            **fixed['data_options'])

    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    print(f'{task.name}: tuning {method.name} on {config.objective}, '
          f'{config.trials} trials, dimensions: '
          f'{", ".join(d.name for d in tuning.method_space(space, method.name)) or "none"}; '
          f'folder {root_dir}', flush=True)

    def trial_line(record, prefix=''):
        state = record['state'] + {'wall clock': ' on the wall clock',
                                   'budget': ' at the budget\'s end'}.get(record.get('stopped'), '')
        value = ('before its first evaluation' if record['value'] is None
                 else f'{config.objective} {record["value"]:.4f}')
        again = ('; it runs on from its last checkpoint when the search resumes'
                 if record['state'] == 'interrupted' else '')
        print(f'{prefix}trial {record["trial"]}: {state}, {value} '
              f'in {record["wall_seconds"]:.0f} s'
              f'{" (resumed from its checkpoint)" if record.get("resumed") else ""}, '
              f'{json.dumps(record["settings"])}{again}', flush=True)

    with api.Session():
        record = tuning.run_search(config, root=root_dir, split=split,
                                   make_experiment=api.experiment,
                                   on_trial_end=trial_line)
        if 'best_trial' in record:
            print(f'best: trial {record["best_trial"]}, {config.objective} '
                  f'{record["best_value"]:.4f}; preset: {record["preset_file"]}', flush=True)
        if 'trials_per_hour' in record:
            overhead = record.get('mean_overhead_seconds')
            print(f'{record["trials_per_hour"]:g} trials per hour' + (
                '' if overhead is None else
                f', {overhead:g} s a finished trial beyond its rounds'), flush=True)
        if framed:
            print('frame: the central model searched with the same budget', flush=True)
            record['frame'] = tuning_frame.run_frame(
                config, root=root_dir, split=split, make_experiment=api.experiment,
                on_trial_end=functools.partial(trial_line, prefix='ceiling '))
            print('\n'.join(tuning_frame.table_lines(record, record['frame'])), flush=True)
    print(json.dumps(record), flush=True)
    return 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main, interrupted_hint='run the same command to resume the search')
