"""The peers study (issue 28): the peer recommenders beside the popularity floor.

Each peer method runs under its authors' settings (the flags beyond the
common ones, `PEER_SETTINGS`); every run holds out a validation item and 10%
of the users and evaluates under both protocols, as the recipe study does.
`launch/run_study.py --plan=peers` runs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tff_fedrecgel.launch import study
from tff_fedrecgel.launch.study import Run

# FedLESAM's authors' train.py defaults: 5 local epochs of SGD at 0.1 on
# minibatches of 25, the server adding the mean change (SGD at 1).
_FEDLESAM_TRAINING = ('--local_epochs=5', '--client_lr=0.1', '--chunk_size=25',
                      '--server_optimizer=sgd', '--server_lr=1')
# PFedRec's authors train every user every round (their code's defaults:
# 4 negatives, 1 local epoch, which are the project's defaults too).
PEER_SETTINGS = {
    'pfedrec': ('--client_fraction=1',),
    # GPFedRec's and FedRAP's authors also train every user every round
    # (FedRAP's other settings are `algorithm_config.FEDRAP`, fixed).
    'gpfedrec': ('--client_fraction=1',),
    'fedrap': ('--client_fraction=1',),
    'fedlesam': (*_FEDLESAM_TRAINING, '--rho_sh=0.1'),
    # FedSAM and FedASAM train as FedLESAM's row does (their own radii,
    # 0.05 and 0.7 with eta 0.2), so the three differ only in where the
    # shared part's perturbation comes from.
    'fedsam': _FEDLESAM_TRAINING,
    'fedasam': _FEDLESAM_TRAINING,
    # FedGloSS's authors' CIFAR-10 command: 1 local epoch of SGD at 0.01 on
    # minibatches of 64, server SGD at 1, server rho 0.15.
    'fedgloss': ('--local_epochs=1', '--client_lr=0.01', '--chunk_size=64', '--rho_sh=0.15',
                 '--server_optimizer=sgd', '--server_lr=1'),
}
# The control of FedSAM's row: the same local training without SAM (FedNCF
# uploading its change, i.e. FedAvg), so that FedSAM minus it is what local
# SAM adds. Its runs are named control_<method>_seed<s>; it runs with FedSAM.
CONTROL_METHOD = 'fedncf'
CONTROL_SETTINGS = (*_FEDLESAM_TRAINING, '--update=model_delta')
PEER_SEEDS = 5
# The floors every seed gets: popularity, and each user's own history first
# (where test items repeat training pairs, as on LastFM-2K, remembering
# the history is worth much of a full-ranking figure).
FLOORS = ('itempop', 'history')
# What a row's settings are, where they are not its authors' own.
SETTINGS_SOURCE = {'fedsam': 'FedLESAM\'s local training', 'fedasam': 'FedLESAM\'s local training',
                   CONTROL_METHOD: 'FedLESAM\'s local training, no SAM (FedSAM\'s control)'}


def settings_source(method: str) -> str:
    """Whose settings a method runs under in this plan."""
    return SETTINGS_SOURCE.get(method, 'authors\' settings')


def peers_plan(datasets: Sequence[str] = study.DATASETS,
               methods: Sequence[str] = tuple(PEER_SETTINGS),
               seeds: int = PEER_SEEDS) -> list[Run]:
    """The peers study's runs: per dataset the floors, then each peer method
    (and FedSAM's control with FedSAM), `seeds` seeds each, lowest seeds first.

    Args:
      datasets: Task names.
      methods: Peer methods (names of `PEER_SETTINGS`).
      seeds: Seeds of each.

    Returns:
      The runs.

    Raises:
      ValueError: For a method without authors' settings here.
    """
    unknown = [m for m in methods if m not in PEER_SETTINGS]
    if unknown:
        raise ValueError(f'no peer settings for {", ".join(unknown)}; choose from '
                         f'{", ".join(PEER_SETTINGS)}')
    runs = []
    for dataset in datasets:
        common = dict(dataset=dataset, validation=True, heldout_users=study.RECIPE_HELDOUT,
                      eval_protocol='both',
                      rounds_per_full_eval=study.RECIPE_FULL_EVERY[dataset])
        for s in range(seeds):
            runs += [Run(name=f'{dataset}/{floor}_seed{s}', method=floor, seed=s, **common)
                     for floor in FLOORS]
            runs += [Run(name=f'{dataset}/peer_{m}_seed{s}', method=m, seed=s,
                         extra=PEER_SETTINGS[m], **common) for m in methods]
            if 'fedsam' in methods:
                runs.append(Run(name=f'{dataset}/control_{CONTROL_METHOD}_seed{s}',
                                method=CONTROL_METHOD, seed=s, extra=CONTROL_SETTINGS,
                                **common))
    return sorted(runs, key=lambda run: (run.seed, run.name))
