"""Checks the project's GPFedRec against its authors' published code.

On a small case of this project's split (the most active users of a task,
their round batches with the project's negatives), both implementations
start from the same initial weights and see the same minibatches in the
same order for `--rounds` rounds, every user of the case in every round;
the script compares after each round every user's client model (item
table, user embedding, MLP), the server's table for each user and its
global table. The authors' code (Zhangcx19/GPFedRec) runs from
`--authors_code` in a separate Python with torch and scikit-learn
(`--torch_python`), through launch/oracle_gpfedrec_authors.py; nothing of
it is copied here.

    .venv/bin/python launch/oracle_gpfedrec.py --authors_code=/tmp/gpfedrec_oracle \\
        --torch_python=/tmp/torch_venv/bin/python --task=filmtrust \\
        --data_dir=/work/shared/datasets/filmtrust

Their code picks a user's neighbors by cosine distance (the least similar
tables); `--neighbors=distant`, the default here, does the same, and
`--neighbors=similar` (the paper's rule, the project's default) shows how far
apart the two are. Prints the largest absolute difference of each compared
quantity, relative to the largest authors' value of it (the item tables
take steps of `lr * num_items * lr_eta`, so their entries reach tens), and
exits non-zero if any relative difference exceeds `--tolerance`.
"""

import collections
import os
import subprocess
import sys
import tempfile
import types

from absl import app
from absl import flags
import numpy as np

if __package__ in (None, ''):
    # Run as `python launch/oracle_gpfedrec.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_fedrecgel import algorithm_config  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.data.client_data import FederatedTrainData  # pylint: disable=g-import-not-at-top

_AUTHORS = flags.DEFINE_string('authors_code', None, 'Folder of the authors\' code.',
                               required=True)
_TORCH = flags.DEFINE_string('torch_python', sys.executable,
                             'A Python with numpy, torch and scikit-learn.')
_TASK = flags.DEFINE_string('task', 'filmtrust', 'The task whose split gives the case.')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'The task\'s data folder.')
_USERS = flags.DEFINE_integer('users', 6, 'Users of the case (the most active ones).')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds compared.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local epochs.')
_BATCH = flags.DEFINE_integer('batch_size', algorithm_config.GPFEDREC.batch_size,
                              'Local minibatch size (small values give several '
                              'minibatches per user).')
_NEIGHBORS = flags.DEFINE_enum('neighbors', 'distant', ['distant', 'similar'],
                               'The project\'s neighbor rule in this check.')
_PER_USER = flags.DEFINE_bool('per_user', False, 'One user per TFF client (else one group).')
_TOLERANCE = flags.DEFINE_float('tolerance', 1e-6,
                                 'Largest allowed difference relative to the largest '
                                 '|authors\' value| of the quantity.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the weights, batches and orders.')
_KEEP = flags.DEFINE_string('keep_dir', None, 'Keep the case and both sides\' results here.')


def _case(split, config, users, rounds, seed):
    """The case both sides run (users renumbered 0..n-1, as their code needs)."""
    from tff_fedrecgel.algorithms import gpfedrec, pfedrec  # pylint: disable=g-import-not-at-top
    table0, local0 = gpfedrec.initial_weights(split.num_items, config, seed)
    data = FederatedTrainData.from_split(split)
    case = {'num_users': len(users), 'num_items': split.num_items,
            'latent_dim': config.latent_dim, 'layers': np.asarray(config.layers),
            'lr': config.lr, 'lr_eta': config.lr_eta, 'reg': config.reg,
            'batch_size': config.batch_size, 'local_epochs': config.local_epochs,
            'threshold': config.neighborhood_threshold, 'mp_layers': config.mp_layers,
            'rounds': rounds, 'table0': table0}
    case.update({f'{k}0': np.asarray(v) for k, v in local0.items()})
    for r in range(rounds):
        batches = data.round_batches(users, seed=seed, round_num=r + 1)
        for u, (items, labels) in enumerate(batches):
            order = pfedrec.epoch_orders(len(items), config.local_epochs, config.batch_size,
                                         np.random.default_rng([seed, r, u]))
            case.update({f'r{r}_u{u}_items': items, f'r{r}_u{u}_labels': labels,
                         f'r{r}_u{u}_order': order})
    return case


