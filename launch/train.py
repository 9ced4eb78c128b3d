r"""Trains FedRecGEL (or a baseline) in TFF simulation.

Examples (from the repository root)::

    .venv/bin/python launch/train.py --task=synthetic
    .venv/bin/python launch/train.py --task=filmtrust \
        --data_dir=/path/to/filmtrust
    .venv/bin/python launch/train.py --task=filmtrust \
        --data_dir=/path/to/filmtrust --algorithm=fedncf --seed=1
    .venv/bin/python launch/train.py --task=filmtrust \
        --data_dir=/path/to/filmtrust \
        --workers=$(launch/start_workers.sh 2)   # docs/WORKERS.md

docs/DATA.md says where to download each dataset's raw file.

Each task supplies the paper's settings for its dataset (SAM radii, 100
rounds, client fraction 0.1); flags override them. Outputs go to
<root_output_dir>/<experiment_name>/ (TensorBoard logs, metrics.csv,
hparams.json, checkpoints, summary.json). Started again with the same flags,
a run resumes from its latest checkpoint. The last printed line is the
summary as one JSON object.

Flags can come from a file: --flagfile=FILE reads one --flag=value per line
(lines starting with # are comments) as if given at that place on the
command line, so flags given after it win, e.g.
    .venv/bin/python launch/train.py --flagfile=filmtrust.flags --seed=1
"""

from __future__ import annotations

import json
import os
import sys
import time

if __package__ in (None, ''):
    # Run as `python launch/train.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags
from absl import logging

from tff_fedrecgel.launch import _algorithm_flags as algo
from tff_fedrecgel.launch import _client_flags
from tff_fedrecgel.launch import _config_file
from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel.launch import _eval_flags as eval_flags
from tff_fedrecgel.launch import _model_flags
from tff_fedrecgel.launch import _output_flags as output_flags
from tff_fedrecgel.launch import _privacy_flags as privacy_flags
from tff_fedrecgel.launch import _ranking_flags
from tff_fedrecgel.launch import _server_flags
from tff_fedrecgel.launch import _simulation_flags as simulation_flags
from tff_fedrecgel import methods
from tff_fedrecgel import recipes
from tff_fedrecgel import run_settings
from tff_fedrecgel import setting_changes
from tff_fedrecgel.evaluation import protocols
# pylint: enable=g-import-not-at-top,wrong-import-position

# --help lists the flags of every concern, one group each (_flag_groups).
_config_file.define_config_flag()
for _module in (_data_flags, _model_flags, algo, _client_flags, _server_flags, eval_flags,
                _ranking_flags, privacy_flags, simulation_flags, output_flags, _config_file):
    flags.adopt_module_key_flags(_module)


def _settings(task, data_profile=None) -> run_settings.Settings:
    """All settings of the run, from the task's defaults and the flags."""
    if simulation_flags.CLIENTS_PER_ROUND.present and simulation_flags.CLIENT_FRACTION.present:
        raise ValueError('give --clients_per_round or --client_fraction, not both')
    _check_method(algo.selected_algorithm(), private=_private())
    return algo.settings(task, data_profile)


def _private() -> bool:
    """Whether the flags ask for DP or secure aggregation."""
    return (flags.FLAGS.dp_noise_multiplier is not None
            or flags.FLAGS.secure_aggregation)


def _privacy(settings: run_settings.Settings, num_users: int, clients: int):
    """The run's `PrivacySettings`, checked (imports no TensorFlow)."""
    try:
        return settings.checked_privacy(num_users, clients)
    except run_settings.SettingError as e:
        raise ValueError(e.flag_message()) from None


def _privacy_report(settings: run_settings.Settings, privacy, num_users: int):
    """Says the run's privacy; returns its `PrivacyReport` (None without DP)."""
    if not privacy.needs_one_user_per_client:
        return None
    if privacy.secure_aggregation:
        # As privacy.use_secure_simulation_context, on this process's worker.
        _entry.tff_runtime(secure_sum=True)
    report = settings.privacy_report(num_users)
    total_rounds = settings.total_rounds
    if report is None:
        print('privacy: secure aggregation (simulated), no DP', flush=True)
    else:
        print(f'privacy: user-level DP, noise multiplier {report.noise_multiplier}, '
              f'clip {"adaptive" if report.adaptive_clip else report.clip}, epsilon '
              f'{report.epsilon(total_rounds):.3g} at delta {report.delta:.3g} after '
              f'{total_rounds} rounds; secure aggregation '
              f'{"on (simulated)" if privacy.secure_aggregation else "off"}', flush=True)
    return report


def _check_method(algorithm: str, *, private: bool) -> None:
    """Refuses flags the method has no use for (it would ignore them)."""
    method = methods.get_method(algorithm)
    unused = [f'--{name}' for name in method.refused(methods.TRAINING_SETTINGS)
              if flags.FLAGS[name].present]
    if private and not method.private:
        unused.append('DP / secure aggregation')
    if unused:
        raise ValueError(f'--algorithm={algorithm} does not take {", ".join(unused)}')


