r"""Trains FedRecGEL (or a baseline) in TFF simulation.

Examples (from the repository root)::

    python launch/train.py --task=synthetic
    python launch/train.py --task=filmtrust \
        --data_dir=../shared/datasets/filmtrust
    python launch/train.py --task=filmtrust \
        --data_dir=../shared/datasets/filmtrust --algorithm=fedncf --seed=1
    python launch/train.py --task=filmtrust \
        --data_dir=../shared/datasets/filmtrust \
        --workers=$(launch/start_workers.sh 2)   # docs/WORKERS.md

Each task supplies the paper's settings for its dataset (SAM radii, 100
rounds, client fraction 0.1); flags override them. Outputs go to
<root_output_dir>/<experiment_name>/ (TensorBoard logs, metrics.csv,
hparams.json, checkpoints, summary.json). Started again with the same flags,
a run resumes from its latest checkpoint. The last printed line is the
summary as one JSON object.
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
from launch import _entry

_entry.setup_environment()

from absl import flags
from absl import logging

from launch import _algorithm_flags as algo
from launch import _data_flags
# pylint: enable=g-import-not-at-top,wrong-import-position

_ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', 'runs', 'Root folder of all experiments.')
_EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None,
    'Experiment folder name (default: <task>_<algorithm>_seed<seed>).')
_TOTAL_ROUNDS = flags.DEFINE_integer(
    'total_rounds', None, 'Rounds to run (default: the task\'s, 100).')
_CLIENT_FRACTION = flags.DEFINE_float(
    'client_fraction', None,
    'Fraction of users sampled per round (default: the task\'s, 0.1).')
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', None, 'Cohort size; overrides --client_fraction.')
_ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', 1, 'Evaluate all users every this many rounds.')
_ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 10, 'Checkpoint every this many rounds (0: never).')
_SIMULATION = flags.DEFINE_enum(
    'simulation', 'auto', ['auto', 'vectorized', 'per_user'],
    'per_user: one user per TFF client (the deployable form); vectorized: '
    'several users per TFF client with per-user math vectorized (same '
    'results, much faster; persistent state and gradient updates only); '
    'auto: vectorized where supported.')
_MAX_GROUP_EXAMPLES = flags.DEFINE_integer(
    'max_group_examples', 16384,
    'vectorized: padded examples (users x longest batch) per TFF client.')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Show a progress bar.')
_SHARPNESS_PROBE = flags.DEFINE_float(
    'sharpness_probe', None,
    'Also measure every round the sharpness L(w + e) - L(w) of the global and '
    'the local part at this SAM radius (train/probe_sharpness_*), so runs with '
    'and without SAM compare at one radius; costs a second client pass; '
    'training is unchanged.')
_WORKERS = flags.DEFINE_string(
    'workers', None,
    'host:port,... of TFF worker services (launch/start_workers.sh) to split '
    'each round across (default: this process\'s local TFF worker). Same '
    'results; default aggregator only (docs/WORKERS.md).')
_DP_NOISE_MULTIPLIER = flags.DEFINE_float(
    'dp_noise_multiplier', None,
    'User-level DP of the global update: Gaussian noise std over the L2 clip '
    '(default: no DP; 0 clips without noise). Runs one user per TFF client.')
_DP_CLIP = flags.DEFINE_float(
    'dp_clip', None,
    'DP: L2 clip of each user\'s upload; required unless --dp_adaptive_clip '
    '(then the initial clip, default 0.1).')
_DP_ADAPTIVE_CLIP = flags.DEFINE_bool(
    'dp_adaptive_clip', False, 'DP: adapt the clip to the median upload norm.')
_DP_DELTA = flags.DEFINE_float(
    'dp_delta', None, 'DP: the delta of the reported epsilon (default 1/users).')
_SECURE_AGGREGATION = flags.DEFINE_bool(
    'secure_aggregation', False,
    'Sum the uploads with TFF\'s secure sum (32-bit quantized; in simulation '
    'this exercises the arithmetic only). Runs one user per TFF client.')


def _settings(task) -> dict:
    """All settings of the run, from the task's defaults and the flags."""
    rho_sh, rho_ns = algo.radii(task)
    if _CLIENTS_PER_ROUND.present and _CLIENT_FRACTION.present:
        raise ValueError('give --clients_per_round or --client_fraction, not both')
    return {
        'task': task.name,
        'algorithm': algo.ALGORITHM.value,
        'data_dir': os.path.abspath(_data_flags.DATA_DIR.value)
        if _data_flags.DATA_DIR.value else None,
        'validation': _data_flags.VALIDATION.value,
        'total_rounds': (task.total_rounds if _TOTAL_ROUNDS.value is None
                         else _TOTAL_ROUNDS.value),
        'client_fraction': (task.client_fraction if _CLIENT_FRACTION.value is None
                            else _CLIENT_FRACTION.value),
        'clients_per_round': _CLIENTS_PER_ROUND.value,
        'rho_sh': float(rho_sh),
        'rho_ns': float(rho_ns),
        'local_lr': algo.LOCAL_LR.value,
        'server_lr': algo.SERVER_LR.value,
        'server_optimizer': algo.SERVER_OPTIMIZER.value,
        'num_negatives': algo.NUM_NEGATIVES.value,
        'local_state': algo.LOCAL_STATE.value,
        'reconstruction_steps': algo.RECONSTRUCTION_STEPS.value,
        'loss_reduction': algo.LOSS_REDUCTION.value,
        'update': algo.UPDATE.value,
        'local_epochs': algo.LOCAL_EPOCHS.value,
        'client_lr': algo.CLIENT_LR.value,
        'client_weighting': algo.CLIENT_WEIGHTING.value,
        'rounds_per_eval': _ROUNDS_PER_EVAL.value,
        'rounds_per_checkpoint': _ROUNDS_PER_CHECKPOINT.value,
        'seed': algo.SEED.value,
        'simulation': _SIMULATION.value,
        'max_group_examples': _MAX_GROUP_EXAMPLES.value,
        'sharpness_probe': _SHARPNESS_PROBE.value,
        **{f'data_{k}': v for k, v in _data_flags.task_options(task).items()},
    }


