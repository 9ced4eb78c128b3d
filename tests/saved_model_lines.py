"""Prints, from an exported SavedModel alone, the lines launch/recommend.py prints.

Run by tests/test_api.py in a separate Python (`-I`: nothing of this project
importable) as `saved_model_lines.py SAVED_MODEL_DIR '{"user", "k", "items"}'`;
prints one JSON object: the lines for the user (its seen items left out, and
nothing left out) and for a new user with these items, and whether any
module of this project was loaded.
"""

import json
import sys

import tensorflow as tf


def lines(top):
    """`rank item_id score` lines, formatted as launch/recommend.py does."""
    ids = [i.decode() for i in top['item_ids'].numpy()]
    width = max([len('item_id')] + [len(i) for i in ids])
    out = [f'rank  {"item_id".ljust(width)}  score']
    for rank, (i, score) in enumerate(zip(ids, top['scores'].numpy()), 1):
        out.append(f'{rank:>4}  {i.ljust(width)}  {score:.4f}')
    return out


def main():
    model = tf.saved_model.load(sys.argv[1])
    asked = json.loads(sys.argv[2])
    user = model.recommend(user_ids=[asked['user']], k=asked['k'])
    new_user = model.recommend_for_items(item_ids=asked['items'], k=asked['k'])
    # `exclude` given empty: nothing left out (recommend.py --exclude=none).
    keep_all = model.recommend(user_ids=[asked['user']], k=asked['k'],
                               exclude=tf.constant([], tf.string))
    print(json.dumps({
        'user': lines({name: value[0] for name, value in user.items()}),
        'new_user': lines(new_user),
        'user_none': lines({name: value[0] for name, value in keep_all.items()}),
        'loaded_project': any(m.startswith('tff_fedrecgel') for m in sys.modules)}))


if __name__ == '__main__':
    main()
