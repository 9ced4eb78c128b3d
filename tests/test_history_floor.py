"""The history floor (`--algorithm=history`): each user's own training items
first, then popularity; one adapter module and one registry line."""

import numpy as np
import pytest

from tff_fedrecgel import api
from tff_fedrecgel import methods


@pytest.fixture(name='repeating', scope='module')
def _repeating(tmp_path_factory):
    """A log where half of the users' latest item repeats an earlier one."""
    rng = np.random.default_rng(3)
    rows = ['user,item,timestamp']
    for user in range(40):
        items = rng.choice(200, size=8, replace=False)
        last = items[0] if user % 2 == 0 else rng.choice(np.setdiff1d(np.arange(200), items))
        rows += [f'{user},{item},{t}' for t, item in enumerate([*items, last])]
    path = tmp_path_factory.mktemp('log') / 'log.csv'
    path.write_text('\n'.join(rows) + '\n')
    split = api.prepare_data('csv', data_dir=path)
    repeats = np.array([split.test_items[u] in split.train_items[split.train_users == u]
                        for u in range(split.num_users)])
    assert repeats.mean() == 0.5
    return path, split, repeats


def _full_hr(tmp_path, split, algorithm, path):
    run = api.experiment('csv', run_dir=tmp_path / algorithm, split=split, data_dir=path,
                         algorithm=algorithm, eval_protocol='full', total_rounds=1)
    return run.train()['selections']['test_full']['test_full/hr@10']


def test_a_repeated_test_item_ranks_first_and_the_rest_as_popularity(repeating, tmp_path):
    path, split, repeats = repeating
    with api.Session():  # Its own worker, stopped after (the test session's stays current).
        history = _full_hr(tmp_path, split, 'history', path)
        popularity = _full_hr(tmp_path, split, 'itempop', path)
        # Every repeated target ranks first (the user's other items are not
        # candidates); a new target ranks as under popularity.
        run = api.experiment('csv', run_dir=tmp_path / 'scores', split=split, data_dir=path,
                             algorithm='history', total_rounds=1)
        run.train()
    users = np.arange(split.num_users)
    scores = run.simulation.algorithm.score_items(users, None)
    own = scores >= 1
    for user in users:
        mine = np.unique(split.train_items[split.train_users == user])
        assert set(np.flatnonzero(own[user])) == set(mine)
    popular = np.argsort(-scores[1])
    assert history >= repeats.mean() and history > popularity
    assert np.all(scores < 2) and np.all(np.diff(scores[1][popular][~own[1][popular]]) <= 0)


def test_a_new_user_ranks_its_own_positives_first():
    method = methods.get_method('history')
    assert not method.exports and not method.tunable and method.refused(['local_lr'])
    from tff_fedrecgel.simulation import history_adapter

    algorithm = object.__new__(history_adapter.HistoryFirst)
    algorithm.state = {'counts': np.array([5, 1, 0, 2], np.int32)}
    scores = algorithm.score_items([7], [(np.array([2, 0, 1]), np.array([1.0, 0.0, 0.0]))])
    assert np.argmax(scores[0]) == 2 and scores.shape == (1, 4)
    np.testing.assert_allclose(scores[0], [5 / 6, 1 / 6, 1.0, 2 / 6], rtol=1e-6)
