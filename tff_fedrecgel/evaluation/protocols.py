"""The evaluation protocols: what a user's held-out item is ranked against.

Each protocol is one object that knows its name, its metric names, the
suffix of its metric groups (`test`, `test_full`), what its candidates are,
and how it ranks: the fast batched paths, per-user scores of methods whose
users score with models of their own, the federated computation a
deployment runs, and (sampled) the Keras metrics FedRecon's TFF evaluation
takes. Every choice list of `--eval_protocol` (the flags, the settings'
check, the API, the tuner, export) is `CHOICES` here.

Imports no TensorFlow: the ranking paths load on first use, so settings and
flags can name the protocols cheaply.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from typing import Any

from tff_fedrecgel import sizes

# How full ranking scores the users (`Protocol.evaluate_model`): one at a
# time, as a device does, or 32 per matrix product; the scores are the same.
EXACT, BATCHED = 'exact', 'batched'
SCORINGS = (EXACT, BATCHED)
DEFAULT_SCORING = BATCHED

TOP_KS = sizes.TOP_KS
# `--eval_protocol` value that evaluates under every protocol.
BOTH = 'both'


def check_top_ks(top_ks: Sequence[int]) -> tuple[int, ...]:
    """The cut-offs as sorted distinct positive ints.

    Args:
      top_ks: Cut-offs K.

    Returns:
      The sorted distinct cut-offs.

    Raises:
      ValueError: If empty or not positive.
    """
    top_ks = tuple(int(k) for k in top_ks)
    if not top_ks or any(k < 1 for k in top_ks):
        raise ValueError(f'top_ks must be non-empty positive ints, got {top_ks}')
    return tuple(sorted(set(top_ks)))


def metric_names(top_ks: Sequence[int] = TOP_KS, *, mrr: bool = False) -> list[str]:
    """Metric keys in output order: 'hr@k', 'ndcg@k' for each k ascending, 'mrr'.

    Args:
      top_ks: Cut-offs K.
      mrr: Whether 'mrr' ends the list.

    Returns:
      The names.
    """
    names = [f'{m}@{k}' for k in check_top_ks(top_ks) for m in ('hr', 'ndcg')]
    return names + (['mrr'] if mrr else [])


@dataclasses.dataclass(frozen=True)
class Protocol:
    """One evaluation protocol (use `SAMPLED`, `FULL` or `get`).

    Attributes:
      name: Its `--eval_protocol` value.
      suffix: Appended to a metric group's name (`test` + suffix).
      mrr: Whether it reports MRR after HR@K and NDCG@K.
      candidates: What the held-out item is ranked against, in words.
      federated_name: The name of its federated computation in an export.
    """

    name: str
    suffix: str
    mrr: bool
    candidates: str
    federated_name: str

    def metric_names(self, top_ks: Sequence[int] = TOP_KS) -> list[str]:
        """Its metric keys (`metric_names` with its MRR).

        Args:
          top_ks: Cut-offs K.

        Returns:
          The names, in output order.
        """
        return metric_names(top_ks, mrr=self.mrr)

    def group(self, base: str) -> str:
        """A metric group's name under this protocol ('test' -> 'test_full')."""
        return base + self.suffix

    def held_out(self, split, train_data, which: str, users) -> Any:
        """What the users' `which` items are ranked with (passed back to the
        `evaluate_*` and `user_metrics` methods).

        Args:
          split: The `data.preprocess.Split`.
          train_data: The split's `client_data.FederatedTrainData`.
          which: 'test' or 'valid'.
          users: User indices.

        Returns:
          Sampled: int `[users, candidates]` (the held-out item first); full:
          `(held-out items [users], (indptr, items) of their training items)`.
        """
        raise NotImplementedError

    def evaluate_model(self, model_config, global_weights, local_tables, held_out, *,
                       top_ks: Sequence[int] = TOP_KS, sample_of: int | None = None,
                       scoring: str = DEFAULT_SCORING):
        """Mean metrics of NeuMF users with these embeddings (the batched path).

        Args:
          model_config: The NeuMF sizes.
          global_weights: Arrays in `NeuMF.global_variables` order.
          local_tables: `[users, dim]` arrays, one row per user of `held_out`.
          held_out: From `held_out`.
          top_ks: Cut-offs K.
          sample_of: The users are a sample of this many (`eval_sample`):
            standard errors are added.
          scoring: One of `SCORINGS`, how full ranking scores the users:
            'exact' one at a time, as a client does; 'batched' 32 at a time,
            faster, with the same scores (sampled ranking ignores it).

        Returns:
          OrderedDict of floats keyed as `metric_names` (and `<name>_se`).
        """
        raise NotImplementedError

    def evaluate_item_scores(self, item_scores, held_out, *,
                             top_ks: Sequence[int] = TOP_KS, sample_of: int | None = None):
        """As `evaluate_model`, for one score per item shared by every user.

        Args:
          item_scores: float `[num_items]` (e.g. item popularity).
          held_out: From `held_out`.
          top_ks: Cut-offs K.
          sample_of: As in `evaluate_model`.

        Returns:
          OrderedDict of floats keyed as `metric_names` (and `<name>_se`).
        """
        raise NotImplementedError

    def user_metrics(self, scores, held_out, *, top_ks: Sequence[int] = TOP_KS):
        """Per-user metrics of users who score every item with their own model.

        Args:
          scores: float `[users, num_items]`.
          held_out: From `held_out` for the same users.
          top_ks: Cut-offs K.

        Returns:
          OrderedDict of `[users]` values keyed as `metric_names`.
        """
        raise NotImplementedError

    def build_federated_evaluation(self, model_config, *, top_ks: Sequence[int] = TOP_KS):
        """The TFF computation a deployment runs (each device ranks its own item).

        Args:
          model_config: The NeuMF sizes.
          top_ks: Cut-offs K.

        Returns:
          A `tff.Computation` whose SERVER result is keyed as `metric_names`.
        """
        raise NotImplementedError


