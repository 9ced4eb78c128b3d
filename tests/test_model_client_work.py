"""FedRecGEL on TFF's ReconstructionModel: any partially local model.

NeuMF wrapped as a `tff.learning.models.ReconstructionModel` and trained by
the model client work (the Keras SAM optimizer on the model's variables)
gives the numbers of the fast path that knows NeuMF's structure, one client
update and three whole rounds; a biased matrix factorization, a model the
fast path knows nothing of, learns through `build_fedrecgel_process`.
"""

import collections
import dataclasses
import functools
import pathlib
import runpy

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import algorithm_config
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import model_client_work
from tff_fedrecgel.models import neumf

CONFIG = neumf.ModelConfig(num_items=20, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
ATOL = 1e-5
MODES = [(state, update) for state in algorithm_config.LOCAL_STATES
         for update in algorithm_config.UPDATE_MODES]


def _work(local_state, update, **overrides):
    settings = dict(rho_sh=0.05, rho_ns=0.1, local_lr=0.1, chunk_size=16, local_epochs=2,
                    client_lr=0.05, reconstruction_steps=3)
    return client_update.ClientWorkConfig(local_state=local_state, update=update,
                                          **{**settings, **overrides})


def _inputs(seed, n=40):
    rng = np.random.default_rng(seed)
    model = neumf.NeuMF(CONFIG, seed=seed)
    global_weights = [(v.numpy() + rng.normal(scale=0.3, size=v.shape)).astype(np.float32)
                      for v in model.global_variables]
    local = [rng.normal(scale=0.3, size=v.shape).astype(np.float32)
             for v in model.local_variables]
    state = client_update.ClientState(
        local_weights=local, adam_step=np.int32(3),
        adam_m=[rng.normal(scale=0.01, size=w.shape).astype(np.float32) for w in local],
        adam_v=[rng.uniform(1e-5, 1e-4, size=w.shape).astype(np.float32) for w in local])
    items = rng.integers(0, CONFIG.num_items, size=n).astype(np.int32)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    return global_weights, state, items, labels


def _assert_close(a, b):
    flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=ATOL, rtol=0)


@pytest.mark.parametrize('local_state,update', MODES)
def test_neumf_as_a_reconstruction_model_gives_the_fast_paths_update(local_state, update):
    work = _work(local_state, update)
    model_fn = functools.partial(neumf.build_reconstruction_model, CONFIG, seed=0)
    generic = model_client_work.build_model_client_update(model_fn, work)
    fast = client_update.build_client_update(CONFIG, work, single_user=True)
    weights, state, items, labels = _inputs(1)
    ours = generic.fn(weights, state, (items, labels))
    theirs = fast.fn(weights, state, collections.OrderedDict(items=items, labels=labels))
    assert list(ours) == list(theirs)
    assert float(ours['metrics']['sam_loss_global']) != pytest.approx(
        float(ours['metrics']['loss']))  # SAM moved the point.
    _assert_close(ours, theirs)


def test_fedmf_is_the_builder_on_a_gmf_only_reconstruction_model():
    """FedMF: `build_fedrecgel_process` on the GMF-only model, equal to the fast path."""
    config = dataclasses.replace(CONFIG, use_mlp=False, mlp_layers=())
    work = _work('persistent', 'gradient')
    ours = fedrecgel.build_fedrecgel_process(
        functools.partial(neumf.build_reconstruction_model, config, seed=4), work=work)
    theirs = fedrecgel.build_round_pieces(
        model_config=config, init_seed=4,
        client_update=client_update.build_client_update(config, work, single_user=True)).process
    rng = np.random.default_rng(5)
    data = [(rng.integers(0, config.num_items, n).astype(np.int32),
             (rng.random(n) < 0.3).astype(np.float32)) for n in (12, 30)]
    states = [model_client_work.initial_client_state(
        functools.partial(neumf.build_reconstruction_model, config, seed=s)) for s in (1, 2)]
    our_state, our_clients, _ = ours.next(ours.initialize(), states, data)
    their_state, their_clients, _ = theirs.next(
        theirs.initialize(), states, [collections.OrderedDict(items=i, labels=l) for i, l in data])
    assert [np.shape(w) for w in our_state.global_weights] == [(20, 4), (4, 1), (1,)]
    _assert_close(our_state.global_weights, their_state.global_weights)
    _assert_close(our_clients, their_clients)


