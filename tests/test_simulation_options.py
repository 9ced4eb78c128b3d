"""The simulation's server optimizer and training negatives options."""

import numpy as np
import tensorflow_federated as tff

import pytest

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.simulation import build_simulation


def _simulation(**kwargs):
    split = preprocess.build_split(synthetic.generate_synthetic(
        synthetic.SyntheticConfig(num_users=40, num_items=160,
                                  mean_interactions=8)))
    simulation = build_simulation(
        split=split, method='fedncf', work=client_update.ClientWorkConfig(),
        clients_per_round=8, seed=0, **kwargs)
    simulation.initialize()
    return simulation


def test_server_optimizer_replaces_the_default_adam():
    # SGD at rate 0 leaves the global model as initialized; Adam moves it.
    frozen = _simulation(server_optimizer=tff.learning.optimizers.build_sgdm(
        learning_rate=0.0))
    start = frozen.global_weights
    frozen.run_round()
    for a, b in zip(start, frozen.global_weights):
        np.testing.assert_array_equal(a, b)
    adam = _simulation()
    adam.run_round()
    assert not np.array_equal(adam.global_weights[0], start[0])


def test_num_negatives_sets_the_batch_size():
    four = _simulation().run_round()['examples_per_client']
    two = _simulation(num_negatives=2).run_round()['examples_per_client']
    np.testing.assert_allclose(two, four * 3 / 5, rtol=1e-6)


def test_server_optimizers_by_name():
    for name in ('adam', 'yogi', 'adagrad', 'sgdm', 'sgd'):
        assert fedrecgel.build_server_optimizer(0.01, name) is not None
    with pytest.raises(ValueError, match='server_optimizer must be one of'):
        fedrecgel.build_server_optimizer(0.01, 'lamb')
    with pytest.raises(ValueError, match='server_lr must be a finite number'):
        fedrecgel.build_server_optimizer(float('nan'))
