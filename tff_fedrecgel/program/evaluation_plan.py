"""What a run evaluates, when, and which rounds it selects.

Metric groups, named by what they measure (`test/hr@10` in TensorBoard and
metrics.csv):

  test, valid, heldout            the sampled protocol (the held-out item
                                  among eval_negatives sampled ones, the paper's);
  test_full, valid_full,          full ranking (the held-out item among every
  heldout_full                    item the user did not train on).

`valid*` exist with a validation item, `heldout*` when some users never
train (they rebuild their embedding from their own data). Each protocol
selects rounds two ways: on the test item's HR@10 (as the authors report)
and, with validation, on the validation item's (the honest figure); a
selection records the test and held-out metrics of its round.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
import dataclasses
import re
from typing import Any

import numpy as np

from tff_fedrecgel import sizes
from tff_fedrecgel.evaluation import eval_sample
from tff_fedrecgel.evaluation import protocols as protocols_lib

# `--eval_protocol`'s choices (the protocols', and 'both').
PROTOCOLS = protocols_lib.CHOICES
SELECT_ON = f'hr@{sizes.SELECT_K}'
# The training metrics' group; released before the evaluation groups.
TRAIN_GROUP = 'train'


def natural_key(name: str) -> tuple:
    """A sort key that compares runs of digits as numbers: hr@5 < hr@10."""
    return tuple((0, int(part), '') if part.isdigit() else (1, 0, part)
                 for part in re.split(r'(\d+)', name) if part)


@dataclasses.dataclass(frozen=True)
class Group:
    """One metric group: which users' which item, under which protocol."""

    name: str
    which: str      # 'test' or 'valid'
    heldout: bool   # The held-out users instead of the training users.
    protocol: str   # A name of `evaluation.protocols.NAMES`.