def _privacy_settings(num_users: int) -> dict:
    """The DP and secure-aggregation settings; empty when both are off."""
    dp = _DP_NOISE_MULTIPLIER.value is not None
    needs_dp = [f'--{f.name}' for f in (_DP_CLIP, _DP_ADAPTIVE_CLIP, _DP_DELTA)
                if f.present]
    if not dp and needs_dp:
        raise ValueError(f'{", ".join(needs_dp)} needs --dp_noise_multiplier')
    if not dp and not _SECURE_AGGREGATION.value:
        return {}
    if _SIMULATION.value == 'vectorized':
        # A vectorized client uploads one mean per group of users.
        raise ValueError(
            'DP and secure aggregation act on each user\'s upload; drop '
            '--simulation=vectorized (auto runs one user per TFF client)')
    settings = {'secure_aggregation': _SECURE_AGGREGATION.value}
    if not dp:
        return settings
    clip, adaptive = _DP_CLIP.value, _DP_ADAPTIVE_CLIP.value
    delta = 1.0 / num_users if _DP_DELTA.value is None else _DP_DELTA.value
    if _DP_NOISE_MULTIPLIER.value < 0:
        raise ValueError('--dp_noise_multiplier must be >= 0')
    if algo.CLIENT_WEIGHTING.value != 'uniform':
        raise ValueError('user-level DP averages users unweighted; drop '
                         '--client_weighting=num_examples')
    if clip is None and not adaptive:
        raise ValueError('--dp_noise_multiplier needs --dp_clip (or --dp_adaptive_clip)')
    if clip is not None and clip <= 0:
        raise ValueError('--dp_clip must be positive')
    if adaptive and _SECURE_AGGREGATION.value:
        raise ValueError('--secure_aggregation with DP needs a fixed --dp_clip; '
                         'drop --dp_adaptive_clip')
    if not 0 < delta < 1:
        raise ValueError('--dp_delta must be in (0, 1)')
    settings.update(dp_noise_multiplier=_DP_NOISE_MULTIPLIER.value, dp_clip=clip,
                    dp_adaptive_clip=adaptive, dp_delta=delta)
    return settings


def _privacy_pieces(settings: dict, clients: int, num_users: int):
    """The model aggregator and the `PrivacyReport` (None, None: plain mean)."""
    if 'secure_aggregation' not in settings:
        return None, None
    from tff_fedrecgel import privacy  # pylint: disable=g-import-not-at-top
    secure = settings['secure_aggregation']
    if secure:
        privacy.use_secure_simulation_context()
    if 'dp_noise_multiplier' not in settings:
        print('privacy: secure aggregation (simulated), no DP', flush=True)
        return privacy.build_secure_aggregator(), None
    aggregator = privacy.build_dp_aggregator(
        noise_multiplier=settings['dp_noise_multiplier'], clients_per_round=clients,
        clip=settings['dp_clip'], adaptive_clip=settings['dp_adaptive_clip'],
        secure=secure)
    report = privacy.PrivacyReport(
        noise_multiplier=settings['dp_noise_multiplier'],
        sampling_probability=clients / num_users, delta=settings['dp_delta'],
        clip=settings['dp_clip'], adaptive_clip=settings['dp_adaptive_clip'])
    print(f'privacy: user-level DP, noise multiplier {report.noise_multiplier}, '
          f'clip {"adaptive" if report.adaptive_clip else report.clip}, epsilon '
          f'{report.epsilon(settings["total_rounds"]):.3g} at delta '
          f'{report.delta:.3g} after {settings["total_rounds"]} rounds; secure '
          f'aggregation {"on (simulated)" if secure else "off"}', flush=True)
    return aggregator, report


