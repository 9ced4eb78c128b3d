"""Tests of user-level DP and secure aggregation (`tff_fedrecgel.privacy`).

Round-level checks run one round of a tiny FedRecGEL process whose server
optimizer is SGD with learning rate 1, so the new global weights are the old
ones minus exactly the aggregated update. Aggregator-level checks feed chosen
client values to the aggregation process alone.
"""

import collections
import csv
import json
import math
import os
import pathlib
import signal
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel import privacy
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.models import neumf

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAIN = str(REPO / 'launch' / 'train.py')
SMALL = ['--task=synthetic', '--num_users=80', '--num_items=400',
         '--progress=false']
CONFIG = neumf.ModelConfig(num_items=20, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
WORK = client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.2)
COHORT_SIZES = (30, 150, 12)


# ----------------------------------------------------------------------------
# Helpers and fixtures.
# ----------------------------------------------------------------------------


def _state(rng):
    local = [rng.normal(scale=0.3, size=(1, d)).astype(np.float32)
             for d in (CONFIG.gmf_dim, CONFIG.mlp_dim)]
    return collections.OrderedDict(
        local_weights=local, adam_step=np.int32(0),
        adam_m=[np.zeros_like(w) for w in local],
        adam_v=[np.zeros_like(w) for w in local])


def _batch(rng, n):
    labels = (rng.random(n) < 0.3).astype(np.float32)
    labels[0] = 1.0
    return collections.OrderedDict(
        items=rng.integers(0, CONFIG.num_items, size=n).astype(np.int32),
        labels=labels)


@pytest.fixture(scope='module')
def cohort():
    rng = np.random.default_rng(0)
    return [_state(rng) for _ in COHORT_SIZES], [_batch(rng, n) for n in COHORT_SIZES]


def _one_round(cohort, aggregator):
    """(old weights, new weights, metrics) of one round with server SGD(1)."""
    process = fedrecgel.build_round_pieces(
        model_config=CONFIG, model_aggregator=aggregator,
        client_update=client_update.build_client_update(CONFIG, WORK, single_user=True),
        server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0)).process
    state = process.initialize()
    old = [np.asarray(w) for w in state['global_weights']]
    new_state, _, metrics = process.next(state, *cohort)
    return old, [np.asarray(w) for w in new_state['global_weights']], metrics


@pytest.fixture(scope='module')
def plain_round(cohort):
    """The default process: mean weighted by uniform weights (no drops here)."""
    return _one_round(cohort, None)


def _norm(parts):
    return math.sqrt(sum(float(np.sum(np.square(p, dtype=np.float64))) for p in parts))


def _update(old, new):
    return [o.astype(np.float64) - n for o, n in zip(old, new)]


def _aggregate(factory, values, dtype=tf.float32):
    """Runs one `next` of `factory`'s process on per-client values."""
    value_type = tff.types.tensorflow_to_type(
        [tf.TensorSpec(v.shape, dtype) for v in values[0]])
    process = factory.create(value_type)
    output = process.next(process.initialize(), values)
    return [np.asarray(r) for r in output.result], output.measurements


@pytest.fixture
def secure_context(tff_runtime):
    """The session's runtime with secure sums compiled to sums, then without."""
    tff_runtime.install(secure_sum=True)
    yield
    tff_runtime.install()


# ----------------------------------------------------------------------------
# (a)-(c): the DP aggregator.
# ----------------------------------------------------------------------------


def test_dp_without_noise_equals_plain_mean(cohort, plain_round):
    """Noise 0 and a clip nothing reaches: the plain mean's round to 1e-6."""
    aggregator = privacy.build_dp_aggregator(
        noise_multiplier=0.0, clients_per_round=len(COHORT_SIZES), clip=1e6)
    old, new, metrics = _one_round(cohort, aggregator)
    plain_old, plain_new, _ = plain_round
    for a, b in zip(old, plain_old):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(new, plain_new):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert _norm(_update(old, new)) > 1e-3  # The round did move the weights.
    assert 'dp_query_metrics' in metrics['aggregation']


def test_clipping_bounds_each_contribution(cohort, plain_round):
    """A huge upload counts as norm `clip`; the round's mean update <= clip."""
    clip = 1.0
    rng = np.random.default_rng(1)
    huge = rng.normal(size=50).astype(np.float32)
    huge *= 1e6 / np.linalg.norm(huge)
    small = [rng.normal(size=50).astype(np.float32) * 0.01 for _ in range(2)]
    factory = privacy.build_dp_aggregator(
        noise_multiplier=0.0, clients_per_round=3, clip=clip)
    (result,), _ = _aggregate(factory, [[huge], [small[0]], [small[1]]])
    expected = (huge / np.linalg.norm(huge) * clip + small[0] + small[1]) / 3
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-7)
    assert np.linalg.norm(result) <= clip

    # In the round: uploads are clipped to 0.01, far below their norms.
    round_clip = 0.01
    aggregator = privacy.build_dp_aggregator(
        noise_multiplier=0.0, clients_per_round=len(COHORT_SIZES), clip=round_clip)
    old, new, _ = _one_round(cohort, aggregator)
    clipped_norm = _norm(_update(old, new))
    assert 0 < clipped_norm <= round_clip * (1 + 1e-4)
    assert _norm(_update(*plain_round[:2])) > 10 * round_clip


