"""Checks the project's FedRAP against its authors' published code.

On a small case of this project's split (a few users of a task, their round
batches with the project's negatives), both implementations start from the
same initial weights (C, D0, score function) and see the same users and the
same minibatches in the same order for `--rounds` rounds; the script
compares, after each round, the server's C and every user's score function
and whole D_u (the project's stored as `scale * D0 + trained rows`). The
authors' code (mtics/FedRAP) runs from `--authors_code` in a separate Python
with torch (`--torch_python`), through launch/oracle_fedrap_authors.py;
nothing of it is copied here.

    .venv/bin/python launch/oracle_fedrap.py --authors_code=/tmp/fedrap_oracle \\
        --torch_python=/tmp/torch_venv/bin/python --task=filmtrust \\
        --data_dir=/work/shared/datasets

`--curriculum=fixed` (the default) is what the published code computes (its
loss reads the final `lambda` and `mu` from the first round); `tanh` feeds
its engine's curriculum values into its loss. Prints the largest absolute
difference of each compared quantity and exits non-zero if any exceeds
`--tolerance`.
"""

import dataclasses
import os
import sys
import types

from absl import app
from absl import flags
import numpy as np

if __package__ in (None, ''):
    # Run as `python launch/oracle_fedrap.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_fedrecgel.algorithms import personal_batches  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.recommenders.fedrap import computation as fedrap  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.launch import _entry  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.launch import _oracle  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.data.client_data import FederatedTrainData  # pylint: disable=g-import-not-at-top

_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds compared.')
_EPOCHS = flags.DEFINE_integer('local_epochs', fedrap.DEFAULT_CONFIG.local_epochs,
                               'Local epochs.')
_BATCH = flags.DEFINE_integer('batch_size', 256, 'Local minibatch size (the authors\' '
                              f'{fedrap.DEFAULT_CONFIG.batch_size} gives one minibatch '
                              'per epoch to every user of the case).')
_CURRICULUM = flags.DEFINE_enum('curriculum', 'fixed', ['fixed', 'tanh'],
                                'How lam and mu grow over rounds.')
_TOL = flags.DEFINE_float('tol', fedrap.DEFAULT_CONFIG.tol, 'The early stop\'s relative '
                          'tolerance (a larger one makes users stop early).')
_CONTRAST = flags.DEFINE_list('ours_only', [], 'Settings changed on the project\'s side only, '
                              'as name=value of FedRAPConfig (shows the check can fail), '
                              'e.g. weight_decay=0.')
_TOLERANCE = flags.DEFINE_float('tolerance', 1e-4, 'Largest allowed absolute difference.')


def _case(split, config, users, rounds, seed):
    """The case both sides run: weights, and per round the users' batches."""
    from tff_fedrecgel.recommenders.fedrap import computation as fedrap  # pylint: disable=g-import-not-at-top
    c0, d0, w0, b0 = fedrap.initial_weights(split.num_items, config, seed)
    data = FederatedTrainData.from_split(split)
    case = {'num_users': split.num_users, 'num_items': split.num_items, 'rounds': rounds,
            'c0': c0, 'd0': d0, 'w0': w0, 'b0': np.float32(b0),
            **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}}
    for r in range(rounds):
        case[f'r{r}_users'] = np.asarray(users)
        batches = data.round_batches(users, seed=seed, round_num=r + 1)
        width = min(config.batch_size, max(len(items) for items, _ in batches))
        case[f'r{r}_width'] = width
        for u, (items, labels) in zip(users, batches):
            order = personal_batches.epoch_orders(len(items), config.local_epochs, width,
                                         np.random.default_rng([seed, r, u]))
            case.update({f'r{r}_u{u}_items': items, f'r{r}_u{u}_labels': labels,
                         f'r{r}_u{u}_order': order})
    return case


def _project_side(case, config, seed):
    """The project's TFF round and the adapter's storage on the case."""
    from tff_fedrecgel.recommenders.fedrap import computation as fedrap  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.recommenders.fedrap import adapter as fedrap_adapter  # pylint: disable=g-import-not-at-top
    algorithm = fedrap_adapter.FedRAP(
        model_config=types.SimpleNamespace(num_items=int(case['num_items'])),
        num_users=int(case['num_users']), seed=seed, config=config)
    algorithm.initialize()
    out = {}
    for r in range(int(case['rounds'])):
        users = np.asarray(case[f'r{r}_users'], np.int64)
        data = fedrap.pack_groups(
            [(case[f'r{r}_u{u}_items'], case[f'r{r}_u{u}_labels']) for u in users],
            [case[f'r{r}_u{u}_order'] for u in users], int(case[f'r{r}_width']),
            config.local_epochs)
        state, new_users, metrics = algorithm.process.next(
            algorithm.state, [algorithm._users_struct(users, data)],  # pylint: disable=protected-access
            [data.as_struct()])
        algorithm.state = state
        out[f'steps_r{r}'] = int(metrics['steps'])
        algorithm._keep(users, data, new_users[0])  # pylint: disable=protected-access
        out[f'r{r}_table'] = algorithm.global_weights[0]
        for u in users:
            out.update({f'r{r}_u{u}_w': algorithm.w[u].copy(), f'r{r}_u{u}_b': algorithm.b[u],
                        f'r{r}_u{u}_personal': algorithm.dense_personal(u)})
    return out


def main(argv):
    del argv
    try:
        config = dataclasses.replace(fedrap.DEFAULT_CONFIG, local_epochs=_EPOCHS.value,
                                     batch_size=_BATCH.value, curriculum=_CURRICULUM.value,
                                     tol=_TOL.value)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    ours_config = config
    for item in _CONTRAST.value:
        name, sep, value = item.partition('=')
        if not sep or name not in {f.name for f in dataclasses.fields(config)}:
            raise app.UsageError(f'--ours_only takes name=value of FedRAPConfig, got {item!r}')
        try:
            ours_config = dataclasses.replace(ours_config, **{name: type(getattr(config, name))(
                value)})
        except ValueError as e:
            raise app.UsageError(f'--ours_only {item}: {e}') from None
    _entry.tff_runtime()  # TFF's worker dies with this process.
    split = _oracle.load_split()
    users, rows = _oracle.most_active_users(split)
    case = _case(split, config, users, _ROUNDS.value, _oracle.SEED.value)
    theirs = _oracle.run_authors('oracle_fedrap_authors.py', case)
    ours = _project_side(case, ours_config, _oracle.SEED.value)
    _oracle.keep(ours)
    steps = [ours.pop(f'steps_r{r}') for r in range(_ROUNDS.value)]
    print(f'{_oracle.TASK.value}: {split.num_users} users x {split.num_items} items; case of '
          f'{len(users)} users with {rows} training rows, '
          f'{_ROUNDS.value} rounds, batch {config.batch_size}, {config.local_epochs} '
          f'local epochs, tol {config.tol:g}, curriculum {config.curriculum}, one group in one '
          f'TFF client{"; ours only: " + ",".join(_CONTRAST.value) if _CONTRAST.value else ""}')
    full = sum(-(-len(case[f'r0_u{u}_items']) // int(case['r0_width'])) for u in users)
    print(f'  local steps per round (ours): {steps}; without early stops about '
          f'{full * config.local_epochs}')
    sys.exit(_oracle.report(_oracle.max_differences(ours, theirs, 'server_C'),
                            _TOLERANCE.value))


if __name__ == '__main__':
    app.run(main)