def _check_fedrecon(settings: dict) -> None:
    """Refuses flags FedRecon has no use for; records what it does."""
    unused = [f'--{name}' for name in (
        'local_state', 'loss_reduction', 'update', 'local_epochs', 'client_lr',
        'client_weighting', 'workers', 'sharpness_probe', 'server_optimizer',
        'num_negatives')
        if flags.FLAGS[name].present]
    if 'secure_aggregation' in settings:
        unused.append('DP / secure aggregation')
    if unused:
        raise ValueError(f'--algorithm=fedrecon does not take {", ".join(unused)} '
                         '(TFF\'s FedRecon: mean loss, no user state)')
    settings.update(local_state='reconstruct', loss_reduction='mean')


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    task = algo.selected_task()
    settings = _settings(task)
    if settings['num_negatives'] < 0:
        raise ValueError('--num_negatives must be >= 0')
    if settings['total_rounds'] < 1 or settings['rounds_per_eval'] < 1:
        raise ValueError('--total_rounds and --rounds_per_eval must be >= 1')
    if settings['rounds_per_checkpoint'] < 0:
        raise ValueError('--rounds_per_checkpoint must be >= 0')
    experiment = _EXPERIMENT_NAME.value or (
        f'{task.name}_{settings["algorithm"]}_seed{settings["seed"]}')

    # Fail on bad data or an unwritable folder before the slow TF imports.
    split = task.load_split(
        data_dir=_data_flags.DATA_DIR.value, validation=settings['validation'],
        **_data_flags.task_options(task))
    settings.update(_privacy_settings(split.num_users))
    if settings['algorithm'] == 'fedrecon':
        _check_fedrecon(settings)
    if _WORKERS.value and 'secure_aggregation' in settings:
        raise ValueError('DP and secure aggregation are not supported with --workers')
    from tff_fedrecgel import program  # pylint: disable=g-import-not-at-top
    paths = program.prepare_experiment(
        root_output_dir=_ROOT_OUTPUT_DIR.value, experiment_name=experiment,
        hparams=settings)

    from tff_fedrecgel.simulation import FedRecSimulation  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.simulation.simulation import clients_per_round_for  # pylint: disable=g-import-not-at-top

    clients = settings['clients_per_round'] or clients_per_round_for(
        split.num_users, settings['client_fraction'])
    model_config = algo.model_config(split.num_items)
    work = algo.client_work_config(task)
    fedrecon = settings['algorithm'] == 'fedrecon'
    # FedRecon groups users per TFF client by itself (same results).
    supported = fedrecon or (work.local_state == 'persistent'
                             and work.update == 'gradient')
    if settings['simulation'] == 'vectorized' and not supported:
        raise ValueError(
            '--simulation=vectorized needs --local_state=persistent and '
            '--update=gradient; use --simulation=per_user')
    vectorized = settings['simulation'] == 'vectorized' or (
        settings['simulation'] == 'auto' and supported
        and 'secure_aggregation' not in settings)  # Privacy: one user per client.
    stats = split.summary()
    print(f'{task.name}: {stats["users"]:,} users, {stats["items"]:,} items, '
          f'{stats["train_interactions"]:,} training rows; {clients} clients per '
          f'round; {settings["algorithm"]} (rho_sh={work.rho_sh}, '
          f'rho_ns={work.rho_ns}); {settings["total_rounds"]} rounds; '
          f'{"vectorized" if vectorized else "one user per TFF client"}',
          flush=True)
    print(f'outputs: {paths.root}', flush=True)
    print(f'view the curves: tensorboard --logdir {paths.tensorboard}', flush=True)

    start = time.perf_counter()
    aggregator, privacy_report = _privacy_pieces(settings, clients, split.num_users)
    if fedrecon:
        from tff_fedrecgel.simulation import FedReconSimulation  # pylint: disable=g-import-not-at-top
        simulation = FedReconSimulation(
            split=split, model_config=model_config, clients_per_round=clients,
            seed=settings['seed'], server_lr=settings['server_lr'],
            local_lr=settings['local_lr'],
            reconstruction_steps=settings['reconstruction_steps'],
            grouped=vectorized, max_group_examples=settings['max_group_examples'])
    else:
        simulation = FedRecSimulation(
            split=split, model_config=model_config, work=work,
            clients_per_round=clients, seed=settings['seed'],
            server_lr=settings['server_lr'],
            server_optimizer=algo.server_optimizer(),
            num_negatives=settings['num_negatives'], vectorized=vectorized,
            max_group_examples=settings['max_group_examples'],
            model_aggregator=aggregator, workers=_WORKERS.value,
            sharpness_probe=settings['sharpness_probe'])
    logging.info('built the TFF process in %.1f s', time.perf_counter() - start)
    summary = program.run_training(
        simulation, paths=paths, total_rounds=settings['total_rounds'],
        rounds_per_eval=settings['rounds_per_eval'],
        rounds_per_checkpoint=settings['rounds_per_checkpoint'],
        hparams=settings, validation=settings['validation'],
        progress=_PROGRESS.value,
        extra_train_metrics=privacy_report.round_metrics if privacy_report else None,
        extra_summary=privacy_report.summary if privacy_report else None)
    summary['wall_seconds'] = round(time.perf_counter() - start, 1)
    summary['output_dir'] = str(paths.root)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
