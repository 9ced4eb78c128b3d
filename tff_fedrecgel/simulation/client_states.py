"""Every user's client state, kept by the simulation driver.

In a deployment each device keeps its own state; in simulation the driver
keeps all users' states stacked (leading dimension = users) and feeds the
sampled users' rows into the round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tff_fedrecgel.algorithms import client_update


class ClientStateTable:
    """Per-user embeddings and local Adam state, stacked over users.

    The layout is `client_update.ClientState` with a leading `[num_users]`
    axis: `local_weights`, `adam_m`, `adam_v` are lists of `[num_users, dim]`
    float32 arrays, `adam_step` is `[num_users]` int32.
    """

    def __init__(self, state: client_update.ClientState):
        state = client_update.as_client_state(state)
        self.state = client_update.ClientState(
            local_weights=[np.array(a, np.float32) for a in state.local_weights],
            adam_step=np.array(state.adam_step, np.int32),
            adam_m=[np.array(a, np.float32) for a in state.adam_m],
            adam_v=[np.array(a, np.float32) for a in state.adam_v])
        self.num_users = int(self.state.adam_step.shape[0])

    def gather(self, users: Sequence[int]) -> client_update.ClientState:
        """The states of `users`, stacked on a leading axis, for the round."""
        index = np.asarray(users, np.int64)
        return client_update.ClientState(
            local_weights=[w[index] for w in self.state.local_weights],
            adam_step=self.state.adam_step[index],
            adam_m=[m[index] for m in self.state.adam_m],
            adam_v=[v[index] for v in self.state.adam_v])

    def scatter(self, users: Sequence[int], state: client_update.ClientState) -> None:
        """Stores the round's new states of `users` (the `gather` layout)."""
        index = np.asarray(users, np.int64)
        state = client_update.as_client_state(state)
        for field in ('local_weights', 'adam_m', 'adam_v'):
            for table, value in zip(getattr(self.state, field), getattr(state, field)):
                table[index] = value
        self.state.adam_step[index] = state.adam_step

    def local_tables(self) -> list[np.ndarray]:
        """The user embeddings as `[num_users, dim]` tables."""
        return list(self.state.local_weights)
