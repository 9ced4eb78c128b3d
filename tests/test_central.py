"""Tests of the centrally trained NeuMF (the non-federated ceiling)."""

import numpy as np
import pytest

from tff_fedrecgel import central
from tff_fedrecgel import evaluation
from tff_fedrecgel.algorithms import itempop
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.models import neumf


def _split(**overrides):
    config = synthetic.SyntheticConfig(**overrides)
    return preprocess.build_split(synthetic.generate_synthetic(config))


def _small_model(split):
    return neumf.ModelConfig(num_items=split.num_items, gmf_dim=8, mlp_dim=16,
                             mlp_layers=(16, 8))


def _trainer(split, **kwargs):
    trainer = central.CentralTrainer(split=split, model_config=_small_model(split),
                                     **kwargs)
    trainer.initialize()
    return trainer


@pytest.fixture(scope='module')
def tiny_split():
    return _split(num_users=60, num_items=160, mean_interactions=10)


def test_beats_popularity_on_data_with_latent_structure():
    split = _split()  # 500 users, 400 items, latent factors + long tail.
    counts = np.bincount(split.train_items, minlength=split.num_items)
    floor = evaluation.evaluate_item_scores(counts, split.candidates())['hr@10']
    trainer = _trainer(split, seed=0, learning_rate=0.01)
    for _ in range(5):
        metrics = trainer.run_epoch()
    assert trainer.round_num == 5
    assert metrics['examples'] == 5 * len(trainer.train_data.items)
    assert trainer.evaluate()['hr@10'] > floor + 0.1


def test_tables_follow_the_evaluation_layout(tiny_split):
    trainer = _trainer(tiny_split, seed=3)
    trainer.run_epoch()
    tables = trainer.local_tables()
    assert [t.shape for t in tables] == [(tiny_split.num_users, 8),
                                         (tiny_split.num_users, 16)]
    weights = trainer.global_weights
    assert weights[0].shape == (tiny_split.num_items, 8)
    expected = evaluation.evaluate_users(trainer.model_config, weights, tables,
                                         tiny_split.candidates())
    assert trainer.evaluate() == pytest.approx(dict(expected))


def test_same_seed_same_model_and_restore_resumes_exactly(tiny_split):
    straight = _trainer(tiny_split, seed=1)
    straight.run_epoch()
    straight.run_epoch()
    first = _trainer(tiny_split, seed=1)
    first.run_epoch()
    state = first.get_state()
    resumed = central.CentralTrainer(split=tiny_split,
                                     model_config=_small_model(tiny_split), seed=1)
    resumed.restore(state)
    assert resumed.round_num == 1
    resumed.run_epoch()
    for a, b in zip(straight.global_weights + straight.local_tables(),
                    resumed.global_weights + resumed.local_tables()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    other = _trainer(tiny_split, seed=2)
    other.run_epoch()
    assert not np.allclose(other.global_weights[0], first.global_weights[0])


def test_bad_settings_are_refused(tiny_split):
    with pytest.raises(ValueError, match='items'):
        central.CentralTrainer(split=tiny_split,
                               model_config=neumf.ModelConfig(num_items=3))
    with pytest.raises(ValueError, match='positive'):
        central.CentralTrainer(split=tiny_split,
                               model_config=_small_model(tiny_split),
                               batch_size=0)
    trainer = _trainer(tiny_split, seed=0)
    with pytest.raises(ValueError, match='seed'):
        central.CentralTrainer(split=tiny_split,
                               model_config=_small_model(tiny_split),
                               seed=5).restore(trainer.get_state())
    with pytest.raises(RuntimeError, match='initialize'):
        central.CentralTrainer(split=tiny_split,
                               model_config=_small_model(tiny_split)).run_epoch()
