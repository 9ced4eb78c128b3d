"""What each export does with each setting of a run: honours, ignores, refuses.

Two exports read a run's settings (`run_settings.Settings` and the privacy
settings `hparams.json` records):

  computations   launch/export.py without --run_dir: the deployment's TFF
                 computations (`export.build_deployment`) and manifest.json;
  saved_model    launch/export.py --run_dir, `api.Experiment.export`: the
                 trained model as a SavedModel (`serving.py`).

For every setting, `DECISIONS` says per export whether it is honoured (the
export reproduces it: baked into the graphs, recorded in the manifest or
model.json, or it picks what is served), irrelevant (it shapes training or
its measurement only; the export does not depend on it), or refused (export
stops with one line rather than drop it). `tests/test_export_settings.py`
fails when a setting has no decision. Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import dataclasses
from typing import Any

from tff_fedrecgel import methods
from tff_fedrecgel import run_settings
from tff_fedrecgel.errors import SettingError
from tff_fedrecgel.evaluation import protocols

HONOURS = 'honours'
IRRELEVANT = 'irrelevant'
REFUSES = 'refuses'
# Honoured for some values and refused for others (`check_*` decide).
HONOURS_OR_REFUSES = 'honours or refuses'
KINDS = (HONOURS, IRRELEVANT, REFUSES, HONOURS_OR_REFUSES)
EXPORTS = ('computations', 'saved_model')

# The privacy settings (`run_settings.Settings` fields, recorded when on).
PRIVACY_SETTINGS = run_settings.PRIVACY_SETTINGS
# Method families the SavedModel serves: a NeuMF with user embeddings (stored
# or rebuilt). The others score with per-user models or have no model.
SERVED_FAMILIES = (methods.FEDRECGEL, methods.FEDRECON, methods.CENTRAL)
_PLAIN_MEAN = 'the exported round aggregates with the plain weighted mean'


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the two exports do with one setting, and why.

    Attributes:
      computations: A name of `KINDS`, for the deployment's computations.
      saved_model: A name of `KINDS`, for the trained model.
      why: One phrase: how it is honoured, or why it does not matter or is
        refused.
      refusal: What a refusal says (for `REFUSES`; the checks word the
        refusals of `HONOURS_OR_REFUSES`).

    Raises:
      ValueError: On a kind outside `KINDS`.
    """

    computations: str
    saved_model: str
    why: str
    refusal: str = ''

    def __post_init__(self):
        for kind in (self.computations, self.saved_model):
            if kind not in KINDS:
                raise ValueError(f'a decision is one of {KINDS}, got {kind!r}')
        if REFUSES in (self.computations, self.saved_model) and not self.refusal:
            raise ValueError('a refusal needs its words')


_d = Decision
_H, _I, _R, _HR = HONOURS, IRRELEVANT, REFUSES, HONOURS_OR_REFUSES
_TRAINING = 'shapes training only; the exported weights are its result'
_SCHEDULE = 'schedules the simulated run, not a deployment or the served model'

DECISIONS: Mapping[str, Decision] = {
    # Data and method.
    'task': _d(_H, _H, 'its item count, radii and ids'),
    'algorithm': _d(_HR, _HR, 'computations: the FedRecGEL family (methods.exports); '
                    'SavedModel: NeuMF methods; others are refused'),
    'data_dir': _d(_H, _H, 'the data the item count and ids come from'),
    'data_options': _d(_H, _H, 'how the data is read (its items and ids)'),
    'validation': _d(_I, _H, 'SavedModel: the round chosen on the validation item is served'),
    'preset': _d(_H, _I, 'computations: fills in the settings baked in; SavedModel: '
                 + _TRAINING),
    # The client work: baked into client_update and recorded in the manifest.
    'rho_sh': _d(_H, _I, 'SAM radius in client_update; ' + _TRAINING),
    'rho_ns': _d(_H, _I, 'SAM radius in client_update; ' + _TRAINING),
    'local_lr': _d(_H, _H, 'the local Adam step, and the rebuild of an embedding'),
    'num_negatives': _d(_H, _H, 'negatives a device draws per positive (manifest), and '
                        'those of a rebuilt user\'s batch'),
    'local_state': _d(_H, _H, 'persistent or rebuilt embeddings'),
    'reconstruction_steps': _d(_H, _H, 'steps of a rebuild'),
    'loss_reduction': _d(_H, _H, 'the loss of client_update and of a rebuild'),
    'update': _d(_H, _I, 'the upload of client_update; ' + _TRAINING),
    'local_epochs': _d(_H, _I, 'model_delta\'s epochs in client_update; ' + _TRAINING),
    'client_lr': _d(_H, _I, 'model_delta\'s rate in client_update; ' + _TRAINING),
    'lr_scale': _d(_I, _I, 'the rates of methods that do not export (PFedRec, GPFedRec, '
                   'FedRAP, central)'),
    'chunk_size': _d(_H, _H, 'the loss\'s chunks (client_update and a rebuild)'),
    # The server.
    'server_lr': _d(_H, _I, 'the server optimizer in server_update; ' + _TRAINING),
    'server_optimizer': _d(_H, _I, 'the server optimizer in server_update; ' + _TRAINING),
    'client_weighting': _d(_H, _I, 'the upload weights of client_update; ' + _TRAINING),
    'seed': _d(_H, _H, 'the initial weights, and a rebuilt user\'s negatives'),
    # The model.
    'gmf_dim': _d(_H, _H, 'the NeuMF sizes'),
    'mlp_dim': _d(_H, _H, 'the NeuMF sizes'),
    'mlp_layers': _d(_H, _H, 'the NeuMF sizes'),
    # Evaluation.
    'eval_protocol': _d(_HR, _H, 'computations: one federated evaluation per protocol '
                        '(full ranking with persistent embeddings only); SavedModel: under '
                        'full ranking its validation round is served'),
    'top_ks': _d(_H, _I, 'the federated evaluations\' cut-offs; recommend takes its own k'),
    'eval_negatives': _d(_H, _I, 'what a device draws for the sampled protocol (manifest); '
                         'serving ranks every item'),
    'eval_users': _d(_I, _I, 'which simulated users are evaluated'),
    'eval_scoring': _d(_I, _I, 'how the simulation scores its users; a device scores its '
                       'own'),
    'rounds_per_eval': _d(_I, _I, _SCHEDULE),
    'rounds_per_full_eval': _d(_I, _I, _SCHEDULE),
    'heldout_users': _d(_I, _H, 'SavedModel: the held-out users\' embeddings are rebuilt'),
    'early_stopping_patience': _d(_I, _I, _SCHEDULE),
    # The simulation.
    'total_rounds': _d(_I, _I, _SCHEDULE),
    'client_fraction': _d(_I, _I, 'the simulated cohort; a deployment samples its own'),
    'clients_per_round': _d(_I, _I, 'the simulated cohort; a deployment samples its own'),
    'rounds_per_checkpoint': _d(_I, _I, _SCHEDULE),
    'simulation': _d(_I, _I, 'how users are packed into TFF clients; the device form is '
                     'one user'),
    'max_group_examples': _d(_I, _I, 'how users are packed into TFF clients'),
    'sharpness_probe': _d(_I, _I, 'a measurement of the simulated run'),
    'user_state_store': _d(_I, _I, 'where the simulation keeps every user\'s state (a device '
                           'keeps its own); the served embeddings are the checkpoint\'s '
                           'either way'),
    # Privacy: the deployment's aggregator is the plain weighted mean.
    **{name: _d(_R, _H, f'computations: {_PLAIN_MEAN}; SavedModel: the served weights '
                'are the private run\'s, recorded in model.json',
                refusal=f'{_PLAIN_MEAN} (DP and secure aggregation are not exported)')
       for name in PRIVACY_SETTINGS},
}


