"""The torch side shared by the oracle scripts run in the authors' environment.

Imported by launch/oracle_*_authors.py (run as scripts, so this folder is on
their path); needs only torch.
"""

import torch


class EpochLoader:
    """Each iteration is the next epoch's minibatches, in the case's order.

    Stands in for a user's shuffled `DataLoader` in the authors' code, so
    both sides see the same minibatches: `orders` holds one row per epoch of
    example indices, padded with -1.
    """

    def __init__(self, dataset_cls, items, labels, orders, batch_size):
        self._epochs = []
        for order in orders:
            order = order[order >= 0]
            self._epochs.append(torch.utils.data.DataLoader(dataset_cls(
                user_tensor=torch.zeros(len(order), dtype=torch.long),
                item_tensor=torch.LongTensor(items[order]),
                target_tensor=torch.FloatTensor(labels[order])),
                batch_size=batch_size, shuffle=False))
        self._next = 0

    def __iter__(self):
        loader = self._epochs[self._next]
        self._next += 1
        return iter(loader)
