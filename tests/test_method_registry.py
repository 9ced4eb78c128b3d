"""The method registry: each method is one `methods.Method`, and a new one is
its adapter plus one registration line.

A method this project does not have (items ranked by a fixed random score)
is registered here with one line and trained and evaluated through the run
settings and the simulation builder, which know nothing of it; what it does
not take is refused from its spec.
"""

import importlib

import numpy as np
import pytest

from tff_fedrecgel import methods
from tff_fedrecgel import recipes
from tff_fedrecgel import run_settings
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic


class RandomScores:
    """Ranks items by a fixed random score: the driver's `Algorithm` interface."""

    def __init__(self, model_config, work, seed):
        self.model_config = model_config
        self.reconstruction = work
        self.item_scores = np.random.default_rng(seed).random(model_config.num_items)
        self.rounds = 0

    def initialize(self):
        self.rounds = 0

    def next(self, users, batches):
        del batches
        self.rounds += 1
        return {'clients': float(len(users))}

    @property
    def global_weights(self):
        return [self.item_scores]

    def local_tables(self):
        return None

    def get_state(self):
        return [np.asarray(self.rounds)]

    def restore(self, state):
        self.rounds = int(state[0])


def build_random_scores(method, context):
    assert method.name == 'random_scores'
    return RandomScores(context.model_config, context.work, context.seed)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(methods.METHODS, 'random_scores', methods.Method(
        'random_scores', 'random scores', 'items by a fixed random score', rho_sh=0.0,
        rho_ns=0.0,
        builder=f'{__name__}:build_random_scores', takes=frozenset(), private=False,
        exports=False, tunable=False))


def test_a_new_method_trains_and_evaluates_from_its_registration(registered):
    del registered
    split = preprocess.build_split(synthetic.generate_synthetic(
        num_users=30, num_items=60, mean_interactions=8, seed=0), num_negatives=20)
    settings = run_settings.settings('synthetic', algorithm='random_scores',
                                     total_rounds=2, preset='paper')
    simulation = settings.build_simulation(split)
    simulation.initialize()
    assert simulation.run_round()['clients'] == settings.cohort(split.num_users)
    metrics = simulation.evaluate('test')
    assert 0.0 <= metrics['hr@10'] <= 1.0
    # What it does not take is refused from its spec, with the settings' names.
    with pytest.raises(ValueError, match='random_scores does not take local_lr'):
        run_settings.settings('synthetic', algorithm='random_scores', local_lr=0.2)


@pytest.mark.parametrize('name,refused', [
    ('fedrecgel', ['lr_scale']),
    ('fedmf', ['lr_scale']),
    ('fedsam', ['update', 'lr_scale']),
    ('fedasam', ['update', 'lr_scale']),
    ('fedrecon', ['server_optimizer', 'local_state', 'loss_reduction', 'update',
                  'local_epochs', 'client_lr', 'client_weighting', 'sharpness_probe',
                  'workers', 'lr_scale']),
    ('central', ['rho_sh', 'rho_ns', 'server_lr', 'server_optimizer', 'local_state',
                 'loss_reduction', 'update', 'local_epochs', 'client_lr',
                 'client_weighting', 'sharpness_probe', 'workers']),
    ('pfedrec', ['rho_sh', 'rho_ns', 'local_lr', 'server_lr', 'server_optimizer',
                 'local_state', 'reconstruction_steps', 'loss_reduction', 'update',
                 'client_lr', 'client_weighting', 'sharpness_probe', 'workers']),
    ('itempop', list(methods.TRAINING_SETTINGS)),
])
def test_what_each_method_refuses(name, refused):
    assert methods.get_method(name).refused(methods.TRAINING_SETTINGS) == refused


def test_a_preset_sets_only_what_the_method_takes():
    # auto sets the server rate, which the central model does not use, and
    # on short histories the update mode, which FedRecon does not take.
    short = recipes.DataProfile(users=100, items=1000, interactions=1000)
    central = run_settings.settings('synthetic', algorithm='central', preset='auto',
                                    data_profile=short)
    assert central.server_lr == run_settings.default('server_lr')
    fed = run_settings.settings('synthetic', algorithm='fedrecgel', preset='auto',
                                data_profile=short)
    assert fed.server_lr != run_settings.default('server_lr') and fed.update == 'model_delta'
    recon = run_settings.settings('synthetic', algorithm='fedrecon', preset='auto',
                                  data_profile=short)
    assert recon.server_lr == fed.server_lr  # FedRecon takes it.
    assert (recon.local_state, recon.loss_reduction, recon.update) == (
        'reconstruct', 'mean', 'gradient')