@pytest.mark.parametrize('update', algorithm_config.UPDATE_MODES)
def test_adaptive_sam_is_the_same_on_both_paths_and_not_plain_sam(update):
    """FedASAM's client work (ASAM on the global part) through either form."""
    work = _work('persistent', update, rho_sh=0.7, rho_ns=0.0, sam_eta=0.2)
    model_fn = functools.partial(neumf.build_reconstruction_model, CONFIG, seed=0)
    weights, state, items, labels = _inputs(2)
    batch = collections.OrderedDict(items=items, labels=labels)
    ours = model_client_work.build_model_client_update(model_fn, work).fn(
        weights, state, (items, labels))
    theirs = client_update.build_client_update(CONFIG, work, single_user=True).fn(
        weights, state, batch)
    _assert_close(ours, theirs)
    plain = client_update.build_client_update(
        CONFIG, dataclasses.replace(work, sam_eta=None), single_user=True).fn(
            weights, state, batch)
    assert not np.allclose(np.asarray(plain['update'][0]), np.asarray(theirs['update'][0]),
                           atol=1e-6)


def test_three_rounds_of_the_composed_process_match_the_fast_path():
    work = _work('persistent', 'gradient')
    model_fn = functools.partial(neumf.build_reconstruction_model, CONFIG, seed=3)
    ours = fedrecgel.build_fedrecgel_process(model_fn, work=work)
    theirs = fedrecgel.build_round_pieces(
        model_config=CONFIG, init_seed=3,
        client_update=client_update.build_client_update(CONFIG, work, single_user=True)).process
    # The same server state; a client's batch is the model's input_spec.
    assert ours.initialize.type_signature.is_equivalent_to(theirs.initialize.type_signature)
    rng = np.random.default_rng(0)
    data = [(rng.integers(0, CONFIG.num_items, n).astype(np.int32),
             (rng.random(n) < 0.3).astype(np.float32)) for n in (10, 33, 7)]
    states = [_inputs(seed)[1] for seed in range(len(data))]
    our_state, their_state = ours.initialize(), theirs.initialize()
    _assert_close(our_state.global_weights, their_state.global_weights)
    our_clients = their_clients = states
    for _ in range(3):
        our_state, our_clients, our_metrics = ours.next(our_state, our_clients, data)
        their_state, their_clients, their_metrics = theirs.next(
            their_state, their_clients,
            [collections.OrderedDict(items=i, labels=l) for i, l in data])
        _assert_close(our_state.global_weights, their_state.global_weights)
        _assert_close(our_clients, their_clients)
        assert our_metrics['loss'] == pytest.approx(their_metrics['loss'], abs=ATOL)


# ---------------------------------------------------------------------------
# A model the fast path does not know: docs/API.md's biased matrix
# factorization, run as the docs write it.

API_DOC = pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'API.md'


@pytest.fixture(scope='module')
def doc_example(tmp_path_factory):
    text = API_DOC.read_text()
    section = text[text.index('## FedRecGEL on your own partially local model'):]
    start = section.index('```python\n') + len('```python\n')
    script = tmp_path_factory.mktemp('doc') / 'biased_mf.py'  # AutoGraph reads files.
    script.write_text(section[start:section.index('\n```', start)])
    return runpy.run_path(str(script))


@pytest.mark.parametrize('local_state', algorithm_config.LOCAL_STATES)
def test_the_docs_biased_matrix_factorization_learns(doc_example, local_state):
    model_fn, user_batch = doc_example['biased_mf'], doc_example['user_batch']
    process = doc_example['process']
    if local_state == 'reconstruct':
        process = fedrecgel.build_fedrecgel_process(
            model_fn, work=dataclasses.replace(doc_example['WORK'], local_state=local_state),
            server_optimizer=tff.learning.optimizers.build_adam(learning_rate=0.1))
    server = process.initialize()
    # Only the global part is server state: the item vectors and biases.
    num_items, dim = doc_example['NUM_ITEMS'], doc_example['DIM']
    assert [w.shape for w in server.global_weights] == [(num_items, dim), (num_items, 1)]
    users = doc_example['users']
    data = [user_batch(u) for u in users]
    states = [model_client_work.initial_client_state(model_fn) for _ in users]
    losses = []
    for _ in range(30):
        if local_state == 'persistent':
            server, states, metrics = process.next(server, states, data)
        else:
            server, metrics = process.next(server, data)
        losses.append(float(metrics['loss']))
    assert np.isfinite(losses).all()
    # The summed chunk means start near chance (2 x 0.69); the clusters are learned.
    assert losses[-1] < 0.6 * losses[0], losses
    if local_state == 'persistent':
        vectors = np.stack([np.asarray(s.local_weights[0])[0] for s in states])
        assert not np.allclose(vectors[0], vectors[1])  # Each user its own.
