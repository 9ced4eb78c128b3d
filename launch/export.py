r"""Exports the TFF computations a FedRecGEL deployment needs.

Examples (from the repository root)::

    .venv/bin/python launch/export.py --task=synthetic \
        --output_dir=export/synthetic
    .venv/bin/python launch/export.py --task=filmtrust \
        --data_dir=/path/to/filmtrust --output_dir=export/filmtrust

The task only determines the item count (read from its data; synthetic needs
none) and the default SAM radii; everything else comes from the flags, with
the same defaults as launch/train.py. Writes into --output_dir one serialized
`tff.framework.serialize_computation` proto per computation (`<name>.pb`:
initialize, next, federated_evaluation, client_update, server_update,
mapreduce_round and its MapReduceForm and DistributeAggregateForm pieces), the
two forms' summaries, and manifest.json (file, type signature and side of every
computation, the hyperparameters baked in, bytes per device and round). See
docs/PRODUCTION.md. The last printed line is one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

if __package__ in (None, ''):
    # Run as `python launch/export.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import _entry

# Level 3 (setup_environment) also keeps out the harmless C++ errors Grappler
# logs while the MapReduce forms compile ("Failed to detect the fetch node(s)").
_entry.setup_environment()

from absl import flags

from launch import _algorithm_flags as algo
from launch import _data_flags
from tff_fedrecgel import methods
from tff_fedrecgel.errors import DataError
# pylint: enable=g-import-not-at-top,wrong-import-position

# --help lists the shared flags this script uses with its own.
flags.adopt_module_key_flags(algo)
flags.adopt_module_key_flags(_data_flags)

_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Folder for the exported computations (required).')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Write into a non-empty --output_dir.')


def _check_output_dir(path: str) -> str:
    """Fails early (before the slow imports) on an unusable output folder."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise DataError(f'{path}: --output_dir exists and is not a folder')
        if os.listdir(path) and not _OVERWRITE.value:
            raise DataError(f'{path}: --output_dir is not empty (pass --overwrite '
                            'to write into it)')
        target = path
    else:
        target = os.path.dirname(path)
        while target and not os.path.exists(target):
            target = os.path.dirname(target)
    if not os.access(target or '.', os.W_OK):
        raise OSError(f'{path}: --output_dir is not writable')
    return path


def _folder_bytes(path: str, names: list[str]) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in names)


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    task = algo.selected_task()
    if not _OUTPUT_DIR.value:
        raise DataError('--output_dir is required')
    output_dir = _check_output_dir(_OUTPUT_DIR.value)
    algo.radii(task)  # Flag conflicts fail before the data is read.
    if methods.get_method(algo.ALGORITHM.value).algorithm != methods.FEDRECGEL:
        raise ValueError(f'--algorithm={algo.ALGORITHM.value} is not of the FedRecGEL '
                         'family, which is what export exports')
    options = _data_flags.task_options(task)
    # Only the item count is needed from the data; read it before the slow
    # TensorFlow imports so that data errors come quickly.
    split = task.load_split(data_dir=_data_flags.DATA_DIR.value, **options)

    _entry.tff_runtime()  # TFF's worker dies with this process.
    from tff_fedrecgel import export  # pylint: disable=g-import-not-at-top

    settings = algo.settings(task)
    work = algo.client_work_config(settings)
    model_config = algo.model_config(split.num_items)
    print(f'{task.name}: {split.num_items:,} items; {algo.ALGORITHM.value} '
          f'(rho_sh={work.rho_sh}, rho_ns={work.rho_ns}, {work.local_state} device state, '
          f'{work.update} upload); exporting to {output_dir}', flush=True)
    deployment = export.build_deployment(
        model_config=model_config, work=work, server_lr=settings['server_lr'],
        init_seed=algo.SEED.value)
    manifest = export.write_deployment(
        deployment, output_dir,
        extra_hyperparameters={
            'task': task.name,
            'algorithm': algo.ALGORITHM.value,
            'data_dir': (os.path.abspath(_data_flags.DATA_DIR.value)
                         if _data_flags.DATA_DIR.value else None),
            'data_options': {k: v for k, v in options.items() if v is not None},
        })
    files = [entry['file'] for entry in manifest['computations'].values()]
    files += list(manifest['forms'].values()) + [export.MANIFEST_NAME]
    print(json.dumps({
        'output_dir': output_dir,
        'computations': list(manifest['computations']),
        'num_items': model_config.num_items,
        'traffic_per_device_and_round': manifest['traffic_per_device_and_round'],
        'files': len(files),
        'total_bytes': _folder_bytes(output_dir, files),
    }), flush=True)
    return 0


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
