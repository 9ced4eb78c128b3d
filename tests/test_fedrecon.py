"""FedRecon through TFF's build_fed_recon / build_fed_recon_eval."""

import collections

import numpy as np
import pytest

from tff_fedrecgel import tasks
from tff_fedrecgel import ranking
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import fedrecon
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import Simulation
from tff_fedrecgel.simulation import driver
from tff_fedrecgel.simulation.fedrecgel_adapter import FedRecGEL
from tff_fedrecgel.simulation.fedrecon_adapter import FedRecon

SMALL = neumf.ModelConfig(num_items=300, gmf_dim=4, mlp_dim=4, mlp_layers=(8, 4))


@pytest.fixture(scope='module')
def split():
    return tasks.get_task('synthetic').load_split(num_users=60, num_items=300)


def _small(split):
    return neumf.ModelConfig(num_items=split.num_items, gmf_dim=4, mlp_dim=4,
                             mlp_layers=(8, 4))


def FedReconSimulation(*, split, model_config, clients_per_round, seed, **kwargs):
    """FedRecon over the split, through the one simulation driver."""
    return Simulation(split=split, clients_per_round=clients_per_round, seed=seed,
                      algorithm=FedRecon(model_config=model_config, seed=seed,
                                         clients_per_round=clients_per_round, **kwargs))


@pytest.fixture(scope='module')
def pair(split):
    """Per-user and grouped FedRecon, three rounds each from the same seed."""
    sims = [FedReconSimulation(split=split, model_config=_small(split), clients_per_round=12,
                               seed=1, grouped=grouped, max_group_examples=300)
            for grouped in (False, True)]
    losses = []
    for sim in sims:
        sim.initialize()
        losses.append([sim.run_round() for _ in range(3)])
    return sims, losses


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


def test_rank_metric_matches_ranking_metrics():
    """The Keras rank metric ranks like evaluation.ranking_metrics, ties included."""
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=(7, 12)).astype(np.float32)  # Many ties.
    expected = ranking.ranking_metrics(scores, top_ks=(1, 3, 5))
    for k in (1, 3, 5):
        for kind in ('hr', 'ndcg'):
            metric = fedrecon.RankMetric(k, kind)
            for row in scores:
                metric.update_state(np.eye(1, 12)[0], row)
            np.testing.assert_allclose(
                metric.result().numpy(), expected[f'{kind}@{k}'].numpy().mean(), atol=1e-6)
    assert fedrecon.RankMetric(10, 'ndcg').name == 'ndcg_at_10'
    with pytest.raises(ValueError, match='kind'):
        fedrecon.RankMetric(10, 'map')


def test_fedrecon_round_is_reconstruct_mode_without_sam():
    """TFF's FedRecon = this project's reconstruct mode (mean loss, no SAM).

    Same initial weights, then three rounds on the same batches: the global
    weights agree to float rounding, so the baseline and FedRecGEL differ only
    in what the paper studies (persistent user state and SAM).
    """
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, SMALL.num_items, n).astype(np.int32),
                (rng.random(n) < 0.3).astype(np.float32)) for n in (10, 13, 40, 7)]
    theirs = fedrecon.build_fedrecon_process(model_config=SMALL, init_seed=3)
    ours = fedrecgel.build_round_pieces(
        model_config=SMALL, init_seed=3, client_update=client_update.build_client_update(
            SMALL, fedrecon.matching_client_work(), single_user=True)).process
    state, our_state = theirs.initialize(), ours.initialize()
    assert _max_diff(theirs.get_model_weights(state).trainable,
                     our_state.global_weights) == 0
    for _ in range(3):
        output = theirs.next(state, [fedrecon.train_dataset(*b) for b in batches])
        state = output.state
        our_state, metrics = ours.next(
            our_state, [collections.OrderedDict(items=i, labels=l) for i, l in batches])
        assert _max_diff(theirs.get_model_weights(state).trainable,
                         our_state.global_weights) < 1e-5
        np.testing.assert_allclose(
            output.metrics['client_work']['train']['loss'], metrics['loss'], rtol=1e-5)