def test_noise_has_the_expected_scale():
    """With noise, the mean is off by N(0, (z C / n)^2) per coordinate."""
    noise_multiplier, clip, clients, dim = 0.5, 2.0, 4, 20000
    rng = np.random.default_rng(2)
    values = []
    for _ in range(clients):
        v = rng.normal(size=dim).astype(np.float32)
        values.append([v * (0.5 / np.linalg.norm(v))])  # Below the clip.
    factory = privacy.build_dp_aggregator(
        noise_multiplier=noise_multiplier, clients_per_round=clients, clip=clip)
    (result,), _ = _aggregate(factory, values)
    deviation = result - np.mean([v[0] for v in values], axis=0)
    expected_std = noise_multiplier * clip / clients
    assert abs(np.std(deviation) / expected_std - 1) < 0.05
    assert abs(np.mean(deviation)) < 5 * expected_std / math.sqrt(dim)


# ----------------------------------------------------------------------------
# (d): the accountant.
# ----------------------------------------------------------------------------


def test_epsilon_monotone_and_matches_dp_accounting():
    q, delta = 122 / 1227, 1 / 1227
    by_noise = [privacy.dp_epsilon(noise_multiplier=z, sampling_probability=q,
                                   rounds=100, delta=delta) for z in (0.5, 1.0, 2.0)]
    assert by_noise[0] > by_noise[1] > by_noise[2] > 0
    by_rounds = [privacy.dp_epsilon(noise_multiplier=1.0, sampling_probability=q,
                                    rounds=r, delta=delta) for r in (1, 10, 100)]
    assert by_rounds[0] < by_rounds[1] < by_rounds[2]

    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(2.0))
    for name, accountant in (('rdp', dp_accounting.rdp.RdpAccountant()),
                             ('pld', dp_accounting.pld.PLDAccountant())):
        accountant.compose(event, 10)
        assert privacy.dp_epsilon(
            noise_multiplier=2.0, sampling_probability=q, rounds=10,
            delta=delta, accountant=name) == pytest.approx(
                accountant.get_epsilon(delta), rel=1e-9)
    assert privacy.dp_epsilon(noise_multiplier=1.0, sampling_probability=q,
                              rounds=0, delta=delta) == 0.0
    assert math.isinf(privacy.dp_epsilon(noise_multiplier=0.0, sampling_probability=q,
                                         rounds=1, delta=delta))
    valid = dict(noise_multiplier=1.0, sampling_probability=q, rounds=1, delta=delta)
    for bad in ({'sampling_probability': 0.0}, {'delta': 1.0}, {'rounds': -1},
                {'accountant': 'moments'}):
        with pytest.raises(ValueError):
            privacy.dp_epsilon(**{**valid, **bad})
    assert privacy.default_delta(num_users=1227) == delta
    report = privacy.PrivacyReport(noise_multiplier=1.0, sampling_probability=q,
                                   delta=delta, clip=0.5)
    assert report.summary(100)['dp_epsilon'] == pytest.approx(by_rounds[2])
    assert report.round_metrics(10) == {'dp_epsilon': by_rounds[1]}


def test_bad_dp_settings_are_refused():
    with pytest.raises(ValueError, match='clip'):
        privacy.build_dp_aggregator(noise_multiplier=1.0, clients_per_round=10)
    with pytest.raises(ValueError, match='fixed clip'):
        privacy.build_dp_aggregator(noise_multiplier=0.1, clients_per_round=10,
                                    adaptive_clip=True, secure=True)
    with pytest.raises(ValueError):
        privacy.build_dp_aggregator(
            noise_multiplier=-1.0, clients_per_round=10, clip=1.0)


# ----------------------------------------------------------------------------
# (e): secure aggregation.
# ----------------------------------------------------------------------------