def _project_side(case, config, per_user):
    """The project's rounds on the case, through the simulation's GPFedRec."""
    from tff_fedrecgel.algorithms import gpfedrec, pfedrec  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.simulation import gpfedrec_adapter  # pylint: disable=g-import-not-at-top
    n, num_items = int(case['num_users']), int(case['num_items'])
    algorithm = gpfedrec_adapter.GPFedRec(
        model_config=types.SimpleNamespace(num_items=num_items), num_users=n,
        seed=0, config=config)
    algorithm.initialize()
    algorithm.table[:] = case['table0']
    algorithm.tables[:] = case['table0']
    for k in algorithm.local:
        algorithm.local[k][:] = case[f'{k}0']
    out = {}
    users = list(range(n))
    hidden = len(config.layers) - 1
    for r in range(int(case['rounds'])):
        batches = [(case[f'r{r}_u{u}_items'], case[f'r{r}_u{u}_labels']) for u in users]
        groups = [[u] for u in users] if per_user else [users]
        clients = [(g, pfedrec.pack_groups([batches[u] for u in g],
                                           [case[f'r{r}_u{u}_order'] for u in g],
                                           config.batch_size)) for g in groups]
        algorithm.run_round(users, batches, clients)
        out[f'r{r}_global'] = algorithm.table.copy()
        flat = algorithm.tables.reshape(n, -1)
        targets = gpfedrec.rows_transform(  # What the next round starts from.
            flat, algorithm.graph_users, algorithm.propagation, out=np.empty_like(flat))
        for u in users:
            mlp = []
            for i in range(hidden):
                mlp += [algorithm.local[f'w{i}'][u].ravel(), algorithm.local[f'b{i}'][u]]
            mlp += [algorithm.local['w_out'][u], np.atleast_1d(algorithm.local['b_out'][u])]
            out.update({f'r{r}_u{u}_target': targets[u].reshape(num_items, -1),
                        f'r{r}_u{u}_table': algorithm.tables[u].copy(),
                        f'r{r}_u{u}_user': algorithm.local['user'][u].copy(),
                        f'r{r}_u{u}_mlp': np.concatenate(mlp)})
    return out


def compare(ours, theirs) -> collections.OrderedDict:
    """Per round and compared part, over the users: (largest absolute
    difference, largest |authors' value|)."""
    diffs = collections.OrderedDict()
    for key in sorted(theirs):
        name = f'{key.split("_")[0]} {key.split("_")[-1]}'
        diff = float(np.max(np.abs(np.asarray(ours[key], np.float64) - theirs[key])))
        scale = float(np.max(np.abs(theirs[key])))
        old = diffs.get(name, (0.0, 0.0))
        diffs[name] = (max(old[0], diff), max(old[1], scale))
    return diffs


def main(argv):
    del argv
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top
    split = tasks.get_task(_TASK.value).load_split(data_dir=_DATA_DIR.value)
    config = algorithm_config.GPFedRecConfig(local_epochs=_EPOCHS.value,
                                             batch_size=_BATCH.value,
                                             neighbors=_NEIGHBORS.value)
    counts = np.bincount(split.train_users, minlength=split.num_users)
    users = sorted(np.argsort(-counts, kind='stable')[:_USERS.value].tolist())
    case = _case(split, config, users, _ROUNDS.value, _SEED.value)
    with tempfile.TemporaryDirectory() as tmp:
        folder = _KEEP.value or tmp
        os.makedirs(folder, exist_ok=True)
        case_path, out_path = os.path.join(folder, 'case.npz'), os.path.join(folder, 'out.npz')
        np.savez(case_path, **case)
        subprocess.run([_TORCH.value, os.path.join(os.path.dirname(__file__),
                                                   'oracle_gpfedrec_authors.py'),
                        _AUTHORS.value, case_path, out_path], check=True)
        theirs = dict(np.load(out_path))
        ours = _project_side(case, config, _PER_USER.value)
        if _KEEP.value:
            np.savez(os.path.join(folder, 'ours.npz'), **ours)
    diffs = compare(ours, theirs)
    print(f'{_TASK.value}: {split.num_users} users x {split.num_items} items; case of '
          f'{len(users)} users with {int(counts[users].sum())} training rows, '
          f'{_ROUNDS.value} rounds, batch {config.batch_size}, neighbors '
          f'{config.neighbors}, {"one user per" if _PER_USER.value else "one group in one"} '
          'TFF client')
    for name, (diff, scale) in diffs.items():
        print(f'  max |ours - authors| {name:<12} {diff:.3g}  (max |authors| {scale:.3g}, '
              f'relative {diff / max(scale, 1e-30):.3g})')
    worst = max(diff / max(scale, 1e-30) for diff, scale in diffs.values())
    print(f'max relative diff {worst:.3g} (tolerance {_TOLERANCE.value:g}): '
          f'{"OK" if worst <= _TOLERANCE.value else "FAILED"}')
    sys.exit(0 if worst <= _TOLERANCE.value else 1)


if __name__ == '__main__':
    app.run(main)
