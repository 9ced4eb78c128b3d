"""A group of users in one TFF client equals its users one by one.

Eager checks on a tiny model compare a group's upload and new states with
the same client update run user by user (the one-user device form); an
end-to-end check runs a few FilmTrust rounds both ways.
"""

import collections
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.data import batching
from tff_fedrecgel.models import neumf

CONFIG = neumf.ModelConfig(num_items=30, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
# Local Adam divides by sqrt(v): on near-zero gradients float rounding of a
# differently ordered sum is amplified, so local weights get a looser bound.
LOCAL_ATOL = 1e-4


def _setup(seed, lengths, nan_user=None):
    rng = np.random.default_rng(seed)
    model = neumf.NeuMF(CONFIG, seed=seed)
    global_weights = [
        (v.numpy() + rng.normal(scale=0.3, size=v.shape)).astype(np.float32)
        for v in model.global_variables]
    states, batches = [], []
    for u, n in enumerate(lengths):
        local = [rng.normal(scale=0.3, size=v.shape).astype(np.float32)
                 for v in model.local_variables]
        states.append(collections.OrderedDict(
            local_weights=local, adam_step=np.int32(u % 3),
            adam_m=[rng.normal(scale=0.01, size=w.shape).astype(np.float32) for w in local],
            adam_v=[rng.uniform(1e-5, 1e-4, size=w.shape).astype(np.float32) for w in local]))
        # Few items, so a user repeats items and users share rows.
        items = rng.integers(0, 8, size=n).astype(np.int32)
        labels = (rng.random(n) < 0.3).astype(np.float32)
        if u == nan_user:
            labels[1] = np.nan
        batches.append((items, labels))
    return global_weights, states, batches


def _stack(states):
    return collections.OrderedDict(
        local_weights=[np.concatenate([s['local_weights'][k] for s in states]) for k in range(2)],
        adam_step=np.array([s['adam_step'] for s in states], np.int32),
        adam_m=[np.concatenate([s['adam_m'][k] for s in states]) for k in range(2)],
        adam_v=[np.concatenate([s['adam_v'][k] for s in states]) for k in range(2)])


def _as_dicts(out):
    if 'client_state' in out:
        out['client_state'] = out['client_state']._asdict()
    return out


def _compare(work, lengths, nan_user=None, seed=0):
    global_weights, states, batches = _setup(seed, lengths, nan_user)
    single = client_update.build_client_update(CONFIG, work, single_user=True).fn
    outs = [_as_dicts(single(global_weights, s, collections.OrderedDict(items=i, labels=l)))
            for s, (i, l) in zip(states, batches)]
    group = _as_dicts(client_update.build_client_update(CONFIG, work).fn(
        global_weights, _stack(states), batching.pad_batches(batches)._asdict()))
    persistent = work.local_state == 'persistent'

    weights = np.array([float(o['weight']) for o in outs])
    expected = [sum(w * o['update'][k].numpy() for w, o in zip(weights, outs)) / weights.sum()
                for k in range(len(global_weights))]
    assert float(group['weight']) == pytest.approx(weights.sum())
    assert int(group['dropped']) == sum(int(o['dropped']) for o in outs)
    assert int(group['users']) == len(lengths)
    for got, want in zip(group['update'], expected):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-6, rtol=1e-5)
    for u, out in enumerate(outs if persistent else []):
        for k in range(2):
            np.testing.assert_allclose(
                group['client_state']['local_weights'][k].numpy()[u],
                out['client_state']['local_weights'][k].numpy()[0], atol=LOCAL_ATOL)
            np.testing.assert_allclose(
                group['client_state']['adam_v'][k].numpy()[u],
                out['client_state']['adam_v'][k].numpy()[0], rtol=1e-4, atol=1e-9)
        assert int(group['client_state']['adam_step'][u]) == int(
            out['client_state']['adam_step'])
    kept = [o for o in outs if int(o['dropped']) == 0]
    for name in ('loss', 'sam_loss_global', 'sam_loss_local', 'num_examples'):
        want = np.mean([float(o['metrics'][name]) for o in kept])
        assert float(group['metrics'][name]) == pytest.approx(want, rel=1e-5)
    return group, outs