def test_grouped_clients_equal_one_user_per_client(pair):
    """Several users per TFF client: same weights and loss as one per client."""
    (per_user, grouped), (per_user_losses, grouped_losses) = pair
    assert max(r['tff_clients'] for r in grouped_losses) > 1  # Really grouped.
    assert min(r['tff_clients'] for r in grouped_losses) < 12
    # Summing users in another order rounds differently; the server Adam's
    # first step, g / (|g| + 1e-8), magnifies that where |g| is near 1e-8
    # (one coordinate in 2,325 here, by 2.6e-5). The rest agree to 1e-6.
    diff = np.concatenate([np.abs(a - b).ravel() for a, b in
                           zip(per_user.global_weights, grouped.global_weights)])
    assert diff.max() < 1e-3
    assert (diff > 1e-6).mean() < 0.005
    for a, b in zip(per_user_losses, grouped_losses):
        np.testing.assert_allclose(a['loss'], b['loss'], rtol=1e-5)


def test_tff_evaluation_equals_fast_evaluation(pair):
    """build_fed_recon_eval (one client per user) = the batched evaluator."""
    grouped = pair[0][1]
    fast = grouped.evaluate('test')
    users = range(grouped.split.num_users)
    federated = grouped.algorithm.evaluate_federated(
        grouped.batches(users, driver.EVAL_ROUND), grouped.split.candidates('test'))
    assert set(federated) == set(fast)
    for name in fast:
        assert abs(fast[name] - federated[name]) < 1e-6, name


def test_checkpoint_state_round_trips(split):
    """get_state / restore continue exactly where the run was."""
    sim = FedReconSimulation(split=split, model_config=_small(split), clients_per_round=12, seed=2)
    sim.initialize()
    sim.run_round()
    saved = sim.get_state()
    after = (sim.run_round()['loss'], sim.global_weights)
    again = FedReconSimulation(split=split, model_config=_small(split), clients_per_round=12, seed=2)
    again.initialize()
    again.restore(saved)
    assert again.round_num == 1
    loss = again.run_round()['loss']
    assert loss == after[0]
    assert _max_diff(again.global_weights, after[1]) == 0
    with pytest.raises(ValueError, match='seed'):
        FedReconSimulation(split=split, model_config=_small(split), clients_per_round=12,
                           seed=3).restore(saved)


@pytest.mark.parametrize('method', ['fedrecon', 'fedmf'])
def test_baseline_learns(split, method):
    """Each new baseline beats its initial model on held-out items."""
    if method == 'fedrecon':
        sim = FedReconSimulation(split=split, model_config=_small(split), clients_per_round=20,
                                 seed=0, server_lr=0.01)
    else:
        config = neumf.ModelConfig(num_items=split.num_items, gmf_dim=8,
                                   use_mlp=False, mlp_layers=())
        sim = Simulation(split=split, clients_per_round=20, seed=0, algorithm=FedRecGEL(
            model_config=config, work=client_update.ClientWorkConfig(),
            num_users=split.num_users, seed=0,
            server_optimizer=fedrecgel.build_server_optimizer(0.01)))
    sim.initialize()
    before = sim.evaluate('test')['hr@10']
    losses = [sim.run_round()['loss'] for _ in range(25)]
    after = sim.evaluate('test')['hr@10']
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, losses
    assert after > before + 0.1, (before, after)


def test_bad_settings():
    with pytest.raises(ValueError, match='reconstruction_steps'):
        fedrecon.build_fedrecon_process(model_config=SMALL, reconstruction_steps=0)
    with pytest.raises(ValueError, match='clients_per_round'):
        fedrecon.build_fedrecon_process(model_config=SMALL, group_size=4)
    with pytest.raises(ValueError, match='non-empty'):
        fedrecon.train_dataset([], [])
    with pytest.raises(ValueError, match='at least one user'):
        fedrecon.group_train_dataset([])