def main(argv: list[str]) -> int:
    """Entry point.

    Every flag and the data are checked before anything is written; the
    experiment folder is then locked (a second run on it is refused), the
    TFF process built, and only then `hparams.json` written.
    """
    del argv  # Stray arguments are refused by _entry.run_main.
    task = algo.selected_task()
    settings = _settings(task)
    from tff_fedrecgel import program  # pylint: disable=g-import-not-at-top
    experiment = output_flags.EXPERIMENT_NAME.value
    if experiment is None:
        experiment = f'{task.name}_{settings.algorithm}_seed{settings.seed}'
    program.check_experiment_name(experiment)
    program.check_output_root(output_flags.ROOT_OUTPUT_DIR.value)
    # A busy folder is said at once, before the data load and the TF import.
    program.check_not_in_use(root_output_dir=output_flags.ROOT_OUTPUT_DIR.value,
                             experiment_name=experiment)

    # Fail on bad data before the slow TF imports.
    split = task.load_split(data_dir=settings.data_dir, validation=settings.validation,
                            cache_dir=_data_flags.CACHE_DIR.value,
                            eval_negatives=settings.split_negatives, **settings.data_options)
    profile = recipes.DataProfile.of(split)
    if recipes.needs_data(settings.preset):
        settings = _settings(task, profile)
    try:
        clients = settings.check_split(split)
    except run_settings.SettingError as e:
        raise ValueError(e.flag_message()) from None
    privacy = _privacy(settings, split.num_users, clients)
    hparams = settings.hparams(num_users=split.num_users)
    if simulation_flags.WORKERS.value and privacy.needs_one_user_per_client:
        raise ValueError('DP and secure aggregation are not supported with --workers')
    if simulation_flags.WORKERS.value:
        from tff_fedrecgel.simulation.transport import parse_worker_addresses  # pylint: disable=g-import-not-at-top
        parse_worker_addresses(simulation_flags.WORKERS.value)

    paths = None
    try:
        with program.open_run(root_output_dir=output_flags.ROOT_OUTPUT_DIR.value,
                              experiment_name=experiment, hparams=hparams) as paths:
            return _train(task, settings, hparams, split, clients, privacy, paths, profile)
    except program.TrainingStoppedError as e:
        if paths is None or not paths.hparams.exists():
            raise  # Nothing was trained: open_run removed what it wrote.
        raise program.TrainingStoppedError(
            f'{e}; {paths.root} keeps this run\'s settings, so '
            'run a changed command under another --experiment_name') from None


def _headline(headline, negatives: int, popularity=None) -> str:
    """The summary's first figure in words, beside the popularity floor on
    the same split and protocol (`negatives`: of the sampled protocol)."""
    suffix = protocols.get(headline['protocol']).suffix
    protocol = 'full ranking' if suffix else f'sampled, {negatives} negatives'
    served = ('; recommend.py, export.py and api.load_run serve this round'
              if headline['selection'].startswith('valid') else '')
    def figure(metric):
        error = headline.get(f'test{suffix}/{metric}_se')
        value = f'{headline[f"test{suffix}/{metric}"]:.4f}'
        return value if error is None else f'{value} ± {error:.4f}'

    if f'test{suffix}/hr@10_se' in headline:
        protocol += '; a sample of users, ± one standard error'
    floor = ''
    if popularity and f'test{suffix}/hr@10' in popularity:
        floor = (f'; item popularity on the same split: HR@10 '
                 f'{popularity[f"test{suffix}/hr@10"]:.4f}, NDCG@10 '
                 f'{popularity[f"test{suffix}/ndcg@10"]:.4f}')
    return (f'result: round {headline["round"]}, {headline["chosen"]}: test HR@10 '
            f'{figure("hr@10")}, NDCG@10 {figure("ndcg@10")} ({protocol}){floor}{served}')


def _train(task, settings: run_settings.Settings, hparams: dict, split, clients: int,
           privacy, paths, profile) -> int:
    """Builds the TFF process, records the settings and runs the rounds."""
    _entry.tff_runtime()
    from tff_fedrecgel import program  # pylint: disable=g-import-not-at-top

    one_user = privacy.needs_one_user_per_client
    stats = split.summary()
    print(f'{task.name}: {stats["users"]:,} users, {stats["items"]:,} items, '
          f'{stats["train_interactions"]:,} training rows; {clients} clients per '
          f'round; {settings.algorithm} (rho_sh={settings.rho_sh}, '
          f'rho_ns={settings.rho_ns}); {settings.total_rounds} rounds; '
          f'{"vectorized" if settings.vectorized(one_user) else "one user per TFF client"}',
          flush=True)
    if split.filter_line():
        print(f'{task.name}: {split.filter_line()}', flush=True)
    print(setting_changes.preset_banner(settings, profile), flush=True)
    start = time.perf_counter()
    privacy_report = _privacy_report(settings, privacy, split.num_users)
    sim = settings.build_simulation(split, workers=simulation_flags.WORKERS.value)
    logging.info('built the TFF process in %.1f s', time.perf_counter() - start)
    print(f'outputs: {paths.root}', flush=True)
    print(f'view the curves: {_entry.tensorboard_command(paths.tensorboard)}',
          flush=True)
    summary = program.run_training(
        sim, paths=paths, total_rounds=settings.total_rounds,
        rounds_per_eval=settings.rounds_per_eval,
        rounds_per_checkpoint=settings.rounds_per_checkpoint,
        hparams=hparams, validation=settings.validation,
        eval_protocol=settings.eval_protocol,
        rounds_per_full_eval=settings.rounds_per_full_eval,
        progress=output_flags.PROGRESS.value,
        early_stopping_patience=settings.early_stopping_patience,
        extra_train_metrics=privacy_report.round_metrics if privacy_report else None,
        extra_summary=privacy_report.summary if privacy_report else None)
    summary['wall_seconds'] = round(time.perf_counter() - start, 1)
    summary['output_dir'] = str(paths.root)
    print(_headline(summary['headline'], settings.eval_negatives, summary.get('popularity')),
          flush=True)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(
        main, interrupted_hint='run the same command to resume from the latest '
        'checkpoint')