@pytest.mark.parametrize('rho_sh, rho_ns', [(0.0, 0.0), (0.05, 0.0), (0.0, 0.1), (0.05, 0.1)])
def test_group_equals_users_one_by_one(rho_sh, rho_ns):
    """Upload, states and metrics equal those of one user per client."""
    _compare(client_update.ClientWorkConfig(rho_sh=rho_sh, rho_ns=rho_ns, chunk_size=8),
             lengths=[20, 7, 13, 1])


def test_group_with_mean_loss_and_example_weighting():
    """The 'mean' loss and per-example weighting also match."""
    _compare(client_update.ClientWorkConfig(
        rho_sh=0.05, rho_ns=0.1, loss_reduction='mean', client_weighting='num_examples'),
        lengths=[9, 17, 4])


def test_non_finite_user_is_dropped_alone():
    """A user with a NaN label is dropped; the others' mean is uploaded."""
    group, outs = _compare(client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.1),
                           lengths=[10, 12, 6], nan_user=1)
    assert int(group['dropped']) == 1
    assert all(np.isfinite(u.numpy()).all() for u in group['update'])


@pytest.mark.parametrize('local_state, update', [
    ('reconstruct', 'gradient'), ('persistent', 'model_delta'), ('reconstruct', 'model_delta')])
def test_other_modes_also_equal_users_one_by_one(local_state, update):
    """Reconstruction and local epochs also run per user inside a group."""
    group, _ = _compare(client_update.ClientWorkConfig(
        rho_sh=0.05, rho_ns=0.1, chunk_size=8, local_state=local_state, update=update,
        local_epochs=2, client_lr=0.05, reconstruction_steps=3), lengths=[20, 7, 13, 1])
    assert ('client_state' in group) == (local_state == 'persistent')


def _datasets():
    return pathlib.Path(os.environ.get(
        'FEDRECGEL_DATASETS',
        pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'datasets'))


def test_vectorized_rounds_equal_per_user_rounds_on_filmtrust():
    """Three FilmTrust rounds (122 users each, both radii on): same results."""
    from tff_fedrecgel import tasks
    from tff_fedrecgel import simulation as simulation_lib

    folder = _datasets() / 'filmtrust'
    if not folder.exists():
        pytest.skip(f'{folder} is absent (set FEDRECGEL_DATASETS)')
    split = tasks.get_task('filmtrust').load_split(data_dir=folder)
    work = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.02)
    results = {}
    # A small group budget splits the cohort over several TFF clients.
    for vectorized, budget in ((False, 65536), (True, 4096)):
        simulation = simulation_lib.build_simulation(
            split=split, method='fedrecgel', work=work, clients_per_round=122,
            seed=3, users_per_client=None if vectorized else 1, max_group_examples=budget)
        simulation.initialize()
        metrics = [simulation.run_round() for _ in range(3)]
        results[vectorized] = (simulation.global_weights,
                               simulation.local_tables(),
                               metrics, simulation.evaluate())
    (g0, l0, m0, e0), (g1, l1, m1, e1) = results[False], results[True]
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for a, b in zip(l0, l1):
        # Adam (lr 0.1) turns rounding of near-cancelling gradients into
        # visible steps on a handful of coordinates; all else agrees to 1e-5.
        assert np.mean(np.abs(a - b) > 1e-5) < 1e-3
        np.testing.assert_allclose(a, b, atol=1e-3)
    for r0, r1 in zip(m0, m1):
        for key in r0:
            if 'seconds' not in key:
                assert r1[key] == pytest.approx(r0[key], abs=1e-5), key
    for key in e0:
        assert e1[key] == pytest.approx(e0[key], abs=1e-5), key


@pytest.mark.parametrize('sam_eta', [None, 0.2])
def test_the_device_form_of_local_epochs_traces(sam_eta):
    """FedSAM's and FedASAM's one-user form builds as a graph (the TFF
    computation traces it) and computes what it computes eagerly."""
    work = client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.0, chunk_size=8,
                                          update='model_delta', local_epochs=2,
                                          client_lr=0.05, sam_eta=sam_eta)
    global_weights, states, batches = _setup(0, [20, 7], None)
    fn = client_update.build_client_update(CONFIG, work, single_user=True).fn
    items, labels = batches[0]
    args = (global_weights, states[0], collections.OrderedDict(items=items, labels=labels))
    traced, eager = tf.function(fn)(*args), fn(*args)
    for got, want in zip(traced['update'], eager['update']):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
