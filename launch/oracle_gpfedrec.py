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

import os
import sys
import types

from absl import app
from absl import flags
import numpy as np

if __package__ in (None, ''):
    # Run as `python launch/oracle_gpfedrec.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_fedrecgel.algorithms import personal_batches  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.recommenders.gpfedrec import computation as gpfedrec  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.launch import _entry  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.launch import _oracle  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.data.client_data import FederatedTrainData  # pylint: disable=g-import-not-at-top

_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds compared.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local epochs.')
_BATCH = flags.DEFINE_integer('batch_size', gpfedrec.DEFAULT_CONFIG.batch_size,
                              'Local minibatch size (small values give several '
                              'minibatches per user).')
_NEIGHBORS = flags.DEFINE_enum('neighbors', 'distant', ['distant', 'similar'],
                               'The project\'s neighbor rule in this check.')
_PER_USER = flags.DEFINE_bool('per_user', False, 'One user per TFF client (else one group).')
_TOLERANCE = flags.DEFINE_float('tolerance', 1e-6,
                                 'Largest allowed difference relative to the largest '
                                 '|authors\' value| of the quantity.')


def _case(split, config, users, rounds, seed):
    """The case both sides run (users renumbered 0..n-1, as their code needs)."""
    from tff_fedrecgel.recommenders.gpfedrec import computation as gpfedrec  # pylint: disable=g-import-not-at-top
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
            order = personal_batches.epoch_orders(len(items), config.local_epochs, config.batch_size,
                                         np.random.default_rng([seed, r, u]))
            case.update({f'r{r}_u{u}_items': items, f'r{r}_u{u}_labels': labels,
                         f'r{r}_u{u}_order': order})
    return case


def _project_side(case, config, per_user):
    """The project's rounds on the case, through the simulation's GPFedRec."""
    from tff_fedrecgel.recommenders.gpfedrec import computation as gpfedrec  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.recommenders.gpfedrec import adapter as gpfedrec_adapter  # pylint: disable=g-import-not-at-top
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
        clients = [(g, personal_batches.pack_groups([batches[u] for u in g],
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


def main(argv):
    del argv
    _entry.tff_runtime()  # TFF's worker dies with this process.
    split = _oracle.load_split()
    config = gpfedrec.GPFedRecConfig(local_epochs=_EPOCHS.value,
                                             batch_size=_BATCH.value,
                                             neighbors=_NEIGHBORS.value)
    users, rows = _oracle.most_active_users(split)
    case = _case(split, config, users, _ROUNDS.value, _oracle.SEED.value)
    theirs = _oracle.run_authors('oracle_gpfedrec_authors.py', case)
    ours = _project_side(case, config, _PER_USER.value)
    _oracle.keep(ours)
    print(f'{_oracle.TASK.value}: {split.num_users} users x {split.num_items} items; case of '
          f'{len(users)} users with {rows} training rows, '
          f'{_ROUNDS.value} rounds, batch {config.batch_size}, neighbors '
          f'{config.neighbors}, {"one user per" if _PER_USER.value else "one group in one"} '
          'TFF client')
    sys.exit(_oracle.report(_oracle.max_differences(ours, theirs, 'global'),
                            _TOLERANCE.value, relative=True))


if __name__ == '__main__':
    app.run(main)