class _Sampled(Protocol):
    """The held-out item among its sampled negatives (the paper's protocol)."""

    def held_out(self, split, train_data, which, users):
        del train_data  # The split holds each user's sampled negatives.
        return split.candidates(which, users)

    def evaluate_model(self, model_config, global_weights, local_tables, held_out, *,
                       top_ks=TOP_KS, sample_of=None, scoring=DEFAULT_SCORING):
        from tff_fedrecgel.evaluation import sampled  # pylint: disable=g-import-not-at-top
        return sampled.evaluate_users(model_config, global_weights, local_tables, held_out,
                                      top_ks=top_ks, sample_of=sample_of)

    def evaluate_item_scores(self, item_scores, held_out, *, top_ks=TOP_KS, sample_of=None):
        from tff_fedrecgel.evaluation import sampled  # pylint: disable=g-import-not-at-top
        return sampled.evaluate_item_scores(item_scores, held_out, top_ks=top_ks,
                                            sample_of=sample_of)

    def user_metrics(self, scores, held_out, *, top_ks=TOP_KS):
        import numpy as np  # pylint: disable=g-import-not-at-top
        from tff_fedrecgel.evaluation import ranking  # pylint: disable=g-import-not-at-top
        return ranking.ranking_metrics(np.take_along_axis(scores, held_out, axis=1),
                                       top_ks=top_ks)

    def build_federated_evaluation(self, model_config, *, top_ks=TOP_KS):
        from tff_fedrecgel.evaluation import sampled  # pylint: disable=g-import-not-at-top
        return sampled.build_federated_evaluation(model_config, top_ks=top_ks)

    def keras_metrics(self, top_ks: Sequence[int] = TOP_KS) -> list:
        """HR@K and NDCG@K as Keras metrics of a batch whose first example is
        the held-out item (FedRecon's `build_fed_recon_eval` takes them).

        Args:
          top_ks: Cut-offs K.

        Returns:
          A list of `keras_metrics.RankMetric`, named `hr_at_k`, `ndcg_at_k`.
        """
        from tff_fedrecgel.evaluation import keras_metrics  # pylint: disable=g-import-not-at-top
        return keras_metrics.rank_metrics(top_ks)


