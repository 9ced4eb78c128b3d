"""The peers study (issue 28): the peer recommenders beside the popularity floor.

Each peer method runs under the settings its registry entry names
(`methods.Method.peer`: the flags beyond the common ones, `PEER_SETTINGS`);
every run holds out a validation item and 10% of the users and evaluates
under both protocols, as the recipe study does.
`launch/run_study.py --plan=peers` runs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tff_fedrecgel.launch import study
from tff_fedrecgel.launch.study import Run
from tff_fedrecgel.methods import METHODS

# Each peer method's settings are its registry entry's (`Method.peer`).
PEER_SETTINGS = {name: tuple(f'--{k}={v}' for k, v in method.peer.settings.items())
                 for name, method in METHODS.items() if method.peer}
# The control of FedSAM's row: the same local training without SAM (FedNCF
# uploading its change, i.e. FedAvg), so that FedSAM minus it is what local
# SAM adds. Its runs are named control_<method>_seed<s>; it runs with FedSAM.
CONTROL_METHOD = 'fedncf'
CONTROL_SETTINGS = (*PEER_SETTINGS['fedsam'], '--update=model_delta')
PEER_SEEDS = 5
# The floors every seed gets: popularity, and each user's own history first
# (where test items repeat training pairs, as on LastFM-2K, remembering
# the history is worth much of a full-ranking figure).
FLOORS = ('itempop', 'history')


def settings_source(method: str) -> str:
    """Whose settings a method runs under in this plan."""
    if method == CONTROL_METHOD:
        return f'{METHODS["fedsam"].peer.source}, no SAM (FedSAM\'s control)'
    return METHODS[method].peer.source


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
