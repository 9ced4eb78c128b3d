r"""Records a few rounds of every training mode, or compares two records.

A change that must not change the numbers is checked by recording before and
after it (two checkouts, or two commits) and comparing::

    python launch/round_fingerprint.py --datasets_dir=/path/to/datasets \
        --output_dir=/tmp/before                 # at the old commit
    python launch/round_fingerprint.py --datasets_dir=/path/to/datasets \
        --output_dir=/tmp/after --compare=/tmp/before

Each mode (persistent or reconstruct user state, gradient or model-delta
upload, vectorized or one user per TFF client) trains --rounds rounds of
FedRecGEL (radii 0.05) from seed 0; the record keeps the global weights,
every user's embedding and the last round's metrics; one more mode runs
user-level DP's aggregator (clipping, no noise, one user per client). The comparison prints
each mode's largest absolute difference and whether it is bit-identical.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags
import numpy as np
# pylint: enable=g-import-not-at-top,wrong-import-position

_DATASETS_DIR = flags.DEFINE_string('datasets_dir', None, 'Folder of <task>/ raw files.')
_DATASETS = flags.DEFINE_list('datasets', ['filmtrust', 'amazon_video'], 'Tasks to record.')
_OUTPUT_DIR = flags.DEFINE_string('output_dir', None, 'Where the record goes.')
_COMPARE = flags.DEFINE_string('compare', None, 'A record to compare the new one with.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds per mode.', lower_bound=1)

MODES = {
    'persistent_gradient_vectorized': dict(simulation='vectorized'),
    'persistent_gradient_per_user': dict(simulation='per_user'),
    'reconstruct_gradient_vectorized': dict(simulation='vectorized', local_state='reconstruct'),
    'persistent_delta_vectorized': dict(simulation='vectorized', update='model_delta',
                                        local_epochs=2),
    'reconstruct_delta_per_user': dict(simulation='per_user', local_state='reconstruct',
                                       update='model_delta'),
    # User-level DP's aggregator, clipping without noise so the record is
    # deterministic (the noise is TFF's own random draw).
    'dp_clip_gradient_per_user': dict(simulation='per_user', dp_clip=0.01),
}
_MODES = flags.DEFINE_multi_enum('modes', list(MODES), list(MODES), 'Modes to record.')


def _record(out: pathlib.Path) -> None:
    from tff_fedrecgel import run_settings  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top

    _entry.tff_runtime()
    metrics = {}
    for name in _DATASETS.value:
        split = tasks.get_task(name).load_split(
            data_dir=os.path.join(_DATASETS_DIR.value, name), validation=False)
        for mode in _MODES.value:
            options = dict(MODES[mode])
            dp_clip = options.pop('dp_clip', None)
            settings = run_settings.settings(name, preset='paper', total_rounds=_ROUNDS.value,
                                             rho_sh=0.05, rho_ns=0.05, **options)
            aggregator = None
            if dp_clip is not None:
                from tff_fedrecgel import privacy  # pylint: disable=g-import-not-at-top
                aggregator = privacy.build_dp_aggregator(
                    noise_multiplier=0.0, clip=dp_clip,
                    clients_per_round=settings.cohort(split.num_users))
            simulation = settings.build_simulation(split, model_aggregator=aggregator)
            simulation.initialize()
            last = [simulation.run_round() for _ in range(_ROUNDS.value)][-1]
            arrays = simulation.algorithm.global_weights + list(
                simulation.algorithm.local_tables() or [])
            np.savez(out / f'{name}_{mode}.npz', *arrays)
            metrics[f'{name}_{mode}'] = {k: float(v) for k, v in last.items()
                                         if k in ('loss', 'sam_loss_global', 'sam_loss_local')}
            print(f'{name} {mode}: loss {metrics[f"{name}_{mode}"]["loss"]:.7f}', flush=True)
    (out / 'metrics.json').write_text(json.dumps(metrics, indent=1) + '\n')


def _compare(old: pathlib.Path, new: pathlib.Path) -> int:
    worst, identical = 0.0, True
    for path in sorted(new.glob('*.npz')):
        if not (old / path.name).is_file():
            print(f'{path.stem}: not in {old}')
            continue
        a, b = np.load(old / path.name), np.load(path)
        diff = max((float(np.max(np.abs(a[k] - b[k]))) for k in a.files if a[k].size),
                   default=0.0)
        same = all(np.array_equal(a[k], b[k]) for k in a.files)
        worst, identical = max(worst, diff), identical and same
        print(f'{path.stem}: max |diff| {diff:.3g}{", bit-identical" if same else ""}')
    old_m, new_m = (json.loads((d / 'metrics.json').read_text()) for d in (old, new))
    metric_diff = max((abs(old_m[k][m] - new_m[k][m]) for k in new_m if k in old_m
                       for m in new_m[k]), default=0.0)
    print(f'weights and user states: max |diff| {worst:.3g}; metrics: max |diff| '
          f'{metric_diff:.3g}; {"bit-identical" if identical else "not bit-identical"}')
    return 0


def main(argv):
    del argv
    if not _DATASETS_DIR.value or not _OUTPUT_DIR.value:
        raise ValueError('--datasets_dir and --output_dir are required')
    if _COMPARE.value and not (pathlib.Path(_COMPARE.value) / 'metrics.json').is_file():
        raise ValueError(f'--compare={_COMPARE.value} holds no record (no metrics.json)')
    out = pathlib.Path(_OUTPUT_DIR.value)
    out.mkdir(parents=True, exist_ok=True)
    _record(out)
    return _compare(pathlib.Path(_COMPARE.value), out) if _COMPARE.value else 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
