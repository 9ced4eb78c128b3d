"""The splits are the same as those of the row-by-row preparation it replaced.

The expected digests were computed with the preparation of commit 862dc45
(before the columnar rewrite and the fast negative sampler), running this
file's `_digest` over ``tasks.get_task(name).load_split(data_dir=...,
validation=...)`` for the real datasets and over
``preprocess.build_split(synthetic.generate_synthetic(**options), ...)`` for
the synthetic ones. A digest covers the sizes, every index array (the train
rows in order, the held-out items and all their negatives) and the original
ids, so any change of split or sampled negatives at the same seeds fails
here. The real datasets are read from ``$FEDRECGEL_DATASETS`` (default
``<repo>/../shared/datasets``) and skipped when absent.
"""

import hashlib
import os

import numpy as np
import pytest

from tff_fedrecgel import tasks
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = os.environ.get(
    'FEDRECGEL_DATASETS', os.path.join(os.path.dirname(_REPO), 'shared',
                                       'datasets'))

REAL = {
    ('filmtrust', False): '7760c6b7b0c483580da9c8b29dcc4f4059b45f70a7c1b8db74ed477feca0b535',
    ('filmtrust', True): '2492469f71615b79ee6209e95108879f77bdf1a714d386ab8481fac07ed70ad1',
    ('lastfm_2k', False): '4e1b92743a581b02bc63a9cf894f7978f64d6387c429fb8ea0ff4bf9a0d8c0ae',
    ('lastfm_2k', True): '485e77da7dcaaa9e81175da8c5cc9c2f5f31719faee9fab34001739a8c41cde0',
    ('amazon_video', False): 'a4d8ce5de46996fd40d2b8c7f8f391af86fdbafd7ac10c0a237eadd35e029aec',
    ('amazon_video', True): 'f50f9ac33f7262ee0249dab804d93224f429b1e33168784ea4245e9b812f81e7',
}
# The second size takes the generator's large-population path (users x items
# over 2**26). That path was rewritten after 862dc45 (each user draws its own
# 4 n + 64 proposals, no padding to its block's widest user; 12x faster), so
# its log, not the preparation, differs from 862dc45's (then
# 1ff89505d9e6... and 21c555cfbda1...): these two digests are of the
# rewritten generator. The real datasets and the first size are 862dc45's.
SYNTHETIC = {
    (300, 250, 3, False): '91344d8d66954f6a69460ee2c30b85eb0d6a6bd880eaddb3193fc395bce9eabd',
    (300, 250, 3, True): '73d9d916142abef1e5f049b16d810cc7a1fcdf999daf290a0ee7f40e5312c7d4',
    (2000, 40000, 1, False): '99986f63175688b35ce589fcdb1e22327a6593e00d352a4f6b369ab36881728b',
    (2000, 40000, 1, True): '22bedd8989535025f62ac3a4f1d74000cd39fe9a426fbbf02e1ac06f504ab3ae',
}


def _digest(split):
    sha = hashlib.sha256(
        f'{split.num_users} {split.num_items} {split.num_interactions}'.encode())
    for name in ('train_users', 'train_items', 'test_items', 'test_negatives',
                 'valid_items', 'valid_negatives'):
        array = getattr(split, name)
        sha.update(name.encode())
        if array is not None:
            sha.update(np.ascontiguousarray(array, dtype='<i4').tobytes())
    for ids in (split.user_ids, split.item_ids):
        sha.update('\x1f'.join(map(str, ids.tolist())).encode('utf-8'))
    return sha.hexdigest()


@pytest.mark.parametrize('name,validation', sorted(REAL))
def test_real_dataset_split_is_unchanged(name, validation, tmp_path):
    task = tasks.get_task(name)
    data_dir = os.path.join(DATASETS, name)
    if not os.path.isfile(os.path.join(data_dir, task.raw_file)):
        pytest.skip(f'{name}: {task.raw_file} not found under {data_dir}')
    computed = task.load_split(data_dir=data_dir, validation=validation,
                               cache_dir=tmp_path)
    assert _digest(computed) == REAL[name, validation]
    # And read back from the cache.
    prepared = task.prepare(data_dir=data_dir, validation=validation,
                            cache_dir=tmp_path)
    assert prepared.cached
    assert _digest(prepared.split) == REAL[name, validation]


@pytest.mark.parametrize('users,items,seed,validation', sorted(SYNTHETIC))
def test_synthetic_split_is_unchanged(users, items, seed, validation):
    raw = synthetic.generate_synthetic(num_users=users, num_items=items,
                                       seed=seed)
    split = preprocess.build_split(raw, validation=validation)
    assert _digest(split) == SYNTHETIC[users, items, seed, validation]
