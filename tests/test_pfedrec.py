"""PFedRec: the client update against a hand-written reference, the round's
average, what the server sees, and learning on a small planted dataset."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import run_settings
from tff_fedrecgel.algorithms import personal_batches
from tff_fedrecgel.recommenders.pfedrec import computation as pfedrec
from tff_types import uploads as _uploads, walk as _walk  # pylint: disable=g-bad-import-order

NUM_ITEMS = 9
CONFIG = pfedrec.PFedRecConfig(latent_dim=4, score_lr=0.3, item_lr_eta=0.05,
                                        batch_size=3, local_epochs=2)


def _reference_user(table, w, b, items, labels, order, config):
    """One user's local round in plain numpy, step by step (float64)."""
    rows = {int(i): table[i].astype(np.float64) for i in np.unique(items)}
    w, b = w.astype(np.float64), float(b)
    item_lr = config.score_lr * len(table) * config.item_lr_eta
    padded = order.reshape(config.local_epochs, -1)
    for epoch in padded:
        epoch = epoch[epoch >= 0]
        for start in range(0, len(epoch), config.batch_size):
            picks = epoch[start:start + config.batch_size]
            e = np.stack([rows[int(items[j])] for j in picks])
            y = labels[picks]
            g = (1 / (1 + np.exp(-(e @ w + b))) - y) / len(picks)
            w, b = w - config.score_lr * g @ e, b - config.score_lr * g.sum()
            g = (1 / (1 + np.exp(-(e @ w + b))) - y) / len(picks)
            grads = collections.defaultdict(float)
            for j, gj in zip(picks, g):
                grads[int(items[j])] = grads[int(items[j])] + gj * w
            for i, grad in grads.items():
                rows[i] = rows[i] - item_lr * grad
    return w, b, rows


def _case(seed=0):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(NUM_ITEMS, CONFIG.latent_dim)).astype(np.float32)
    batches = []
    for length in (7, 4):
        items = rng.integers(0, NUM_ITEMS, length).astype(np.int32)
        batches.append((items, (rng.random(length) < 0.4).astype(np.float32)))
    orders = [personal_batches.epoch_orders(len(i), CONFIG.local_epochs, CONFIG.batch_size, rng)
              for i, _ in batches]
    w = rng.normal(scale=0.5, size=(2, CONFIG.latent_dim)).astype(np.float32)
    b = rng.normal(size=2).astype(np.float32)
    return table, batches, orders, w, b


def _run_update(table, batches, orders, w, b):
    update = pfedrec.make_client_update(NUM_ITEMS, CONFIG)
    data = personal_batches.pack_groups(batches, orders, CONFIG.batch_size)
    out = update(tf.constant(table), collections.OrderedDict(w=tf.constant(w), b=tf.constant(b)),
                 {k: tf.constant(v) for k, v in data.as_struct().items()})
    return data, tf.nest.map_structure(np.asarray, out)


def test_client_update_matches_a_numpy_reference():
    table, batches, orders, w, b = _case()
    data, out = _run_update(table, batches, orders, w, b)
    delta = np.zeros_like(table, np.float64)
    for u, ((items, labels), order) in enumerate(zip(batches, orders)):
        ref_w, ref_b, rows = _reference_user(table, w[u], b[u], items, labels, order, CONFIG)
        np.testing.assert_allclose(out['scores']['w'][u], ref_w, atol=1e-5)
        np.testing.assert_allclose(out['scores']['b'][u], ref_b, atol=1e-5)
        for slot, item in enumerate(data.local_ids[u, :len(rows)]):
            np.testing.assert_allclose(out['offsets'][u, slot], rows[item] - table[item],
                                       atol=1e-5)
            delta[item] += rows[item] - table[item]
        assert len(rows) == len(np.unique(items))
    np.testing.assert_allclose(out['delta'], delta, atol=1e-5)
    assert out['users'] == 2 and out['examples'] == 11 * CONFIG.local_epochs


def test_a_group_computes_what_its_users_compute_alone():
    table, batches, orders, w, b = _case(1)
    _, group = _run_update(table, batches, orders, w, b)
    for u in range(2):
        _, alone = _run_update(table, batches[u:u + 1], orders[u:u + 1], w[u:u + 1], b[u:u + 1])
        np.testing.assert_allclose(group['scores']['w'][u], alone['scores']['w'][0], atol=1e-6)
        n = alone['offsets'].shape[1]
        np.testing.assert_allclose(group['offsets'][u, :n], alone['offsets'][0], atol=1e-6)


def test_the_round_averages_the_users_tables():
    table, batches, orders, w, b = _case(2)
    process = pfedrec.build_pfedrec_process(num_items=NUM_ITEMS, config=CONFIG)
    state = collections.OrderedDict(item_table=table, round_num=np.int32(0))
    clients = [personal_batches.pack_groups([batches[u]], [orders[u]],
                                            CONFIG.batch_size).as_struct() for u in range(2)]
    scores = [collections.OrderedDict(w=w[u:u + 1], b=b[u:u + 1]) for u in range(2)]
    new_state, new_scores, _, metrics = process.next(state, scores, clients)
    user_tables = []
    for u in range(2):
        _, out = _run_update(table, batches[u:u + 1], orders[u:u + 1], w[u:u + 1], b[u:u + 1])
        user_tables.append(table + out['delta'])
        np.testing.assert_allclose(new_scores[u]['w'], out['scores']['w'], atol=1e-6)
    np.testing.assert_allclose(new_state['item_table'], np.mean(user_tables, axis=0), atol=1e-5)
    assert int(new_state['round_num']) == 1 and float(metrics['users']) == 2


