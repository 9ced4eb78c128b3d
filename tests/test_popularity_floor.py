"""Every run's summary carries the popularity floor on its own split, the
figure `--algorithm=itempop` reaches once every training user has counted."""

import pytest

from tff_fedrecgel import api

DATA = {'num_users': 50}


def test_the_floor_is_itempops_figure_and_the_same_for_every_method(tmp_path):
    common = dict(data_options=DATA, total_rounds=1, eval_protocol='both',
                  validation=True, heldout_users=0.2)
    with api.Session():
        itempop = api.experiment('synthetic', run_dir=tmp_path / 'itempop',
                                 algorithm='itempop', client_fraction=1.0, **common).train()
        fedrecgel = api.experiment('synthetic', run_dir=tmp_path / 'fedrecgel',
                                   algorithm='fedrecgel', **common).train()
    floor = itempop['popularity']
    for group in ('test', 'test_full'):
        counted = itempop['selections'][group]
        for metric in ('hr@10', 'ndcg@10', 'hr@5'):
            assert floor[f'{group}/{metric}'] == pytest.approx(counted[f'{group}/{metric}'])
    assert floor['test_full/mrr'] == pytest.approx(counted['test_full/mrr'])
    assert fedrecgel['popularity'] == floor  # The same split: the same floor.
