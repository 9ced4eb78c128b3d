r"""Prints a user's top-K items, in the data's original ids, from a trained run.

Examples (from the repository root)::

    .venv/bin/python launch/recommend.py --run_dir=runs/filmtrust_fedrecgel_seed0 \
        --user=42 --k=10
    .venv/bin/python launch/recommend.py --run_dir=runs/filmtrust_fedrecgel_seed0 \
        --items=12,85,301     # a new user who liked these items

A user of the data is scored with the run's checkpoint (--checkpoint): its global
weights and the user's stored embedding, or, where users keep none (FedRecon,
--local_state=reconstruct, users held out of training), an embedding rebuilt
from the user's training interactions with the run's reconstruction settings.
A new user's embedding is rebuilt the same way from the items given. Items
the user already has are left out (--exclude=none keeps them, a list of ids
leaves out those instead, as the SavedModel's `exclude`). Ids are the raw file's (users.csv and
items.csv of the split files map them to indices).

Output: one line about the user, then `rank item_id score` lines (the score is
the model's logit); --json prints one JSON object instead.
"""

from __future__ import annotations

import json
import os
import sys

if __package__ in (None, ''):
    # Run as `python launch/recommend.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags

from tff_fedrecgel import api
from tff_fedrecgel.data.id_maps import IdMap
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

SEEN, NONE = 'seen', 'none'

_RUN_DIR = flags.DEFINE_string(
    'run_dir', None, 'Run folder written by launch/train.py (required).')
_USER = flags.DEFINE_string('user', None, 'Original id of a user of the data.')
_ITEMS = flags.DEFINE_list(
    'items', None, 'Original ids of the items a new user (not in the data) '
    'interacted with, comma-separated; instead of --user.')
_K = flags.DEFINE_integer('k', 10, 'How many items to recommend.')
_EXCLUDE = flags.DEFINE_string(
    'exclude', SEEN,
    f'Items left out: {SEEN} (the user\'s own, as the SavedModel\'s `exclude` '
    f'default), {NONE} (nothing left out), or original item ids, comma-separated '
    '(they replace the seen items).')
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, 'Where the run\'s raw data is now (default: where it was '
    'trained from, as hparams.json records).')
_JSON = flags.DEFINE_bool('json', False, 'Print one JSON object.')
_CHECKPOINT = _entry.define_checkpoint_flag()


def _excluded() -> list[str] | None:
    """--exclude as `TrainedModel.top_k` takes it (None: the seen items)."""
    value = _EXCLUDE.value.strip()
    if value == SEEN:
        return None
    if value == NONE:
        return []
    listed = [v.strip() for v in value.split(',') if v.strip()]
    if not listed:
        raise DataError(f'--exclude is empty; give {SEEN}, {NONE} or item ids, comma-separated')
    return listed


def _check_ids(split) -> None:
    """Unknown ids fail here, before TensorFlow is imported."""
    items = IdMap(kind='item', size=split.num_items, ids=split.item_ids)
    if _excluded():
        try:
            items.indices(_excluded())
        except DataError as e:
            raise DataError(f'--exclude: {e}') from None
    users = IdMap(kind='user', size=split.num_users, ids=split.user_ids)
    if _ITEMS.value is not None:
        if not _ITEMS.value:
            raise DataError('--items is empty; give the original ids of the new '
                            'user\'s items, comma-separated')
        if _USER.value is not None and _USER.value in users:
            raise DataError(f'user {_USER.value!r} is in the data; give --user or '
                            '--items (a new user), not both')
        items.indices(_ITEMS.value)
    elif _USER.value is None:
        raise DataError('give --user=ID (a user of the data) or --items=ID,... '
                        '(a new user\'s items)')
    elif _USER.value not in users:
        raise DataError(f'unknown user id {_USER.value!r}: not in the data of this run '
                        '(for a new user, give its items with --items=ID,...)')


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    if not _RUN_DIR.value:
        raise DataError('--run_dir is required')
    if _K.value < 1:
        raise ValueError(f'--k must be >= 1, got {_K.value}')
    run_settings, foreign, split = api.read_run(_RUN_DIR.value, data_dir=_DATA_DIR.value)
    _check_ids(split)

    with api.Session():
        experiment = api.Experiment(run_settings, run_dir=_RUN_DIR.value, split=split,
                                    foreign_settings=foreign)
        round_num = experiment.restore(checkpoint=_CHECKPOINT.value)
        model = experiment.model()
        if _ITEMS.value is not None:
            embedding = model.embedding_from_items(_ITEMS.value)
            who = f'new user {_USER.value}' if _USER.value else 'a new user'
        else:
            embedding = model.user_embedding(_USER.value)
            who = f'user {_USER.value}'
        top = model.top_k(embedding, k=_K.value, exclude=_excluded())

    if _JSON.value:
        print(json.dumps({
            'run_dir': str(experiment.paths.root), 'round': round_num,
            'user': _USER.value, 'new_user': _ITEMS.value is not None,
            'embedding': embedding.source, 'seen_items': len(embedding.seen_items),
            'exclude': _EXCLUDE.value,
            'items': [{'rank': r.rank, 'item_id': r.item_id, 'score': r.score}
                      for r in top]}), flush=True)
        return 0
    excluded = _excluded()
    left_out = (f'{len(embedding.seen_items)} items already seen left out' if excluded is None
                else f'{len(set(excluded))} items left out by --exclude' if excluded
                else 'nothing left out')
    print(f'{run_settings.task} {run_settings.algorithm}, round {round_num}: {who} '
          f'({embedding.source} embedding, {left_out}); top {len(top)}:', flush=True)
    width = max([len("item_id")] + [len(str(r.item_id)) for r in top])
    print(f'rank  {"item_id".ljust(width)}  score')
    for r in top:
        print(f'{r.rank:>4}  {str(r.item_id).ljust(width)}  {r.score:.4f}')
    return 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
