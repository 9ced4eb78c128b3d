"""The history floor: each user's own training items first, then popularity.

No model is trained. Item popularity is counted federatedly, as the
popularity floor does (`baseline_adapters.ItemPop`), and each user ranks the
items of its own training history above every other item, on the device.
Neither protocol ranks a user's other training items, so the bonus only
matters where the held-out item is itself one of them: on LastFM-2K about
half of the users' test items repeat a training pair (tag assignments),
and a method that remembers each user's history gets that half for free.
This floor says how much of a figure that alone explains.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.simulation import baseline_adapters


class HistoryFirst(baseline_adapters.ItemPop):
    """Popularity with each user's own history first (an `Algorithm` of the
    driver whose users score items themselves)."""

    item_scores = None  # Every user ranks by a score vector of its own.

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(self.state['counts'])]

    def projector_tables(self) -> None:
        return None  # No item tables to show.

    def score_items(self, users: Sequence[int],
                    batches: Sequence[Batch] | None) -> np.ndarray:
        """Scores in [0, 2): popularity scaled below 1, plus 1 on the user's
        own items (its training rows, or a new user's positives in `batches`).

        Args:
          users: The users scored.
          batches: None for training users; for users never seen in training,
            their batches (`(items, labels)`), whose positives are their
            history.

        Returns:
          float32 `[len(users), num_items]`.
        """
        counts = np.asarray(self.state['counts'], np.float32)
        scores = np.tile(counts / (counts.max() + 1.0), (len(users), 1))
        for row, user in enumerate(users):
            if batches is None:
                own = self._items[self._indptr[user]:self._indptr[user + 1]]
            else:
                items, labels = batches[row]
                own = np.asarray(items)[np.asarray(labels) > 0]
            scores[row, own] += 1.0
        return scores


def build(method, context) -> HistoryFirst:
    """The history floor's algorithm (its `methods.Method.builder`)."""
    del method
    return HistoryFirst(split=context.split, model_config=context.model_config,
                        model_aggregator=context.model_aggregator)
