"""The state of the round chosen on the validation item, kept to be served.

A run with a validation item keeps, beside its periodic checkpoints, the
whole simulation state (global weights and every user's state) of the round
its served selection (`EvaluationPlan.served_selection`) chose, saved when
that choice changes. `launch/recommend.py`, `launch/export.py --run_dir` and
`api.load_run` serve it by default, so the model a user gets is the one the
summary reports. It also carries what early stopping needs: how many
evaluations have passed since that round.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping, Sequence
import shutil
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tff_fedrecgel.program.outputs import ExperimentPaths, run_state_io

PREFIX = 'selected_state_'


class SelectedState:
    """Saves the selected round's state under `ExperimentPaths.selected`."""

    def __init__(self, paths: ExperimentPaths, loop: asyncio.AbstractEventLoop,
                 selection: str):
        """Opens the folder (created on the first save).

        Args:
          paths: The run's paths.
          loop: The event loop the training program runs TFF's managers on.
          selection: The name of the served selection (`valid` or
            `valid_full`).
        """
        self._loop = loop
        self._root = paths.selected
        self.selection = selection
        self._manager = tff.program.FileProgramStateManager(
            str(self._root), prefix=PREFIX, keep_total=1, keep_first=False)

    def discard_after(self, round_num: int) -> None:
        """Removes states saved after `round_num` (a run resumed from an
        earlier checkpoint recomputes them) and saves cut short."""
        if not self._root.is_dir():
            return
        for path in self._root.iterdir():
            name = path.name
            version = name[len(PREFIX):] if name.startswith(PREFIX) else ''
            if not version.isdigit() or int(version) > round_num:
                shutil.rmtree(path, ignore_errors=True)

    def save_if_chosen(self, simulation, best: Mapping[str, Any], round_num: int) -> bool:
        """Saves the state when the served selection chose `round_num`."""
        if int(best[self.selection]['round']) != round_num:
            return False
        state = collections.OrderedDict(simulation=simulation.get_state(whole=True),
                                        round=np.int64(round_num))
        run_state_io(self._loop, self._manager.save(state, round_num))
        return True


def evaluations_since(rows: Sequence[Mapping[str, Any]], group: str,
                      best_round: int) -> int:
    """Evaluations of `group` after `best_round` (early stopping's count)."""
    key = f'{group}/hr@10'
    return sum(1 for row in rows
               if row.get('round', 0) > best_round and row.get(key) not in (None, ''))
