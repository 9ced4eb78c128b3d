"""The simulation driver: sampling, held-out users, evaluation, state."""

import numpy as np
import pytest

from tff_fedrecgel import tasks
from tff_fedrecgel import evaluation
from tff_fedrecgel import simulation
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.data.client_data import heldout_users_for
from tff_fedrecgel.simulation import driver

WORK = client_update.ClientWorkConfig(rho_sh=0.01, rho_ns=0.02, reconstruction_steps=3)


@pytest.fixture(scope='module')
def split():
    return tasks.get_task('synthetic').load_split(num_users=80, num_items=120)


def test_heldout_users_are_fixed_by_the_data_and_sized_by_the_fraction():
    first = heldout_users_for(1000, 0.1)
    assert len(first) == 100 and len(set(first.tolist())) == 100
    np.testing.assert_array_equal(first, heldout_users_for(1000, 0.1))
    assert len(heldout_users_for(1000, 0.0)) == 0
    for bad in (-0.1, 1.0, float('nan')):
        with pytest.raises(ValueError, match='held-out fraction'):
            heldout_users_for(10, bad)


@pytest.mark.parametrize('method', ['fedrecgel', 'fedrecon', 'fedmf'])
def test_heldout_users_never_train_and_are_evaluated_rebuilt(split, method):
    sim = simulation.build_simulation(split=split, method=method, work=WORK,
                                      clients_per_round=30, seed=1, heldout_fraction=0.25)
    heldout = set(sim.heldout_users.tolist())
    assert len(heldout) == 20 and len(sim.train_users) == 60
    sim.initialize()
    stored = sim.algorithm.local_tables()
    before = None if stored is None else [t.copy() for t in stored]
    for round_num in range(1, 4):
        assert not heldout & set(sim.sample_clients(round_num))
        sim.run_round()
    if before is not None:  # Persistent state: held-out rows never change.
        rows = sorted(heldout)
        for old, new in zip(before, sim.algorithm.local_tables()):
            np.testing.assert_array_equal(old[rows], new[rows])
    metrics = sim.evaluate('test', heldout=True)
    # The same numbers from the pieces: rebuild, then the batched evaluator.
    rebuilt = evaluation.reconstruct_local_tables(
        sim.algorithm.model_config, sim.algorithm.reconstruction, sim.global_weights,
        sim.batches(sim.heldout_users, driver.EVAL_ROUND))
    expected = evaluation.evaluate_users(
        sim.algorithm.model_config, sim.global_weights, rebuilt,
        split.candidates('test')[sim.heldout_users])
    assert metrics == pytest.approx(dict(expected), abs=1e-7)
    train = sim.evaluate('test')
    assert set(train) == set(metrics)


def test_no_heldout_users_keeps_the_population_and_refuses_heldout_evaluation(split):
    sim = simulation.build_simulation(split=split, method='fedncf', work=WORK,
                                      clients_per_round=80, seed=0)
    sim.initialize()
    assert sorted(sim.sample_clients(1)) == list(range(80))
    with pytest.raises(ValueError, match='holds no users out'):
        sim.evaluate(heldout=True)
    with pytest.raises(ValueError, match='clients_per_round'):
        simulation.build_simulation(split=split, method='fedncf', work=WORK,
                                    clients_per_round=61, heldout_fraction=0.25)