@dataclasses.dataclass(frozen=True)
class EvaluationPlan:
    """The evaluation schedule of a run.

    Attributes:
      protocol: A name of `PROTOCOLS` ('sampled', 'full' or 'both').
      rounds_per_eval: Sampled evaluation every this many rounds (and at the
        last round).
      rounds_per_full_eval: Full-ranking evaluation every this many rounds
        (and at the last round); None: as `rounds_per_eval`.
      validation: Whether the split holds a validation item.
      heldout: Whether some users never train.
      stderr: Whether the evaluations are of a sample of users
        (`eval_sample`): selections then record each metric's standard
        error (`<metric>_se`) too.
      top_ks: Cut-offs K of the evaluations (HR@K, NDCG@K).
    """

    protocol: str = protocols_lib.SAMPLED.name
    rounds_per_eval: int = 1
    rounds_per_full_eval: int | None = None
    validation: bool = False
    heldout: bool = False
    stderr: bool = False
    top_ks: tuple[int, ...] = sizes.TOP_KS

    def __post_init__(self):
        protocols_lib.selected(self.protocol)  # Raises on an unknown name.
        if self.rounds_per_eval < 1 or (self.rounds_per_full_eval is not None
                                        and self.rounds_per_full_eval < 1):
            raise ValueError('rounds_per_eval and rounds_per_full_eval must be >= 1')

    @property
    def protocols(self) -> tuple[str, ...]:
        return tuple(p.name for p in protocols_lib.selected(self.protocol))

    def due(self, protocol: str, round_num: int, total_rounds: int) -> bool:
        """Whether `protocol` is evaluated at `round_num`."""
        every = self.rounds_per_eval if protocol != protocols_lib.FULL.name else (
            self.rounds_per_full_eval or self.rounds_per_eval)
        return round_num % every == 0 or round_num == total_rounds

    def groups(self, protocol: str) -> list[Group]:
        """The metric groups of one protocol, in release order."""
        group = protocols_lib.get(protocol).group
        groups = [Group(group('test'), 'test', False, protocol)]
        if self.validation:
            groups.append(Group(group('valid'), 'valid', False, protocol))
        if self.heldout:
            groups.append(Group(group('heldout'), 'test', True, protocol))
        return groups

    def group_names(self) -> list[str]:
        """Every metric group of the run: `train`, then the evaluation groups
        in release order (test, valid, heldout; sampled, then full)."""
        return [TRAIN_GROUP] + [g.name for p in self.protocols for g in self.groups(p)]

    def column_order(self, names: Iterable[str]) -> list[str]:
        """Flattened metric names (`test/hr@10`, `eval_seconds`) in reading
        order: by group (`group_names`; other groups after them, then
        top-level names such as `eval_seconds`); within a group the ranking
        metrics as `protocols.metric_names` orders their kinds (HR, NDCG, MRR),
        each in natural order (hr@5, hr@10, hr@15, hr@20), other names after
        them in natural order.

        Args:
          names: Names, repeats allowed (e.g. every row's keys).

        Returns:
          The distinct names, ordered.
        """
        known = self.group_names()
        kinds = list(dict.fromkeys(
            n.split('@')[0] for n in protocols_lib.metric_names(mrr=True)))

        def key(name: str) -> tuple:
            group, _, metric = name.rpartition('/')
            group = group.split('/', 1)[0] if group else name
            rank = known.index(group) if group in known else (
                len(known) if '/' in name else len(known) + 1)
            kind = metric.split('@')[0]
            kind_rank = kinds.index(kind) if kind in kinds else len(kinds)
            return rank, group, kind_rank, natural_key(name)

        return sorted(dict.fromkeys(names), key=key)

    def metric_names(self, protocol: str) -> list[str]:
        """Metrics of a group: HR@K, NDCG@K, and MRR under full ranking."""
        return protocols_lib.get(protocol).metric_names(self.top_ks)

    def selections(self) -> list[tuple[str, str, str]]:
        """`(name, protocol, group selected on)` of every round selection."""
        out = []
        for protocol in self.protocols:
            group = protocols_lib.get(protocol).group
            out.append((group('test'), protocol, group('test')))
            if self.validation:
                out.append((group('valid'), protocol, group('valid')))
        return out

    @property
    def served_selection(self) -> str | None:
        """The selection whose round a run keeps and serves: chosen on the
        validation item, under full ranking when it is evaluated (the
        protocol to trust); None without a validation item."""
        if not self.validation:
            return None
        served = protocols_lib.FULL if protocols_lib.FULL.name in self.protocols else (
            protocols_lib.SAMPLED)
        return served.group('valid')

    def _recorded(self, protocol: str) -> list[str]:
        """The `group/metric` keys a selection of `protocol` records."""
        groups = [g.name for g in self.groups(protocol) if g.which == 'test']
        metrics = self.metric_names(protocol)
        if self.stderr:
            metrics = metrics + [m + eval_sample.STDERR_SUFFIX for m in metrics]
        return [f'{g}/{m}' for g in groups for m in metrics]

    def empty_best(self) -> collections.OrderedDict:
        """Best-so-far records of every selection (round 0: none yet)."""
        best = collections.OrderedDict()
        for name, protocol, _ in self.selections():
            record = collections.OrderedDict(round=np.int64(0), score=np.float64(-1.0))
            record.update((key, np.float64(0.0)) for key in self._recorded(protocol))
            best[name] = record
        return best

    def update_best(self, best: Mapping, round_num: int,
                    released: Mapping[str, Mapping[str, float]]) -> collections.OrderedDict:
        """The records after a round's evaluation (`released[group][metric]`)."""
        best = collections.OrderedDict(best)
        for name, protocol, group in self.selections():
            if group not in released:
                continue
            score = float(released[group][SELECT_ON])
            if score > float(best[name]['score']):
                record = collections.OrderedDict(round=np.int64(round_num),
                                                 score=np.float64(score))
                for key in self._recorded(protocol):
                    group_name, metric = key.split('/')
                    record[key] = np.float64(released[group_name][metric])
                best[name] = record
        return best

    def _protocol_selection(self, protocol: str) -> str:
        """The selection that stands for a protocol: on its validation item
        when there is one, else on its test item."""
        return protocols_lib.get(protocol).group('valid' if self.validation else 'test')

    def dashboard_metrics(self) -> dict[str, str]:
        """Tag -> description of the metrics TensorBoard's hparams dashboard
        shows (`selected_metrics`' tags): HR@10 and NDCG@10 of the test item
        under each protocol, at that protocol's selected round."""
        out = {}
        for protocol in self.protocols:
            name = self._protocol_selection(protocol)
            on = 'validation' if self.validation else 'test'
            for metric in ('hr@10', 'ndcg@10'):
                group = protocols_lib.get(protocol).group('test')
                out[f'selected/{group}/{metric}'] = (
                    f'{group}/{metric} at the round chosen on the {on} item\'s '
                    f'{SELECT_ON} ({name}; the step is that round).')
        return out

    def selected_metrics(self, best: Mapping) -> dict[str, tuple[int, float, str]]:
        """Tag -> (round, value, description) of `dashboard_metrics` from the
        best-so-far records; a selection with no round yet is left out."""
        out = {}
        for tag, description in self.dashboard_metrics().items():
            _, group, metric = tag.split('/')
            protocol = protocols_lib.of_group(group).name
            record = best[self._protocol_selection(protocol)]
            if int(record['round']) > 0:
                out[tag] = (int(record['round']), float(record[f'{group}/{metric}']),
                            description)
        return out

    def headline(self, best: Mapping) -> dict[str, Any]:
        """The figure a run reports first: the test metrics at the round
        chosen on the validation item (the served one), or without one, at
        the best test round, labelled as the paper's test-selected figure."""
        name = self.served_selection or self.selections()[0][0]
        protocol = protocols_lib.of_group(name)
        record = best[name]
        suffix = protocol.suffix
        label = ('chosen on the validation item' if self.served_selection
                 else 'chosen on the test item (the paper\'s test-selected figure)')
        shown = ('hr@10', 'ndcg@10')
        if self.stderr:
            shown += tuple(m + eval_sample.STDERR_SUFFIX for m in shown)
        return {'selection': name, 'protocol': protocol.name, 'round': int(record['round']),
                'chosen': label,
                **{f'test{suffix}/{m}': float(record[f'test{suffix}/{m}'])
                   for m in shown}}

    def progress_fields(self, best: Mapping,
                        released: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
        """The progress line's figure, named by its protocol: with a
        validation item, the test HR@10 at the round chosen on it so far (the
        served one, as the headline will be); without one, this round's test
        HR@10 (a test-selected best is the paper's figure, not a result)."""
        if self.served_selection:
            record = best[self.served_selection]
            protocol = protocols_lib.of_group(self.served_selection)
            if int(record['round']) <= 0:
                return {}
            return {f'valid-chosen r{int(record["round"])} {protocol.name} hr@10':
                    f'{float(record[f"test{protocol.suffix}/hr@10"]):.4f}'}
        for protocol in self.protocols:
            group = protocols_lib.get(protocol).group('test')
            if group in released:
                return {f'{protocol} hr@10': f'{float(released[group]["hr@10"]):.4f}'}
        return {}

    def popularity(self, simulation) -> dict[str, float]:
        """The popularity floor of the test item under each protocol, keyed
        as the test groups (`test/hr@10`, `test_full/hr@10`, ...): what the
        run's figures stand beside."""
        out = {}
        for protocol in self.protocols:
            group = protocols_lib.get(protocol).group('test')
            out.update((f'{group}/{k}', v) for k, v in
                       simulation.popularity('test', protocol=protocol).items())
        return out

    def summary(self, best: Mapping) -> dict[str, Any]:
        """The selections' fields of the run summary.

        The sampled protocol keeps the summary's long-standing names
        (`best_round`, `best_test_hr@10`, `best_valid_round`,
        `best_valid_test_hr@10`, ...); every selection is also under
        `selections` with all the metrics it recorded.
        """
        out: dict[str, Any] = {'headline': self.headline(best)}
        selections = {}
        for name, protocol, _ in self.selections():
            record = best[name]
            selections[name] = {'round': int(record['round']),
                                **{k: float(record[k]) for k in self._recorded(protocol)}}
            prefix = 'best' if name.startswith('test') else 'best_valid'
            suffix = protocols_lib.get(protocol).suffix
            out[f'{prefix}{suffix}_round'] = int(record['round'])
            for metric in ('hr@10', 'ndcg@10'):
                out[f'{prefix}{suffix}_test{suffix}_{metric}'] = float(
                    record[f'test{suffix}/{metric}'])
        out['selections'] = selections
        return out