def test_fedsam_is_the_round_with_local_sam_epochs_uploading_the_change():
    settings = run_settings.settings('filmtrust', algorithm='fedsam', preset='paper')
    # FilmTrust's own rho_sh is 0: FedSAM keeps its radius unless one is given.
    assert (settings.update, settings.rho_sh, settings.rho_ns) == ('model_delta', 0.05, 0.0)
    given = run_settings.settings('filmtrust', algorithm='fedsam', rho_sh=0.1, local_epochs=3)
    assert (given.rho_sh, given.local_epochs) == (0.1, 3)
    with pytest.raises(ValueError, match='fedsam does not take update'):
        run_settings.settings('filmtrust', algorithm='fedsam', update='gradient')
    split = preprocess.build_split(synthetic.generate_synthetic(
        num_users=30, num_items=60, mean_interactions=8, seed=0), num_negatives=20)
    weights = []
    for algorithm, extra in (('fedsam', {}),
                             ('fedrecgel', dict(update='model_delta', rho_sh=0.05, rho_ns=0.0))):
        simulation = run_settings.settings(
            'synthetic', algorithm=algorithm, preset='paper', local_epochs=2,
            **extra).build_simulation(split)
        simulation.initialize()
        simulation.run_round()
        weights.append(simulation.algorithm.global_weights)
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_fedasam_is_fedsam_with_adaptive_sam():
    settings = run_settings.settings('filmtrust', algorithm='fedasam', preset='paper')
    work = settings.client_work()
    assert (work.update, work.rho_sh, work.rho_ns, work.sam_eta) == (
        'model_delta', 0.7, 0.0, 0.2)
    assert run_settings.settings('filmtrust', algorithm='fedsam').client_work().sam_eta is None
    split = preprocess.build_split(synthetic.generate_synthetic(
        num_users=30, num_items=60, mean_interactions=8, seed=0), num_negatives=20)
    weights = []
    for algorithm in ('fedasam', 'fedsam'):
        simulation = run_settings.settings(
            'synthetic', algorithm=algorithm, preset='paper', rho_sh=0.7).build_simulation(split)
        simulation.initialize()
        simulation.run_round()
        weights.append(simulation.algorithm.global_weights)
    assert all(np.all(np.isfinite(w)) for w in weights[0])
    assert not all(np.allclose(a, b) for a, b in zip(*weights))  # The adaptive step.


@pytest.mark.parametrize('name', list(methods.METHODS))
def test_the_tuner_asks_only_what_a_method_takes(name):
    import optuna  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tuning  # pylint: disable=g-import-not-at-top

    method = methods.get_method(name)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        asked = set(tuning.suggest_settings(study.ask(), tuning.SEARCH_SPACE, name))
        assert not method.refused(asked), asked


@pytest.mark.parametrize('name,config_rates', [
    ('pfedrec', ('score_lr',)),
    ('gpfedrec', ('lr',)),
    ('fedrap', ('score_lr', 'item_lr')),
])
def test_lr_scale_multiplies_a_recommenders_own_rates(name, config_rates):
    """--lr_scale reaches the method's own configuration: its authors' rates
    times the scale (1 leaves them), so the tuner searches them."""
    split = preprocess.build_split(synthetic.generate_synthetic(
        num_users=20, num_items=40, mean_interactions=8, seed=0), num_negatives=20)
    rates = {}
    for scale in (1.0, 2.5):
        settings = run_settings.settings('synthetic', algorithm=name, lr_scale=scale,
                                         client_fraction=1.0)
        algorithm = settings.build_simulation(split).algorithm
        rates[scale] = [getattr(algorithm.config, r) for r in config_rates]
    authors = importlib.import_module(f'tff_fedrecgel.recommenders.{name}.computation')
    assert rates[1.0] == [getattr(authors.DEFAULT_CONFIG, r) for r in config_rates]
    assert rates[2.5] == pytest.approx([2.5 * r for r in rates[1.0]])
    with pytest.raises(ValueError, match='fedrecgel does not take lr_scale'):
        run_settings.settings('synthetic', algorithm='fedrecgel', lr_scale=2.0)


def test_lr_scale_multiplies_the_central_models_adam_rate():
    """The tuner's ceiling searches the central model's rate as the
    federated methods' rates are searched (1 leaves it as it was)."""
    from tff_fedrecgel import central  # pylint: disable=g-import-not-at-top

    split = preprocess.build_split(synthetic.generate_synthetic(
        num_users=20, num_items=40, mean_interactions=8, seed=0), num_negatives=20)
    rates = [run_settings.settings('synthetic', algorithm='central', lr_scale=scale)
             .build_simulation(split).algorithm.trainer.learning_rate for scale in (1.0, 2.5)]
    assert rates == pytest.approx([central.DEFAULT_LEARNING_RATE,
                                   2.5 * central.DEFAULT_LEARNING_RATE])


def test_the_tuner_searches_a_recommenders_local_epochs_and_rates():
    """A method without an upload mode trains local epochs: the tuner asks
    them (and the rate scale) without a model-change draw."""
    import optuna  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tuning  # pylint: disable=g-import-not-at-top

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    asked = tuning.suggest_settings(study.ask(), tuning.SEARCH_SPACE, 'pfedrec')
    assert set(asked) == {'client_fraction', 'local_epochs', 'num_negatives', 'lr_scale'}
    asked = tuning.suggest_settings(study.ask(), tuning.SEARCH_SPACE, 'fedrap')
    assert set(asked) == {'client_fraction', 'num_negatives', 'lr_scale'}
