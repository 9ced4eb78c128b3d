"""Tests of the NeuMF model (docs/ALGORITHM.md, "The model")."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrecgel.models import neumf

TINY = neumf.ModelConfig(num_items=20, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))


def _values(variables):
    return [v.numpy() for v in variables]


@pytest.fixture(scope='module')
def default_model():
    return neumf.NeuMF(neumf.ModelConfig(num_items=1000), seed=3)


def test_default_global_parameter_count(default_model):
    """The global part has 160 * num_items + 43,297 floats (docs/ALGORITHM.md)."""
    counted = sum(int(np.prod(v.shape))
                  for v in default_model.global_variables)
    assert counted == 160 * 1000 + 43_297
    assert default_model.config.num_global_params() == counted
    for num_items in (1, 7, 11_830):
        config = neumf.ModelConfig(num_items=num_items)
        assert config.num_global_params() == 160 * num_items + 43_297


def test_default_shapes_and_local_part(default_model):
    """Local part is the two user rows; the tower is 256-128-64-32 -> 1."""
    shapes = [tuple(v.shape) for v in default_model.global_variables]
    assert shapes == [
        (1000, 32), (1000, 128), (256, 128), (128,), (128, 64), (64,),
        (64, 32), (32,), (64, 1), (1,),
    ]
    assert [tuple(v.shape) for v in default_model.local_variables] == [
        (1, 32), (1, 128)]
    global_ids = {id(v) for v in default_model.global_variables}
    local_ids = {id(v) for v in default_model.local_variables}
    all_ids = {id(v) for v in default_model.trainable_variables}
    assert not global_ids & local_ids
    assert global_ids | local_ids == all_ids


def test_initializer_statistics(default_model):
    """Embeddings N(0, 0.01^2), prediction kernel in +-sqrt(3/64), biases 0."""
    model = default_model
    for table in (model.item_gmf.embeddings, model.item_mlp.embeddings):
        values = table.numpy()
        assert abs(values.mean()) < 1e-3
        assert values.std() == pytest.approx(0.01, rel=0.05)
    kernel = model.prediction.kernel.numpy()
    limit = math.sqrt(3 / 64)
    assert np.all(np.abs(kernel) <= limit)
    # Uniform on [-limit, limit]: the spread is close to the limit.
    assert np.abs(kernel).max() > 0.7 * limit
    assert kernel.std() == pytest.approx(limit / math.sqrt(3), rel=0.35)
    for layer in model.tower:
        fan_in, fan_out = layer.kernel.shape
        glorot = math.sqrt(6 / (fan_in + fan_out))
        assert np.all(np.abs(layer.kernel.numpy()) <= glorot)
        assert np.abs(layer.kernel.numpy()).max() > 0.9 * glorot
        np.testing.assert_array_equal(layer.bias.numpy(), 0.0)
    np.testing.assert_array_equal(model.prediction.bias.numpy(), 0.0)


def test_gmf_only_variant():
    """use_mlp=False, mlp_layers=() gives a GMF-only model, no MLP weights."""
    config = neumf.ModelConfig(num_items=15, gmf_dim=6, use_mlp=False,
                               mlp_layers=())
    model = neumf.NeuMF(config, seed=1)
    assert [tuple(v.shape) for v in model.global_variables] == [
        (15, 6), (6, 1), (1,)]
    assert [tuple(v.shape) for v in model.local_variables] == [(1, 6)]
    assert len(model.variables) == 4
    assert not model.tower and not hasattr(model, 'item_mlp')
    assert config.num_global_params() == 15 * 6 + 6 + 1
    items = tf.constant([0, 3, 14], tf.int32)
    logits = model(items).numpy()
    user = model.user_gmf.embedding.numpy()[0]
    item = model.item_gmf.embeddings.numpy()[[0, 3, 14]]
    expected = (user * item) @ model.prediction.kernel.numpy()[:, 0]
    np.testing.assert_allclose(logits, expected, atol=1e-7)


def test_mlp_config_requires_layers():
    """The MLP branch without layers is rejected."""
    with pytest.raises(ValueError):
        neumf.ModelConfig(num_items=5, mlp_layers=())
    with pytest.raises(ValueError):
        neumf.ModelConfig(num_items=0)


def test_seed_reproducibility():
    """The same seed gives the same weights; another seed different ones."""
    a = _values(neumf.NeuMF(TINY, seed=7).variables)
    b = _values(neumf.NeuMF(TINY, seed=7).variables)
    c = _values(neumf.NeuMF(TINY, seed=8).variables)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    differing = [not np.array_equal(x, z) for x, z in zip(a, c) if x.any()]
    assert differing and all(differing)


def test_forward_matches_numpy():
    """The Keras forward pass is NeuMF: prediction(concat(GMF, MLP tower))."""
    model = neumf.NeuMF(TINY, seed=2)
    items = np.array([0, 5, 5, 19], np.int32)
    w = _values(model.global_variables)
    user_gmf, user_mlp = (v.numpy()[0] for v in model.local_variables)
    gmf = user_gmf * w[0][items]
    hidden = np.concatenate([np.tile(user_mlp, (4, 1)), w[1][items]], axis=1)
    for kernel, bias in ((w[2], w[3]), (w[4], w[5])):
        hidden = np.maximum(hidden @ kernel + bias, 0.0)
    expected = np.concatenate([gmf, hidden], axis=1) @ w[6][:, 0] + w[7][0]
    np.testing.assert_allclose(model(items).numpy(), expected, atol=1e-6)


def test_score_items_matches_keras_model():
    """score_items gives each user's Keras logits to 1e-6."""
    model = neumf.NeuMF(TINY, seed=4)
    rng = np.random.default_rng(0)
    num_users = 3
    # Larger than the 0.01 init so the MLP is clearly active.
    tables = [rng.normal(scale=0.5, size=(num_users, d)).astype(np.float32)
              for d in (TINY.gmf_dim, TINY.mlp_dim)]
    global_weights = [v.numpy() + rng.normal(scale=0.3, size=v.shape)
                      .astype(np.float32) for v in model.global_variables]
    for var, value in zip(model.global_variables, global_weights):
        var.assign(value)
    items = rng.integers(0, TINY.num_items, size=(num_users, 6)).astype(
        np.int32)
    scores = neumf.score_items(TINY, global_weights, tables, items).numpy()
    assert scores.shape == (num_users, 6)
    for user in range(num_users):
        for var, table in zip(model.local_variables, tables):
            var.assign(table[user:user + 1])
        np.testing.assert_allclose(scores[user], model(items[user]).numpy(),
                                   atol=1e-6)
    assert np.ptp(scores) > 1e-2  # Not trivially constant.