def test_secure_mean_equals_plain_mean_up_to_quantization(secure_context):
    """Each coordinate of the mean is off by at most B / (2**32 - 1).

    Each client's value is rounded to a grid of step 2B / (2**32 - 1), so the
    integer sum of n clients is off by at most n B / (2**32 - 1) and their
    mean by B / (2**32 - 1): 2.3e-10 for B = 1. float64 values keep float
    rounding (1e-16) out of the way.
    """
    del secure_context
    bound, clients = 1.0, 5
    rng = np.random.default_rng(3)
    values = [[rng.uniform(-bound, bound, size=1000),
               rng.uniform(-bound, bound, size=(5, 3))] for _ in range(clients)]
    quantization = privacy.secure_quantization_error(bound=bound)
    assert quantization == pytest.approx(2.3283064e-10)
    factory = privacy.build_secure_aggregator(bound=bound, weighted=False)
    result, measurements = _aggregate(factory, values, dtype=tf.float64)
    errors = np.concatenate([
        np.ravel(got - np.mean([v[i] for v in values], axis=0))
        for i, got in enumerate(result)])
    assert np.max(np.abs(errors)) <= quantization * (1 + 1e-6)
    # Rounding did happen, at the expected scale (mean of 5 uniform errors).
    assert np.max(np.abs(errors)) > 0.1 * quantization
    assert measurements['mean_value']['secure_upper_clipped_count'] == 0

    # DP on top (float32 only): clipped uploads summed securely over
    # [-clip, clip]; float32 rounds the sum (|sum| <= 5) and the mean.
    clip = 50.0
    values = [[v.astype(np.float32) for v in client] for client in values]
    assert max(_norm(client) for client in values) < clip  # Nothing clipped.
    factory = privacy.build_dp_aggregator(
        noise_multiplier=0.0, clients_per_round=clients, clip=clip, secure=True)
    result, measurements = _aggregate(factory, values)
    tolerance = (privacy.secure_quantization_error(bound=clip)
                 + np.spacing(np.float32(clients * bound)) / clients
                 + np.spacing(np.float32(bound)))
    for i, got in enumerate(result):
        exact = np.mean([v[i].astype(np.float64) for v in values], axis=0)
        assert np.max(np.abs(got - exact)) <= tolerance
    assert float(measurements['dp']['secure_upper_threshold']) == clip


def test_secure_round_equals_plain_round(cohort, plain_round, secure_context):
    """A FedRecGEL round with the secure mean moves the weights as the plain one.

    The adaptive range starts at B = 100 (twice 50), so the mean update is off
    by at most 100 / (2**32 - 1) = 2.3e-8 per coordinate from quantization,
    plus float32 rounding of both means and of the new weights: the sums of
    three chunk-sum gradients reach a few units here, whose float32 spacing is
    up to 4.8e-7, so 1e-6 is allowed for it.
    """
    del secure_context
    old, new, metrics = _one_round(cohort, privacy.build_secure_aggregator())
    value_metrics = metrics['aggregation']['mean_value']
    bound = float(value_metrics['secure_upper_threshold'])
    assert bound == 100.0 and value_metrics['secure_upper_clipped_count'] == 0
    quantization = privacy.secure_quantization_error(bound=bound)
    for a, b in zip(new, plain_round[1]):
        np.testing.assert_allclose(a, b, rtol=0, atol=quantization + 1e-6)
    assert _norm(_update(old, new)) > 1e-3


# ----------------------------------------------------------------------------
# (f): launch/train.py.
# ----------------------------------------------------------------------------


def _run_train(args, tmp_path, timeout=300):
    """Runs train.py to a log file (no pipe: TFF's worker may outlive it)."""
    log_path = tmp_path / 'log.txt'
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(
            [sys.executable, TRAIN, *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=REPO, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode, log_path.read_text()


def test_train_reports_epsilon(tmp_path):
    code, output = _run_train(
        [*SMALL, f'--root_output_dir={tmp_path}', '--experiment_name=dp',
         '--total_rounds=2', '--dp_noise_multiplier=0.5', '--dp_clip=1.0'], tmp_path)
    assert code == 0, output
    assert 'one user per TFF client' in output
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary['dp_epsilon'] > 0
    assert summary['dp_delta'] == pytest.approx(1 / 80)
    assert summary['dp_noise_multiplier'] == 0.5 and summary['dp_clip'] == 1.0
    assert json.loads((tmp_path / 'dp' / 'summary.json').read_text())[
        'dp_epsilon'] == summary['dp_epsilon']
    hparams = json.loads((tmp_path / 'dp' / 'hparams.json').read_text())
    assert hparams['dp_noise_multiplier'] == 0.5 and hparams['dp_clip'] == 1.0
    assert hparams['secure_aggregation'] is False
    with open(tmp_path / 'dp' / 'metrics.csv') as f:
        epsilons = [float(row['train/dp_epsilon']) for row in csv.DictReader(f)]
    assert len(epsilons) == 2 and 0 < epsilons[0] < epsilons[1]
    assert epsilons[1] == pytest.approx(summary['dp_epsilon'])
    # The privacy settings are settings: the Python API continues the run
    # with them (same recorded settings, the accountant one round further).
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    with api.Session():
        experiment = api.load_run(tmp_path / 'dp')
        assert not experiment.foreign_settings and experiment.settings.private
        more = experiment.train(total_rounds=3)
    assert more['dp_epsilon'] > summary['dp_epsilon']
    assert json.loads((tmp_path / 'dp' / 'hparams.json').read_text())['dp_clip'] == 1.0


def test_train_refuses_vectorized_dp(tmp_path):
    code, output = _run_train(
        [*SMALL, f'--root_output_dir={tmp_path}', '--simulation=vectorized',
         '--dp_noise_multiplier=1'], tmp_path)
    assert code == 2, output
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert lines[-1].startswith('error: ') and 'vectorized' in lines[-1], output
    assert 'Traceback' not in output
