"""Every user's client state, kept by the simulation driver.

In a deployment each device keeps its own row; in simulation the driver keeps
all rows stacked (leading dimension = users) and feeds the sampled users' rows
into the round.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

import numpy as np

from tff_fedrecgel.models import neumf


class ClientStateTable:
    """Per-user local weights and local Adam state, stacked over users.

    Layout matches `client_work.client_state_spec`: `local_weights`, `adam_m`
    and `adam_v` are lists of `[num_users, 1, dim]` arrays, `adam_step` is
    `[num_users]` int32.
    """

    def __init__(self, arrays: Mapping[str, object]):
        self.local_weights = [np.asarray(a, np.float32) for a in arrays['local_weights']]
        self.adam_m = [np.asarray(a, np.float32) for a in arrays['adam_m']]
        self.adam_v = [np.asarray(a, np.float32) for a in arrays['adam_v']]
        self.adam_step = np.asarray(arrays['adam_step'], np.int32)
        self.num_users = int(self.adam_step.shape[0])

    @classmethod
    def initial(
        cls, model_config: neumf.ModelConfig, *, num_users: int, seed: int
    ) -> ClientStateTable:
        """Fresh user embeddings, N(0, 0.01^2), and zero Adam state.

        Args:
          model_config: The model sizes.
          num_users: How many users.
          seed: Seed of the embeddings.

        Returns:
          A `ClientStateTable`.
        """
        rng = np.random.default_rng([seed, 0x5EED])
        dims = [model_config.gmf_dim]
        if model_config.use_mlp:
            dims.append(model_config.mlp_dim)
        weights = [
            rng.normal(0.0, neumf.EMBEDDING_STDDEV, (num_users, 1, d)).astype(np.float32)
            for d in dims
        ]
        zeros = [np.zeros_like(w) for w in weights]
        return cls(
            dict(
                local_weights=weights,
                adam_m=zeros,
                adam_v=[z.copy() for z in zeros],
                adam_step=np.zeros([num_users], np.int32),
            )
        )

    def gather(self, users: Sequence[int]) -> list[collections.OrderedDict]:
        """The states of `users`, one structure per user, for the round."""
        return [
            collections.OrderedDict(
                local_weights=[w[u] for w in self.local_weights],
                adam_step=self.adam_step[u],
                adam_m=[m[u] for m in self.adam_m],
                adam_v=[v[u] for v in self.adam_v],
            )
            for u in users
        ]

    def scatter(self, users: Sequence[int], states: Sequence[Mapping]) -> None:
        """Stores the round's new states of `users`."""
        for u, state in zip(users, states):
            for table, value in zip(self.local_weights, state['local_weights']):
                table[u] = value
            for table, value in zip(self.adam_m, state['adam_m']):
                table[u] = value
            for table, value in zip(self.adam_v, state['adam_v']):
                table[u] = value
            self.adam_step[u] = state['adam_step']

    def gather_stacked(self, users: Sequence[int]) -> collections.OrderedDict:
        """The states of `users` stacked on a leading user axis (`[G, dim]`)."""
        index = np.asarray(users, np.int64)
        return collections.OrderedDict(
            local_weights=[w[index, 0, :] for w in self.local_weights],
            adam_step=self.adam_step[index],
            adam_m=[m[index, 0, :] for m in self.adam_m],
            adam_v=[v[index, 0, :] for v in self.adam_v],
        )

    def scatter_stacked(self, users: Sequence[int], state: Mapping) -> None:
        """Stores a group's new states (the `gather_stacked` layout)."""
        index = np.asarray(users, np.int64)
        for name in ('local_weights', 'adam_m', 'adam_v'):
            for table, value in zip(getattr(self, name), state[name]):
                table[index, 0, :] = value
        self.adam_step[index] = state['adam_step']

    def local_tables(self) -> list[np.ndarray]:
        """The user embeddings as `[num_users, dim]` tables, for evaluation."""
        return [w[:, 0, :] for w in self.local_weights]

    def to_arrays(self) -> collections.OrderedDict:
        """A nested structure of arrays, for checkpoints."""
        return collections.OrderedDict(
            local_weights=list(self.local_weights),
            adam_m=list(self.adam_m),
            adam_v=list(self.adam_v),
            adam_step=self.adam_step,
        )

    def copy(self) -> ClientStateTable:
        return ClientStateTable(
            {k: ([a.copy() for a in v] if isinstance(v, list) else v.copy())
             for k, v in self.to_arrays().items()}
        )
