"""Every setting of a run has an export decision; refusals are one line."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tff_fedrecgel import export_settings
from tff_fedrecgel import methods
from tff_fedrecgel import privacy
from tff_fedrecgel import run_settings
from tff_fedrecgel.errors import SettingError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'launch', 'export.py')


def test_every_setting_has_a_decision():
    """A new `Settings` (or privacy) field fails here until DECISIONS has it."""
    fields = [f.name for f in dataclasses.fields(run_settings.Settings)]
    missing = [n for n in fields if n not in export_settings.DECISIONS]
    assert not missing, f'add an export decision for {missing} (export_settings.DECISIONS)'
    assert not export_settings.undecided()
    # Each privacy field is a setting, recorded under its name.
    recorded = privacy.PrivacySettings(noise_multiplier=1.0, clip=0.1,
                                       secure_aggregation=True).hparams(num_users=100)
    assert set(recorded) == set(export_settings.PRIVACY_SETTINGS) <= set(fields)
    assert len(dataclasses.fields(privacy.PrivacySettings)) == len(
        export_settings.PRIVACY_SETTINGS)
    # Nothing decided that is not a setting.
    assert set(export_settings.DECISIONS) == set(fields)


def test_decisions_are_kinds_with_reasons():
    for name, computations, saved_model, why in export_settings.table():
        assert computations in export_settings.KINDS and saved_model in export_settings.KINDS
        assert why and '\n' not in why, name
    with pytest.raises(ValueError, match='one of'):
        export_settings.Decision('maybe', export_settings.HONOURS, 'x')


def test_computations_refuse_what_they_cannot_honour_in_one_line():
    base = run_settings.settings('synthetic')
    export_settings.check_computations(base)
    cases = [
        (run_settings.settings('synthetic', dp_noise_multiplier=1.0, dp_clip=0.1),
         'dp_noise_multiplier'),
        (run_settings.settings('synthetic', secure_aggregation=True), 'secure_aggregation'),
        (run_settings.settings('synthetic', algorithm='fedrecon'), 'algorithm'),
        (run_settings.settings('synthetic', local_state='reconstruct', eval_protocol='full'),
         'eval_protocol'),
    ]
    for settings, name in cases:
        with pytest.raises(SettingError) as raised:
            export_settings.check_computations(settings)
        assert raised.value.name == name
        assert len(raised.value.flag_message().splitlines()) == 1
        assert 'refused by export' in raised.value.flag_message()
    # Full ranking with stored embeddings is honoured: one evaluation per protocol.
    both = run_settings.settings('synthetic', eval_protocol='both')
    export_settings.check_computations(both)
    assert export_settings.eval_protocols(both) == ('sampled', 'full')


def test_every_method_is_exported_or_refused():
    for name, method in methods.METHODS.items():
        settings = run_settings.settings('synthetic', algorithm=name)
        if method.exports:
            export_settings.check_computations(settings)
        else:
            with pytest.raises(SettingError, match='algorithm'):
                export_settings.check_computations(settings)
        if method.algorithm in export_settings.SERVED_FAMILIES:
            export_settings.check_saved_model(settings)
        else:
            with pytest.raises(SettingError, match='algorithm'):
                export_settings.check_saved_model(settings)


def test_saved_model_records_privacy_and_refuses_unknown_settings():
    base = run_settings.settings('synthetic')
    export_settings.check_saved_model(base, ['dp_noise_multiplier', 'dp_clip'])
    with pytest.raises(SettingError, match='export does not know'):
        export_settings.check_saved_model(base, ['some_new_setting'])
    private = run_settings.settings('synthetic', dp_noise_multiplier=1.0, dp_clip=0.1)
    export_settings.check_saved_model(private)
    assert {k: v for k, v in private.hparams(num_users=50).items()
            if k in export_settings.PRIVACY_SETTINGS} == {
                'dp_noise_multiplier': 1.0, 'dp_clip': 0.1, 'dp_adaptive_clip': False,
                'dp_delta': 0.02, 'secure_aggregation': False}


def _run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO, env=env,
                          capture_output=True, stdin=subprocess.DEVNULL, text=True,
                          timeout=180, check=False)


@pytest.mark.parametrize('args, fragment', [
    (('--task=synthetic', '--dp_noise_multiplier=1', '--dp_clip=0.1'),
     '--dp_noise_multiplier is refused by export'),
    (('--task=synthetic', '--secure_aggregation'), '--secure_aggregation is refused'),
    (('--task=synthetic', '--algorithm=pfedrec'), '--algorithm is refused by export'),
    (('--task=synthetic', '--local_state=reconstruct', '--eval_protocol=both'),
     '--eval_protocol is refused by export'),
    (('--task=synthetic', '--eval_protocol=topk'), 'eval_protocol'),
    (('--run_dir={tmp}/run', '--server_optimizer=sgd'), 'drop --server_optimizer'),
    (('--run_dir={tmp}/run', '--eval_protocol=full'), 'drop --eval_protocol'),
    (('--config={tmp}/run/hparams.json',), '--dp_noise_multiplier is refused by export'),
])
def test_cli_refusals_are_one_line(tmp_path, args, fragment):
    """launch/export.py refuses with one line, before writing anything."""
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'hparams.json').write_text(json.dumps(
        {'task': 'synthetic', 'algorithm': 'fedrecgel', 'dp_noise_multiplier': 1.0,
         'dp_clip': 0.1, 'secure_aggregation': False}))
    result = _run_cli(*[a.format(tmp=tmp_path) for a in args],
                      f'--output_dir={tmp_path}/o')
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / 'o').exists()


def test_deployment_honours_the_full_protocol():
    """--eval_protocol=both exports both protocols' federated evaluations, and
    the full one ranks as the library's batched full ranking does."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import export  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.evaluation import full_ranking  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top

    config = neumf.ModelConfig(num_items=40, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))
    deployment = export.build_deployment(model_config=config,
                                         eval_protocols=('sampled', 'full'))
    names = list(deployment.computations)
    assert names.index('federated_evaluation') < names.index('federated_full_evaluation')
    assert deployment.runs_on['federated_full_evaluation'] == export.FEDERATED
    assert deployment.hyperparameters['eval_protocols'] == ['sampled', 'full']
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=s.shape).astype(np.float32)
               for s in neumf.global_weight_specs(config)]
    tables = [rng.normal(size=(3, d)).astype(np.float32) for d in config.local_dims]
    heldout = np.array([1, 5, 7], np.int32)
    indptr, items = np.array([0, 2, 3, 5]), np.array([2, 3, 4, 8, 9], np.int32)
    fast = full_ranking.evaluate_full(config, weights, tables, heldout, (indptr, items))
    federated = deployment.computations['federated_full_evaluation'](
        weights, [[t[u:u + 1] for t in tables] for u in range(3)],
        [{'heldout_item': heldout[u], 'train_items': items[indptr[u]:indptr[u + 1]]}
         for u in range(3)])
    for key, value in fast.items():
        np.testing.assert_allclose(federated[key], value, rtol=1e-5)
    only_sampled = export.build_deployment(model_config=config)
    assert 'federated_full_evaluation' not in only_sampled.computations