def undecided() -> list[str]:
    """Settings of a run that `DECISIONS` does not cover (should be none).

    Returns:
      Their names (`Settings` fields).
    """
    names = [f.name for f in dataclasses.fields(run_settings.Settings)]
    return [n for n in names if n not in DECISIONS]


def _refuse(name: str, reason: str, value: Any) -> SettingError:
    return SettingError(name, f'is refused by export: {reason}', value)


def _in_use(value: Any) -> bool:
    return value not in (None, False)


def check_computations(settings: run_settings.Settings) -> None:
    """Refuses, in one line, a run the deployment's computations cannot honour.

    Args:
      settings: The settings the computations are built from.

    Raises:
      SettingError: A method outside the FedRecGEL family, DP or secure
        aggregation, or full ranking with rebuilt embeddings.
    """
    method = methods.get_method(settings.algorithm)
    if not method.exports:
        raise _refuse('algorithm', 'the computations are the FedRecGEL family\'s process',
                      settings.algorithm)
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    for name, decision in DECISIONS.items():
        if decision.computations == REFUSES and _in_use(values.get(name)):
            raise _refuse(name, decision.refusal, values[name])
    if (settings.local_state == 'reconstruct'
            and protocols.FULL in protocols.selected(settings.eval_protocol)):
        raise _refuse('eval_protocol', 'no federated full ranking rebuilds embeddings '
                      'first (local_state=reconstruct); use sampled', settings.eval_protocol)


def check_saved_model(settings: run_settings.Settings,
                      recorded: Iterable[str] = ()) -> None:
    """Refuses, in one line, a run the SavedModel cannot serve.

    Args:
      settings: The run's settings.
      recorded: Other settings the run recorded (`Settings.from_hparams`'
        foreign names); each needs a decision.

    Raises:
      SettingError: A method that does not serve NeuMF users, or a recorded
        setting without a decision.
    """
    method = methods.get_method(settings.algorithm)
    if method.algorithm not in SERVED_FAMILIES:
        raise _refuse('algorithm', 'its users score with models of their own or with none; '
                      'the SavedModel serves NeuMF methods', settings.algorithm)
    for name in recorded:
        decision = DECISIONS.get(name)
        if decision is None:
            raise _refuse(name, 'the run recorded a setting export does not know', None)
        if decision.saved_model == REFUSES:
            raise _refuse(name, f'the run recorded it; {decision.refusal}', None)


def eval_protocols(settings: run_settings.Settings) -> tuple[str, ...]:
    """The protocols whose federated evaluations the computations include.

    Args:
      settings: The settings exported.

    Returns:
      Names of `evaluation.protocols.NAMES`, in release order.
    """
    return tuple(p.name for p in protocols.selected(settings.eval_protocol))


def table() -> list[tuple[str, str, str, str]]:
    """The decisions as rows, for docs and tests.

    Returns:
      `(setting, computations, saved_model, why)` tuples.
    """
    return [(name, d.computations, d.saved_model, d.why) for name, d in DECISIONS.items()]