def test_the_server_sees_no_per_user_data():
    """Every SERVER-placed type is the item table or a scalar; clients only
    sum the table's change and scalars."""
    process = pfedrec.build_pfedrec_process(num_items=NUM_ITEMS, config=CONFIG)
    table_shape = (NUM_ITEMS, CONFIG.latent_dim)
    server = [t for sig in (process.initialize.type_signature, process.next.type_signature)
              for p, t in _walk(sig) if p == tff.SERVER]
    assert server and all(tuple(t.shape) in (table_shape, ()) for t in server)
    result = process.next.type_signature.result
    assert result[1].placement == tff.CLIENTS and result[2].placement == tff.CLIENTS
    flows = _uploads(process.next)
    assert {uri for uri, _ in flows} == {'federated_sum'}
    shapes = [tuple(t.shape) for _, members in flows for t in members]
    assert table_shape in shapes and set(shapes) <= {table_shape, ()}


def test_the_privacy_check_can_fail():
    """A round summing the score functions at SERVER would be caught."""
    spec = tff.TensorType(np.float32, [1, CONFIG.latent_dim])  # One user's w.

    @tff.federated_computation(tff.FederatedType(spec, tff.CLIENTS))
    def leaky(w):
        return tff.federated_sum(w)

    assert any(tuple(t.shape) != () for _, members in _uploads(leaky) for t in members)


def _simulation(split, algorithm, **overrides):
    settings = run_settings.settings('synthetic', algorithm=algorithm, client_fraction=1.0,
                                     preset='paper', heldout_users=0.1, **overrides)
    simulation = settings.build_simulation(split)
    simulation.initialize()
    return simulation


def test_pfedrec_learns_above_popularity_and_resumes(planted):
    pop = _simulation(planted, 'itempop')
    pop.run_round()
    model = _simulation(planted, 'pfedrec', num_negatives=4)
    before = model.evaluate('test')['hr@10']
    for _ in range(8):
        metrics = model.run_round()
    assert np.isfinite(metrics['loss'])
    after = model.evaluate('test')
    assert after['hr@10'] > pop.evaluate('test')['hr@10'] + 0.2
    assert after['hr@10'] > before + 0.1
    full = model.evaluate('test', protocol='full')
    assert 0 <= full['mrr'] <= 1 and 'ndcg@10' in full
    heldout = model.evaluate('test', heldout=True)
    assert 0 <= heldout['hr@10'] <= 1
    state = model.get_state()
    again = _simulation(planted, 'pfedrec', num_negatives=4)
    again.restore(state)
    assert again.evaluate('test') == after
    assert again.evaluate('test', heldout=True) == heldout


def test_settings_it_does_not_take_are_refused():
    with pytest.raises(ValueError, match='pfedrec does not take local_lr'):
        run_settings.settings('synthetic', algorithm='pfedrec', local_lr=0.2)


def test_the_peers_plan_runs_each_peer_under_its_authors_settings():
    from tff_fedrecgel.launch import peers_study  # pylint: disable=g-import-not-at-top

    runs = peers_study.peers_plan(datasets=['filmtrust'], methods=['pfedrec'], seeds=2)
    assert [r.name for r in runs] == [
        'filmtrust/history_seed0', 'filmtrust/itempop_seed0', 'filmtrust/peer_pfedrec_seed0',
        'filmtrust/history_seed1', 'filmtrust/itempop_seed1', 'filmtrust/peer_pfedrec_seed1']
    flags = runs[2].flags('/data')
    assert '--algorithm=pfedrec' in flags and '--client_fraction=1' in flags
    assert '--heldout_users=0.1' in flags and '--validation' in flags
    every = peers_study.peers_plan(datasets=['filmtrust'], seeds=1)
    assert {r.method for r in every} == {*peers_study.FLOORS, *peers_study.PEER_SETTINGS,
                                         peers_study.CONTROL_METHOD}
    assert '--client_fraction=1' in next(r for r in every if r.method == 'gpfedrec').flags('/d')
    with pytest.raises(ValueError, match='no peer settings for fedrecgel'):
        peers_study.peers_plan(methods=['fedrecgel'])


def test_per_user_full_ranks_agree_with_the_shared_score_path():
    """Per-user scores that happen to be equal rank as one shared score vector."""
    from tff_fedrecgel import full_ranking  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import ranking  # pylint: disable=g-import-not-at-top

    rng = np.random.default_rng(4)
    scores = rng.random(30).astype(np.float32)
    heldout = np.array([3, 7, 11, 0])
    indptr, items = np.array([0, 2, 3, 6, 6]), np.array([1, 3, 5, 2, 7, 9])
    ranks = full_ranking.ranks_from_scores(np.tile(scores, (4, 1)), heldout, (indptr, items))
    shared = full_ranking.evaluate_item_scores(scores, heldout, (indptr, items))
    per_user = ranking.metrics_from_ranks(ranks, mrr=True)
    for key, value in shared.items():
        assert float(np.mean(per_user[key])) == pytest.approx(value)
    # User 0: every item but its training item 1 and its target 3, at least as high.
    assert ranks[0] == int(np.sum(np.delete(scores, [1, 3]) >= scores[3]))