class _Full(Protocol):
    """The held-out item among every item the user did not train on."""

    def held_out(self, split, train_data, which, users):
        return split.candidates(which, users)[:, 0], train_data.csr(users)

    def evaluate_model(self, model_config, global_weights, local_tables, held_out, *,
                       top_ks=TOP_KS, sample_of=None, scoring=DEFAULT_SCORING):
        from tff_fedrecgel.evaluation import full_ranking  # pylint: disable=g-import-not-at-top
        targets, csr = held_out
        if scoring not in SCORINGS:
            raise ValueError(f'scoring must be one of {SCORINGS}, got {scoring!r}')
        block_sizes = {} if scoring == BATCHED else dict(
            users_per_step=1, item_block=full_ranking.DEVICE_ITEM_BLOCK)
        return full_ranking.evaluate_full(model_config, global_weights, local_tables,
                                          targets, csr, top_ks=top_ks, sample_of=sample_of,
                                          **block_sizes)

    def evaluate_item_scores(self, item_scores, held_out, *, top_ks=TOP_KS, sample_of=None):
        from tff_fedrecgel.evaluation import full_ranking  # pylint: disable=g-import-not-at-top
        targets, csr = held_out
        return full_ranking.evaluate_item_scores(item_scores, targets, csr, top_ks=top_ks,
                                                 sample_of=sample_of)

    def user_metrics(self, scores, held_out, *, top_ks=TOP_KS):
        from tff_fedrecgel.evaluation import full_ranking  # pylint: disable=g-import-not-at-top
        from tff_fedrecgel.evaluation import ranking  # pylint: disable=g-import-not-at-top
        targets, csr = held_out
        return ranking.metrics_from_ranks(full_ranking.ranks_from_scores(scores, targets, csr),
                                          top_ks=top_ks, mrr=True)

    def build_federated_evaluation(self, model_config, *, top_ks=TOP_KS):
        from tff_fedrecgel.evaluation import full_ranking  # pylint: disable=g-import-not-at-top
        return full_ranking.build_federated_full_evaluation(model_config, top_ks=top_ks)


SAMPLED = _Sampled(
    name='sampled', suffix='', mrr=False, federated_name='federated_evaluation',
    candidates=('against its sampled negatives (eval_negatives of them; the paper\'s '
                'protocol with 99)'))
FULL = _Full(
    name='full', suffix='_full', mrr=True, federated_name='federated_full_evaluation',
    candidates='against every item the user did not train on (full ranking)')
PROTOCOLS = {p.name: p for p in (SAMPLED, FULL)}
# The protocols' names, and `--eval_protocol`'s choices (each one, or every one).
NAMES = tuple(PROTOCOLS)
CHOICES = NAMES + (BOTH,)


def get(name: str) -> Protocol:
    """The protocol named `name`.

    Args:
      name: A name of `NAMES`.

    Returns:
      The `Protocol`.

    Raises:
      ValueError: On an unknown name (one line naming the protocols).
    """
    try:
        return PROTOCOLS[name]
    except (KeyError, TypeError):
        raise ValueError(f'protocol must be one of {", ".join(NAMES)}, got {name!r}') from None


def selected(choice: str) -> tuple[Protocol, ...]:
    """The protocols an `--eval_protocol` value evaluates, in release order.

    Args:
      choice: A name of `CHOICES`.

    Returns:
      The `Protocol`s.

    Raises:
      ValueError: On a value not in `CHOICES`.
    """
    if choice == BOTH:
        return tuple(PROTOCOLS.values())
    if choice not in PROTOCOLS:
        raise ValueError(f'eval protocol must be one of {CHOICES}, got {choice!r}')
    return (PROTOCOLS[choice],)


def of_group(group: str) -> Protocol:
    """The protocol of a metric group ('test_full' -> FULL, 'valid' -> SAMPLED)."""
    for protocol in PROTOCOLS.values():
        if protocol.suffix and group.endswith(protocol.suffix):
            return protocol
    return SAMPLED
