"""The frame of a search: the floor and a ceiling tuned with the same budget.

A tuned method's figure means little alone. `run_frame` searches the central
NeuMF with the same tuner, trials and time budget (the fair ceiling,
`<root>/ceiling`, a search of its own that resumes as the main one does).
`table_lines` then sets the tuned method between the floor and that ceiling:
test metrics at the round each run chose on the validation item, under each
protocol the search evaluated, and the share of the floor-to-ceiling gap the
tuned method closes. The floor is item popularity on the search's split,
which every run's summary already carries (`summary['popularity']`, the
figure `--algorithm=itempop` reaches), so it trains nothing of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import json
import pathlib
from typing import Any

from tff_fedrecgel import methods
from tff_fedrecgel import tuning
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.evaluation import protocols

CEILING_DIR = 'ceiling'
CEILING = methods.CENTRAL
# The central model's epochs at most (a round is an epoch; a search with
# fewer rounds per trial gives its ceiling as few), and the epochs without a
# better validation HR@10 after which a trial ends. At its default rate it
# peaks at epochs 47-54 on LastFM-2K but by the fifth on a generated log
# (docs/RESULTS.md, "Transfer"): a fixed count either cuts the one short or
# spends most of the other past its peak. Its validation curve can stall
# for 5 epochs and rise again, hence 8.
CEILING_EPOCHS = 60
CEILING_PATIENCE = 8
# (summary selection, its test group, protocol label), sampled first.
_SELECTIONS = tuple((p.group('valid'), p.group('test'), p.name)
                    for p in protocols.PROTOCOLS.values())


def _shared(base: Mapping[str, Any], algorithm: str) -> dict[str, Any]:
    """The search's fixed settings that `algorithm` takes too (data, sizes,
    schedule), without the training settings it does not."""
    method = methods.get_method(algorithm)
    return {k: v for k, v in base.items() if not method.refused([k])}


def ceiling_config(config: tuning.TuneConfig) -> tuning.TuneConfig:
    """The central model's search: the same objective, trials, budget and
    seed, over the default space's dimensions it takes, ranked against
    every item after each epoch, each trial ending once its validation
    metric stops improving."""
    fixed = _shared(config.base, CEILING)
    fixed['total_rounds'] = min(fixed.get('total_rounds', CEILING_EPOCHS), CEILING_EPOCHS)
    # An epoch is the whole log, many rounds' worth: rank after each, so the
    # epoch chosen is not rounded to the federated search's schedule.
    fixed['rounds_per_full_eval'] = 1
    fixed['early_stopping_patience'] = CEILING_PATIENCE
    return tuning.TuneConfig.create(
        config.task, algorithm=CEILING, fixed=fixed, objective=config.objective,
        trials=config.trials, max_minutes=config.max_minutes,
        trial_minutes=config.trial_minutes, seed=config.seed, prune_after=config.prune_after)


def run_frame(config: tuning.TuneConfig, *, root: str | pathlib.Path, split: Split,
              make_experiment: Callable[..., Any],
              on_trial_end: Callable[[dict[str, Any]], None] | None = None
              ) -> dict[str, Any]:
    """Searches the ceiling (it resumes).

    Args:
      config: The main search.
      root: The main search's folder.
      split: Its split.
      make_experiment: As `tuning.run_search`.
      on_trial_end: Called with each ceiling trial's record.

    Returns:
      `{'ceiling': the ceiling search's record}`.
    """
    ceiling = tuning.run_search(ceiling_config(config), root=pathlib.Path(root) / CEILING_DIR,
                                split=split, make_experiment=make_experiment,
                                on_trial_end=on_trial_end)
    return {'ceiling': ceiling}


def _summary(run_dir: str | pathlib.Path | None) -> dict[str, Any]:
    path = pathlib.Path(run_dir) / 'summary.json' if run_dir else None
    return json.loads(path.read_text()) if path and path.exists() else {}


def _selections(run_dir: str | pathlib.Path) -> dict[str, Any]:
    return _summary(run_dir).get('selections', {})


def _popularity(*run_dirs: str | None) -> dict[str, Any]:
    """The floor as a selections record: popularity does not change over
    rounds, so every selection of it is the summary's one figure."""
    for run_dir in run_dirs:
        floor = _summary(run_dir).get('popularity')
        if floor:
            return {selection: floor for selection, group, _ in _SELECTIONS
                    if f'{group}/hr@10' in floor}
    return {}


@dataclasses.dataclass(frozen=True)
class _Row:
    label: str
    selections: Mapping[str, Any]

    def value(self, selection: str, metric: str) -> float | None:
        record = self.selections.get(selection)
        return None if record is None else record.get(metric)


def table_lines(search: Mapping[str, Any], frame: Mapping[str, Any]) -> list[str]:
    """The tuned method beside the floor and the tuned ceiling (Markdown).

    Args:
      search: The main search's record (`tuning.run_search`).
      frame: `run_frame`'s record.

    Returns:
      The table's lines: test HR@10 and NDCG@10 at the round chosen on the
      validation item, per protocol, and the gap closed on HR@10; then, if
      no central trial ran to its end, a line saying there is no ceiling.
    """
    ceiling = frame['ceiling']
    rows = [_Row('popularity', _popularity(search.get('best_run_dir'),
                                           ceiling.get('best_run_dir')))]
    if 'best_run_dir' in ceiling:
        rows.append(_Row(f'central NeuMF (tuned, trial {ceiling["best_trial"]})',
                         _selections(ceiling['best_run_dir'])))
    if 'best_run_dir' in search:
        rows.append(_Row(f'{search["algorithm"]} (tuned, trial {search["best_trial"]})',
                         _selections(search['best_run_dir'])))
    used = [s for s in _SELECTIONS if any(r.selections.get(s[0]) for r in rows)]
    header = ['run'] + [f'{name} {protocol}' for _, _, protocol in used
                        for name in ('test HR@10', 'test NDCG@10', 'gap closed')]
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    floor, top = rows[0], (rows[1] if len(rows) > 2 else None)
    for row in rows:
        cells = [row.label]
        for selection, group, _ in used:
            hr, ndcg = (row.value(selection, f'{group}/{m}@10') for m in ('hr', 'ndcg'))
            cells += ['—' if hr is None else f'{hr:.4f}', '—' if ndcg is None else f'{ndcg:.4f}']
            low = floor.value(selection, f'{group}/hr@10')
            high = top.value(selection, f'{group}/hr@10') if top else None
            gap = (None if None in (hr, low, high) or high <= low or row in (floor, top)
                   else (hr - low) / (high - low))
            cells.append('—' if gap is None else f'{gap:.2f}')
        lines.append('| ' + ' | '.join(cells) + ' |')
    if 'best_run_dir' not in ceiling:
        # Every central trial stopped early (often on the wall clock: an
        # epoch of a large log is slow), so there is no ceiling to close to.
        lines.append(f'no ceiling: none of the central model\'s '
                     f'{ceiling.get("finished_trials", 0)} trials ran to their end; the '
                     'same command with a larger --trial_minutes or --max_minutes '
                     'resumes its search')
    return lines
