r"""Exports the TFF computations a FedRecGEL deployment needs, or a trained model.

Examples (from the repository root)::

    .venv/bin/python launch/export.py --task=synthetic \
        --output_dir=export/synthetic
    .venv/bin/python launch/export.py --task=filmtrust \
        --data_dir=/path/to/filmtrust --output_dir=export/filmtrust
    .venv/bin/python launch/export.py --run_dir=runs/filmtrust_fedrecgel_seed0 \
        --output_dir=export/filmtrust_trained

With --run_dir, the trained model of the run (the --checkpoint it serves): a
TensorFlow SavedModel holding the global weights and every user's embedding,
whose functions take and return original ids: `recommend(user_ids, k)` for
users of the data, `recommend_for_items(item_ids, k)` for a new user (its
embedding rebuilt inside), `exclude` defaulting to the user's items
(`tff_fedrecgel/serving.py`), plus model.json and items.csv. It loads with
plain `tf.saved_model.load`, without this project.
The settings come from the run (no --task, algorithm or other setting flags).

Every setting of a run is honoured, irrelevant to the export, or refused with
one line (`tff_fedrecgel/export_settings.py` says which): DP and secure
aggregation, methods that do not export, and full ranking with rebuilt
embeddings are refused.

The task only determines the item count (read from its data; synthetic needs
none) and the default SAM radii; everything else comes from the flags, with
the same defaults as launch/train.py. Writes into --output_dir one serialized
`tff.framework.serialize_computation` proto per computation (`<name>.pb`:
initialize, next, federated_evaluation (and federated_full_evaluation under
--eval_protocol=full or both), client_update, server_update,
mapreduce_round and its MapReduceForm and DistributeAggregateForm pieces), the
two forms' summaries, and manifest.json (file, type signature and side of every
computation, the hyperparameters baked in, bytes per device and round). See
docs/PRODUCTION.md (and docs/API.md for the trained model). The last printed
line is one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

if __package__ in (None, ''):
    # Run as `python launch/export.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

# Level 3 (setup_environment) also keeps out the harmless C++ errors Grappler
# logs while the MapReduce forms compile ("Failed to detect the fetch node(s)").
_entry.setup_environment()

from absl import flags

from tff_fedrecgel.launch import _algorithm_flags as algo
from tff_fedrecgel.launch import _client_flags
from tff_fedrecgel.launch import _config_file
from tff_fedrecgel.launch import _data_flags
from tff_fedrecgel.launch import _eval_flags
from tff_fedrecgel.launch import _model_flags
from tff_fedrecgel.launch import _privacy_flags
from tff_fedrecgel.launch import _ranking_flags
from tff_fedrecgel.launch import _server_flags
from tff_fedrecgel import export_settings
from tff_fedrecgel import recipes
from tff_fedrecgel.errors import DataError
from tff_fedrecgel.errors import SettingError
# pylint: enable=g-import-not-at-top,wrong-import-position

# --help lists the shared flags this script uses with its own.
flags.adopt_module_key_flags(algo)
flags.adopt_module_key_flags(_client_flags)
flags.adopt_module_key_flags(_server_flags)
flags.adopt_module_key_flags(_data_flags)
flags.adopt_module_key_flags(_model_flags)
flags.adopt_module_key_flags(_ranking_flags)
# Taken, never dropped: honoured (--eval_protocol), ignored (the evaluation
# schedule) or refused with one line (privacy); export_settings.DECISIONS.
flags.adopt_module_key_flags(_eval_flags)
flags.adopt_module_key_flags(_privacy_flags)
_config_file.define_config_flag()
flags.adopt_module_key_flags(_config_file)

_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Folder for the exported computations (required).')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Write into a non-empty --output_dir.')
_RUN_DIR = flags.DEFINE_string(
    'run_dir', None, 'Export the trained model of this run folder (written by '
    'launch/train.py) instead of the computations.')
_CHECKPOINT = _entry.define_checkpoint_flag()


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


def _check_run_flags() -> None:
    """--run_dir takes every setting from the run (--data_dir may move it)."""
    modules = (algo, _data_flags, _client_flags, _server_flags, _model_flags, _ranking_flags,
               _eval_flags, _privacy_flags)
    given = sorted({f'--{flag.name}' for module in modules
                    for flag in flags.FLAGS.get_key_flags_for_module(module.__name__)
                    if flag.present and flag.name != _data_flags.DATA_DIR.name})
    if given:
        raise DataError(f'--run_dir takes the settings of the run; drop {", ".join(given)}')
    if not _OUTPUT_DIR.value:
        raise DataError('--output_dir is required')


def _export_run(output_dir: str) -> int:
    """--run_dir: the trained model of the run (the --checkpoint it serves)."""
    from tff_fedrecgel import api  # pylint: disable=g-import-not-at-top

    run_settings, foreign, split = api.read_run(_RUN_DIR.value,
                                                data_dir=_data_flags.DATA_DIR.value)
    export_settings.check_saved_model(run_settings, foreign)  # Before the slow restore.
    with api.Session():
        experiment = api.Experiment(run_settings, run_dir=_RUN_DIR.value, split=split,
                                    foreign_settings=foreign)
        round_num = experiment.restore(checkpoint=_CHECKPOINT.value)
        print(f'{run_settings.task} {run_settings.algorithm}, round {round_num}: '
              f'exporting the trained model to {output_dir}', flush=True)
        info = experiment.export(output_dir)
    files = [os.path.join(d, f) for d, _, names in os.walk(output_dir) for f in names]
    print(json.dumps({
        'output_dir': output_dir,
        'run_dir': str(experiment.paths.root),
        'round': round_num,
        'saved_model': os.path.join(output_dir, info['saved_model']),
        'num_items': info['num_items'],
        'embedding_widths': info['embedding_widths'],
        'files': len(files),
        'total_bytes': sum(os.path.getsize(f) for f in files),
    }), flush=True)
    return 0


def main(argv: list[str]) -> int:
    """Entry point."""
    del argv  # Stray arguments are refused by _entry.run_main.
    if _RUN_DIR.value:
        _check_run_flags()
        return _export_run(_check_output_dir(_OUTPUT_DIR.value))
    if _CHECKPOINT.present:
        raise DataError('--checkpoint picks the state of --run_dir; give --run_dir')
    task = algo.selected_task()
    if not _OUTPUT_DIR.value:
        raise DataError('--output_dir is required')
    output_dir = _check_output_dir(_OUTPUT_DIR.value)
    settings = algo.settings(task)  # Flag errors fail before the data is read.
    try:
        export_settings.check_computations(settings)
    except SettingError as e:
        raise ValueError(e.flag_message()) from None
    # Only the item count is needed from the data (no sampled negatives: any
    # catalog); read it before the slow TensorFlow imports so that data
    # errors come quickly.
    split = task.load_split(data_dir=settings.data_dir, eval_negatives=0,
                            **settings.data_options)
    if recipes.needs_data(settings.preset):
        settings = algo.settings(task, recipes.DataProfile.of(split))

    _entry.tff_runtime()  # TFF's worker dies with this process.
    from tff_fedrecgel import export  # pylint: disable=g-import-not-at-top

    work = settings.client_work()
    model_config = algo.model_config(settings, split.num_items)
    print(f'{task.name}: {split.num_items:,} items; {settings.algorithm} '
          f'(rho_sh={work.rho_sh}, rho_ns={work.rho_ns}, {work.local_state} device state, '
          f'{work.update} upload); exporting to {output_dir}', flush=True)
    deployment = export.build_deployment(
        model_config=model_config, work=work, server_lr=settings.server_lr,
        server_optimizer=settings.server_optimizer, init_seed=settings.seed,
        top_ks=settings.top_ks, eval_protocols=export_settings.eval_protocols(settings))
    manifest = export.write_deployment(
        deployment, output_dir,
        extra_hyperparameters={
            'task': task.name,
            'algorithm': settings.algorithm,
            # What a device draws for the sampled protocol (the computation
            # ranks whatever candidates it is given).
            'eval_negatives': settings.eval_negatives,
            # What a device draws per positive for its round batch.
            'num_negatives': settings.num_negatives,
            'data_dir': settings.hparams()['data_dir'],
            'data_options': {k: v for k, v in settings.data_options.items()
                             if v is not None},
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
