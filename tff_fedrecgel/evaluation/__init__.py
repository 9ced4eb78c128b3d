"""Evaluation: each protocol an object, and the paths that rank users.

  protocols.py       the protocols (`SAMPLED`, `FULL`; `CHOICES` of
                     `--eval_protocol`): names, metric names, how each ranks
  ranking.py         ranks -> HR@K, NDCG@K, MRR (ties against the held-out item)
  sampled.py         the sampled protocol on NeuMF: batched and federated
  full_ranking.py    the full protocol on NeuMF: batched and federated
  reconstruction.py  embeddings rebuilt for users who keep none
  keras_metrics.py   the sampled metrics as Keras metrics (FedRecon)
  eval_sample.py     a fixed sample of users, standard errors

Submodules load on first use (this package imports no TensorFlow), so the
settings and flags can read `protocols` cheaply and `algorithms/` can take
`keras_metrics` without a circle. The names of the former `evaluation`
module stay reachable here.
"""

import importlib

_SUBMODULES = ('eval_sample', 'full_ranking', 'keras_metrics', 'protocols', 'ranking',
               'reconstruction', 'sampled')
# Names of the former module, by the submodule that holds them now.
_MOVED = {
    'DEFAULT_BATCH_SIZE': 'sampled',
    'evaluate_users': 'sampled',
    'evaluate_item_scores': 'sampled',
    'build_federated_evaluation': 'sampled',
    'DEFAULT_MAX_BATCH_EXAMPLES': 'reconstruction',
    'reconstruct_local_tables': 'reconstruction',
    'build_federated_reconstruction_evaluation': 'reconstruction',
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f'{__name__}.{name}')
    if name in _MOVED:
        return getattr(importlib.import_module(f'{__name__}.{_MOVED[name]}'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES) | set(_MOVED))
