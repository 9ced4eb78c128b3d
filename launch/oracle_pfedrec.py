"""Checks the project's PFedRec against its authors' published code.

On a small case of this project's split (a few users of a task, their round
batches with the project's negatives), both implementations start from the
same initial weights and see the same users and the same minibatches in the
same order for `--rounds` rounds; the script compares every user's client
model after each round (score function and item table) and the server's
averaged item table. The authors' code (Zhangcx19/IJCAI-23-PFedRec) runs
from `--authors_code` in a separate Python with torch (`--torch_python`),
through launch/oracle_pfedrec_authors.py; nothing of it is copied here.

    .venv/bin/python launch/oracle_pfedrec.py --authors_code=/tmp/pfedrec_oracle \\
        --torch_python=/tmp/torch_venv/bin/python --task=filmtrust \\
        --data_dir=/work/shared/datasets/filmtrust

Prints the largest absolute difference of each compared quantity and exits
non-zero if any exceeds `--tolerance`.
"""

import collections
import os
import sys

from absl import app
from absl import flags
import numpy as np

if __package__ in (None, ''):
    # Run as `python launch/oracle_pfedrec.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_fedrecgel.algorithms import personal_batches  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.recommenders.pfedrec import computation as pfedrec  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.launch import _entry  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.launch import _oracle  # pylint: disable=g-import-not-at-top
from tff_fedrecgel.data.client_data import FederatedTrainData  # pylint: disable=g-import-not-at-top

_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Rounds compared.')
_EPOCHS = flags.DEFINE_integer('local_epochs', 1, 'Local epochs.')
_BATCH = flags.DEFINE_integer('batch_size', pfedrec.DEFAULT_CONFIG.batch_size,
                              'Local minibatch size (small values give several '
                              'minibatches per user).')
_PER_USER = flags.DEFINE_bool('per_user', False, 'One user per TFF client (else one group).')
_TOLERANCE = flags.DEFINE_float('tolerance', 1e-5, 'Largest allowed absolute difference.')


def _case(split, config, users, rounds, seed):
    """The case both sides run: weights, and per round the users' batches."""
    from tff_fedrecgel.recommenders.pfedrec import computation as pfedrec  # pylint: disable=g-import-not-at-top
    table0, w0, b0 = pfedrec.initial_weights(split.num_items, config, seed)
    data = FederatedTrainData.from_split(split)
    case = {'num_users': split.num_users, 'num_items': split.num_items,
            'latent_dim': config.latent_dim, 'score_lr': config.score_lr,
            'item_lr_eta': config.item_lr_eta, 'batch_size': config.batch_size,
            'local_epochs': config.local_epochs, 'rounds': rounds,
            'table0': table0, 'w0': w0, 'b0': np.float32(b0)}
    for r in range(rounds):
        case[f'r{r}_users'] = np.asarray(users)
        batches = data.round_batches(users, seed=seed, round_num=r + 1)
        for u, (items, labels) in zip(users, batches):
            order = personal_batches.epoch_orders(len(items), config.local_epochs, config.batch_size,
                                         np.random.default_rng([seed, r, u]))
            case.update({f'r{r}_u{u}_items': items, f'r{r}_u{u}_labels': labels,
                         f'r{r}_u{u}_order': order})
    return case


def _project_side(case, config, per_user):
    """The project's TFF round on the case: per round the server table and users."""
    from tff_fedrecgel.recommenders.pfedrec import computation as pfedrec  # pylint: disable=g-import-not-at-top
    num_items = int(case['num_items'])
    process = pfedrec.build_pfedrec_process(num_items=num_items, config=config)
    state = process.initialize()
    state = collections.OrderedDict(item_table=case['table0'], round_num=state['round_num'])
    d = config.latent_dim
    w = {int(u): case['w0'].copy() for u in case['r0_users']}
    b = {int(u): np.float32(case['b0']) for u in case['r0_users']}
    out = {}
    for r in range(int(case['rounds'])):
        users = [int(u) for u in case[f'r{r}_users']]
        groups = [[u] for u in users] if per_user else [users]
        scores, datas = [], []
        for group in groups:
            scores.append(collections.OrderedDict(w=np.stack([w[u] for u in group]).reshape(-1, d),
                                        b=np.asarray([b[u] for u in group], np.float32)))
            datas.append(personal_batches.pack_groups(
                [(case[f'r{r}_u{u}_items'], case[f'r{r}_u{u}_labels']) for u in group],
                [case[f'r{r}_u{u}_order'] for u in group], config.batch_size))
        received = np.asarray(state['item_table'])
        state, new_scores, offsets, _ = process.next(state, scores,
                                                     [x.as_struct() for x in datas])
        out[f'r{r}_table'] = np.asarray(state['item_table'])
        for group, s, off, x in zip(groups, new_scores, offsets, datas):
            for i, u in enumerate(group):
                w[u], b[u] = np.asarray(s['w'][i]), np.float32(s['b'][i])
                table = received.copy()
                n = len(np.unique(case[f'r{r}_u{u}_items']))
                table[x.local_ids[i, :n]] += np.asarray(off)[i, :n]
                out.update({f'r{r}_u{u}_w': w[u], f'r{r}_u{u}_b': b[u],
                            f'r{r}_u{u}_table': table})
    return out


def main(argv):
    del argv
    _entry.tff_runtime()  # TFF's worker dies with this process.
    split = _oracle.load_split()
    config = pfedrec.PFedRecConfig(local_epochs=_EPOCHS.value,
                                            batch_size=_BATCH.value)
    users, rows = _oracle.most_active_users(split)
    case = _case(split, config, users, _ROUNDS.value, _oracle.SEED.value)
    theirs = _oracle.run_authors('oracle_pfedrec_authors.py', case)
    ours = _project_side(case, config, _PER_USER.value)
    _oracle.keep(ours)
    print(f'{_oracle.TASK.value}: {split.num_users} users x {split.num_items} items; case of '
          f'{len(users)} users with {rows} training rows, '
          f'{_ROUNDS.value} rounds, batch {config.batch_size}, {config.local_epochs} '
          f'local epoch(s), {"one user per" if _PER_USER.value else "one group in one"} '
          'TFF client')
    sys.exit(_oracle.report(_oracle.max_differences(ours, theirs, 'server_table'),
                            _TOLERANCE.value))


if __name__ == '__main__':
    app.run(main)