def test_score_items_gmf_only():
    """score_items also matches the GMF-only model."""
    config = neumf.ModelConfig(num_items=9, gmf_dim=3, use_mlp=False,
                               mlp_layers=())
    model = neumf.NeuMF(config, seed=5)
    rng = np.random.default_rng(1)
    table = rng.normal(size=(2, 3)).astype(np.float32)
    items = np.array([[0, 8, 4], [1, 1, 2]], np.int32)
    scores = neumf.score_items(
        config, _values(model.global_variables), [table], items).numpy()
    for user in range(2):
        model.user_gmf.embedding.assign(table[user:user + 1])
        np.testing.assert_allclose(scores[user], model(items[user]).numpy(),
                                   atol=1e-6)


def test_reconstruction_model_local_and_global_split():
    """Exactly the user embeddings are local; everything else is global."""
    recon = neumf.build_reconstruction_model(TINY, seed=1)
    # The same seed identifies every variable by its initial value.
    reference = neumf.NeuMF(TINY, seed=1)
    local = recon.local_trainable_variables
    assert len(local) == 2
    for var, ref in zip(local, reference.local_variables):
        np.testing.assert_array_equal(var.numpy(), ref.numpy())
    global_vars = recon.global_trainable_variables
    assert len(global_vars) == len(reference.global_variables)
    for var, ref in zip(global_vars, reference.global_variables):
        np.testing.assert_array_equal(var.numpy(), ref.numpy())
    assert sum(int(np.prod(v.shape)) for v in global_vars) == (
        TINY.num_global_params())
    assert not recon.local_non_trainable_variables
    assert not recon.global_non_trainable_variables
