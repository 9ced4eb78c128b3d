"""The simulation's server optimizer and training negatives options."""

import numpy as np
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_work
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import FedRecSimulation


def _simulation(**kwargs):
    split = preprocess.build_split(synthetic.generate_synthetic(
        synthetic.SyntheticConfig(num_users=40, num_items=160,
                                  mean_interactions=8)))
    config = neumf.ModelConfig(num_items=split.num_items, gmf_dim=4, mlp_dim=8,
                               mlp_layers=(8, 4))
    simulation = FedRecSimulation(
        split=split, model_config=config, work=client_work.ClientWorkConfig(),
        clients_per_round=8, seed=0, vectorized=True, **kwargs)
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
