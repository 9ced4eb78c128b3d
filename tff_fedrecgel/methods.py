"""The methods a run can train, and what each fixes.

FedRecGEL, FedNCF and the two SAM ablations are one algorithm with different
SAM radii; FedMF is it on the GMF-only model; FedRecon is TFF's Federated
Reconstruction on the same NeuMF; PFedRec, GPFedRec and FedRAP are peer
recommenders with models and rounds of their own (a `recommenders/` package
each). Each method is one `Method`: the settings it takes and fixes, its
builder, whether it exports, is tuned and takes DP. The command line, the
API, the study plan, the tuner, the export and the simulation builder all
read this one registry: a new method is its own module (an adapter, or a
`recommenders/` package, with a `build(method, context)` function) and one
`Method(...)` entry here.
Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
import dataclasses
import importlib
import numbers
from typing import Any

from tff_fedrecgel.algorithm_config import SERVER_OPTIMIZERS
from tff_fedrecgel.errors import SettingError

FEDRECGEL = 'fedrecgel'
FEDRECON = 'fedrecon'
# A recommender with its own model and TFF round (a `recommenders/` package).
OWN_ROUND = 'own_round'
ITEMPOP = 'itempop'
CENTRAL = 'central'


# The recipe settings (and `--workers`) a method may or may not take; the
# settings every method takes (data, rounds, cohort, evaluation, seed) are
# not listed.
TRAINING_SETTINGS = ('rho_sh', 'rho_ns', 'local_lr', 'server_lr', 'server_optimizer',
                     'num_negatives', 'local_state', 'reconstruction_steps',
                     'loss_reduction', 'update', 'local_epochs', 'client_lr',
                     'client_weighting', 'sharpness_probe', 'workers', 'lr_scale')
# The FedRecGEL family's round has no rates of its own to scale.
_ROUND_TAKES = frozenset(TRAINING_SETTINGS) - {'lr_scale'}
_FEDRECGEL_BUILDER = 'tff_fedrecgel.simulation.fedrecgel_adapter:build'
# FedLESAM and FedGloSS: the server's distributor holds a state the
# multi-worker round and the sharpness probe do not carry.
_GLOBAL_SAM_TAKES = _ROUND_TAKES - {'workers', 'sharpness_probe'}
_GLOBAL_SAM_NOTE = 'the server sends the perturbation: no --workers, no sharpness probe'


@dataclasses.dataclass(frozen=True)
class PeerSettings:
    """How the peers study runs a method.

    Attributes:
      settings: The run settings beyond the study's common ones (settings
        names, as the flags spell them).
      source: Whose settings they are, as the tables say.
    """

    settings: Mapping[str, Any]
    source: str = 'authors\' settings'


# FedLESAM's authors' train.py defaults: 5 local epochs of SGD at 0.1 on
# minibatches of 25, the server adding the mean change (SGD at 1). FedSAM
# and FedASAM train the same way (with their own radii), so that the three
# differ only in where the shared part's perturbation comes from.
_FEDLESAM_TRAINING = {'local_epochs': 5, 'client_lr': 0.1, 'chunk_size': 25,
                     'server_optimizer': 'sgd', 'server_lr': 1}
_LESAM_TRAINING = PeerSettings(_FEDLESAM_TRAINING, 'FedLESAM\'s local training')
# The peer recommenders' authors train every user every round.
_EVERY_USER = PeerSettings({'client_fraction': 1})


@dataclasses.dataclass(frozen=True)
class Method:
    """One trainable method: everything the rest of the project asks of it.

    Attributes:
      name: Its `--algorithm` name.
      label: Its name in tables and figures.
      description: One line for help texts.
      rho_sh: The global radius it fixes (None: the task's or the flag's).
      rho_ns: The local radius it fixes (None: the task's or the flag's).
      gmf_only: Whether it uses the GMF-only model (no MLP branch).
      algorithm: Its family: `FEDRECGEL` (one TFF process, SAM radii as
        settings), `FEDRECON`, `OWN_ROUND` (a recommender package of its
        own: PFedRec, GPFedRec, FedRAP), `ITEMPOP` (the popularity floor)
        or `CENTRAL` (the non-federated ceiling).
      builder: `'module:function'` building its simulation algorithm from a
        `simulation.context.BuildContext` (imported when first built).
      takes: The `TRAINING_SETTINGS` it uses; given any other, a run is
        refused.
      fixes: Settings it fixes to a value (recorded as such).
      note: Why it takes so little, said with a refusal.
      private: Whether DP and secure aggregation apply to it.
      exports: Whether `launch/export.py` exports it (the FedRecGEL process).
      tunable: Whether `launch/tune.py` searches its settings.
      default_radii: `(rho_sh, rho_ns)` it uses instead of the task's when
        none is given (None: the task's).
      sam_eta: ASAM's eta of its client work (the global part's perturbation
        relative to the weights' size); None: plain SAM.
      global_perturbation: Where its global part's SAM perturbation comes
        from (`algorithm_config.GLOBAL_PERTURBATIONS`): 'local' (the client's
        gradient), 'global_change' (FedLESAM) or 'server' (FedGloSS).
      peer: How the peers study (`launch/peers_study.py`) runs it; None: it
        is not one of the study's peer methods.
      heldout_only: The settings it takes only to serve users held out of
        training (a search leaves them out when none are held out).
    """

    name: str
    label: str
    description: str
    rho_sh: float | None = None
    rho_ns: float | None = None
    gmf_only: bool = False
    algorithm: str = FEDRECGEL
    builder: str = _FEDRECGEL_BUILDER
    takes: frozenset = _ROUND_TAKES
    fixes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ''
    private: bool = True
    exports: bool = True
    tunable: bool = True
    default_radii: tuple[float, float] | None = None
    sam_eta: float | None = None
    global_perturbation: str = 'local'
    peer: PeerSettings | None = None
    heldout_only: frozenset = frozenset()

    def radii(self, rho_sh: float, rho_ns: float) -> tuple[float, float]:
        """The radii a run uses, given the task's (or the flags') radii.

        Raises:
          SettingError: If a radius is not a number.
        """
        for name, value in (('rho_sh', rho_sh), ('rho_ns', rho_ns)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise SettingError(name, 'must be a number', value)
        return (float(rho_sh if self.rho_sh is None else self.rho_sh),
                float(rho_ns if self.rho_ns is None else self.rho_ns))

    @property
    def round_unit(self) -> str | None:
        """What one of its `total_rounds` counts: 'epoch' (the central
        model), None (popularity trains nothing) or 'round' (a federated
        round)."""
        return {CENTRAL: 'epoch', ITEMPOP: None}.get(self.algorithm, 'round')

    def refused(self, names: Iterable[str]) -> list[str]:
        """Those of `names` (settings) the method does not take, in order."""
        return [n for n in names if n in TRAINING_SETTINGS
                and (n not in self.takes or n in self.fixes)]

    def build(self, context):
        """Its simulation algorithm (imports the builder's module, and TFF).

        Args:
          context: A `simulation.context.BuildContext`.
        """
        module, function = self.builder.split(':')
        return getattr(importlib.import_module(module), function)(self, context)


METHODS = {m.name: m for m in (
    Method('fedrecgel', 'FedRecGEL', 'SAM on both parts with the task\'s radii (the paper\'s method)'),
    Method('fedncf', 'FedNCF', 'no SAM (the FedNCF baseline)', rho_sh=0.0, rho_ns=0.0),
    Method('sam_global', 'SAM global only', 'SAM on the global part only (ablation)', rho_ns=0.0),
    Method('sam_local', 'SAM local only', 'SAM on the local part only (ablation)', rho_sh=0.0),
    Method('fedmf', 'FedMF', 'the GMF-only model without SAM (the FedMF baseline)',
           rho_sh=0.0, rho_ns=0.0, gmf_only=True),
    Method('fedsam', 'FedSAM', 'FedSAM: local epochs of SAM steps on the shared part, uploading '
           'its change (radius 0.05 unless given; the user embedding by plain Adam)',
           fixes={'update': 'model_delta'}, default_radii=(0.05, 0.0), peer=_LESAM_TRAINING),
    # The FedSAM authors' CIFAR-10 settings for FedASAM: rho 0.7, eta 0.2.
    Method('fedasam', 'FedASAM', 'FedASAM: FedSAM with adaptive SAM (the step scaled by '
           '|w| + 0.2 on weight matrices and embeddings; radius 0.7 unless given)',
           fixes={'update': 'model_delta'}, default_radii=(0.7, 0.0), sam_eta=0.2,
           peer=_LESAM_TRAINING),
    # FedLESAM's rho 0.1 is the default of its authors' train.py
    # (MediaBrain-SJTU/FedLESAM); FedGloSS's server rho 0.15 is its authors'
    # CIFAR-10 command (debcaldarola/fedgloss README).
    Method('fedlesam', 'FedLESAM', 'FedLESAM: FedSAM whose perturbation of the shared part is '
           'the last global model change the server sends (one backward pass a step; radius '
           '0.1 unless given; the user embedding by plain Adam)',
           rho_ns=0.0, fixes={'update': 'model_delta'}, default_radii=(0.1, 0.0),
           takes=_GLOBAL_SAM_TAKES, note=_GLOBAL_SAM_NOTE, exports=False,
           global_perturbation='global_change',
           peer=PeerSettings({**_FEDLESAM_TRAINING, 'rho_sh': 0.1})),
    Method('fedgloss', 'FedGloSS', 'FedGloSS: SAM on the server, which sends the weights moved '
           'along its last pseudo-gradient (radius 0.15 unless given) and steps the unmoved '
           'ones; clients train without SAM', rho_ns=0.0, fixes={'update': 'model_delta'},
           default_radii=(0.15, 0.0), takes=_GLOBAL_SAM_TAKES, note=_GLOBAL_SAM_NOTE,
           exports=False, global_perturbation='server',
           # Its authors' CIFAR-10 command: 1 local epoch of SGD at 0.01 on
           # minibatches of 64, server SGD at 1.
           peer=PeerSettings({'local_epochs': 1, 'client_lr': 0.01, 'chunk_size': 64,
                              'rho_sh': 0.15, 'server_optimizer': 'sgd', 'server_lr': 1})),
    Method('fedrecon', 'FedRecon', 'TFF\'s Federated Reconstruction (build_fed_recon) on the same '
           'NeuMF: no user state, embeddings rebuilt every round',
           rho_sh=0.0, rho_ns=0.0, algorithm=FEDRECON,
           builder='tff_fedrecgel.simulation.fedrecon_adapter:build',
           takes=frozenset({'rho_sh', 'rho_ns', 'local_lr', 'server_lr', 'num_negatives',
                            'reconstruction_steps', 'local_state', 'loss_reduction'}),
           fixes={'local_state': 'reconstruct', 'loss_reduction': 'mean'},
           note='TFF\'s FedRecon: mean loss, no user state', private=False,
           exports=False, tunable=False),
    Method('pfedrec', 'PFedRec', 'PFedRec (Zhang et al., IJCAI 2023): item embeddings averaged by '
           'the server, each user\'s score function kept on its device and its item view '
           'fine-tuned locally', rho_sh=0.0, rho_ns=0.0, algorithm=OWN_ROUND,
           builder='tff_fedrecgel.recommenders.pfedrec.adapter:build',
           takes=frozenset({'num_negatives', 'local_epochs', 'lr_scale'}),
           note='PFedRec: SGD at its authors\' rates (--lr_scale scales them), no server '
           'optimizer, no user embedding', private=False, exports=False, peer=_EVERY_USER),
    Method('gpfedrec', 'GPFedRec', 'GPFedRec (Zhang et al., KDD 2024): each user fine-tunes its own '
           'item table and MLP; the server relates users by their tables and sends each '
           'the graph-aggregated table as its target', rho_sh=0.0, rho_ns=0.0,
           algorithm=OWN_ROUND, builder='tff_fedrecgel.recommenders.gpfedrec.adapter:build',
           takes=frozenset({'num_negatives', 'local_epochs', 'lr_scale'}),
           note='GPFedRec: SGD at its authors\' rates (--lr_scale scales them), no server '
           'optimizer', private=False, exports=False, peer=_EVERY_USER),
    Method('fedrap', 'FedRAP', 'FedRAP (Li et al., ICLR 2024): each user\'s item table is a '
           'global part averaged by the server plus an additive part kept on its device',
           rho_sh=0.0, rho_ns=0.0, algorithm=OWN_ROUND,
           builder='tff_fedrecgel.recommenders.fedrap.adapter:build',
           takes=frozenset({'num_negatives', 'lr_scale'}),
           note='FedRAP: SGD at its authors\' rates (--lr_scale scales them) and 10 local '
           'epochs, no server optimizer, no user embedding', private=False, exports=False,
           peer=_EVERY_USER),
    Method('itempop', 'popularity', 'item popularity counted federatedly, no model (the floor)',
           rho_sh=0.0, rho_ns=0.0, algorithm=ITEMPOP,
           builder='tff_fedrecgel.simulation.baseline_adapters:build_itempop',
           takes=frozenset(), exports=False, tunable=False),
    Method('history', 'own history, then popularity', 'each user\'s own training items '
           'first, then item popularity, no model (the floor where test items repeat)',
           rho_sh=0.0, rho_ns=0.0, algorithm=ITEMPOP,
           builder='tff_fedrecgel.simulation.history_adapter:build',
           takes=frozenset(), exports=False, tunable=False),
    Method('central', 'central NeuMF', 'the same NeuMF trained centrally on the pooled data with Keras, '
           'a round = an epoch (the non-federated ceiling, not a federated method)',
           rho_sh=0.0, rho_ns=0.0, algorithm=CENTRAL,
           builder='tff_fedrecgel.simulation.baseline_adapters:build_central',
           takes=frozenset({'local_lr', 'num_negatives', 'reconstruction_steps', 'lr_scale'}),
           heldout_only=frozenset({'local_lr', 'reconstruction_steps'}),
           private=False, exports=False),
)}
METHOD_NAMES = tuple(METHODS)


def get_method(name: str) -> Method:
    """Looks a method up by name.

    Raises:
      ValueError: For an unknown name.
    """
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f'unknown method {name!r}; choose one of '
                         f'{", ".join(METHOD_NAMES)}') from None
