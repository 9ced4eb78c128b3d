"""Every user's client state, kept by the simulation driver.

In a deployment each device keeps its own state; in simulation the driver
keeps all users' states stacked (leading dimension = users) in a
`user_state_store` (in memory, or memory-mapped on disk) and feeds the
sampled users' rows into the round.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
import os

import numpy as np

from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import user_state_store

MEMORY, DISK = 'memory', 'disk'
# Rows of initial embeddings drawn at once when a disk store is created.
_CHUNK_ROWS = 1 << 16


def _flat(state: client_update.ClientState) -> dict[str, np.ndarray]:
    """A `ClientState` as the store's named arrays (in `ClientState` order)."""
    out = {f'local_weights_{i}': w for i, w in enumerate(state.local_weights)}
    out['adam_step'] = state.adam_step
    out.update({f'adam_m_{i}': m for i, m in enumerate(state.adam_m)})
    out.update({f'adam_v_{i}': v for i, v in enumerate(state.adam_v)})
    return out


def _nested(arrays: Mapping[str, np.ndarray]) -> client_update.ClientState:
    """The store's named arrays as a `ClientState`."""
    tables = sum(1 for name in arrays if name.startswith('local_weights_'))
    return client_update.ClientState(
        local_weights=[arrays[f'local_weights_{i}'] for i in range(tables)],
        adam_step=arrays['adam_step'],
        adam_m=[arrays[f'adam_m_{i}'] for i in range(tables)],
        adam_v=[arrays[f'adam_v_{i}'] for i in range(tables)])


def is_store_reference(state) -> bool:
    """Whether a checkpoint's client states name a disk store's version."""
    return isinstance(state, Mapping) and 'store_version' in state


def create_disk_store(folder: str | os.PathLike, model_config: neumf.ModelConfig, *,
                      num_users: int, seed: int) -> user_state_store.DiskStore:
    """A new disk store holding every user's starting state
    (`client_update.initial_client_states`, drawn in chunks of rows).

    Args:
      folder: The store's folder.
      model_config: The model sizes.
      num_users: Users.
      seed: Seed of the embeddings.

    Returns:
      The opened store (version 0).
    """
    dims = model_config.local_dims
    layout = ([(f'local_weights_{i}', (d,), np.float32) for i, d in enumerate(dims)]
              + [('adam_step', (), np.int32)]
              + [(f'adam_{k}_{i}', (d,), np.float32) for k in 'mv' for i, d in enumerate(dims)])
    chunks = client_update.initial_embedding_chunks(
        model_config, num_users=num_users, seed=seed, chunk_rows=_CHUNK_ROWS)

    def fill(name, write):
        if not name.startswith('local_weights_'):
            return  # Zeros.
        written = 0
        while written < num_users:  # Tables are drawn in order, as the layout's.
            _, start, rows = next(chunks)
            write(start, rows)
            written += len(rows)

    return user_state_store.DiskStore.create(folder, layout, num_users, fill)


class ClientStateTable:
    """Per-user embeddings and local Adam state, stacked over users.

    The layout is `client_update.ClientState` with a leading `[num_users]`
    axis: `local_weights`, `adam_m`, `adam_v` are lists of `[num_users, dim]`
    float32 arrays, `adam_step` is `[num_users]` int32.
    """

    def __init__(self, state: client_update.ClientState | None = None, *,
                 store: user_state_store.UserStateStore | None = None):
        """Args:
          state: Initial states, kept in a `MemoryStore` (copied).
          store: Or the store to use (e.g. a `DiskStore`).

        Raises:
          ValueError: Unless exactly one of them is given.
        """
        if (state is None) == (store is None):
            raise ValueError('give a state or a store')
        if store is None:
            state = client_update.as_client_state(state)
            store = user_state_store.MemoryStore(_flat(client_update.ClientState(
                local_weights=[np.array(a, np.float32) for a in state.local_weights],
                adam_step=np.array(state.adam_step, np.int32),
                adam_m=[np.array(a, np.float32) for a in state.adam_m],
                adam_v=[np.array(a, np.float32) for a in state.adam_v])))
        self.store = store
        self.num_users = store.num_users

    @property
    def state(self) -> client_update.ClientState:
        """Every user's state (the store's arrays, not copies)."""
        return _nested(self.store.arrays)

    def gather(self, users: Sequence[int]) -> client_update.ClientState:
        """The states of `users`, stacked on a leading axis, for the round."""
        return _nested(self.store.gather(users))

    def scatter(self, users: Sequence[int], state: client_update.ClientState) -> None:
        """Stores the round's new states of `users` (the `gather` layout;
        distinct users)."""
        self.store.scatter(users, _flat(client_update.as_client_state(state)))

    def local_tables(self) -> list[np.ndarray]:
        """The user embeddings as `[num_users, dim]` tables."""
        return list(self.state.local_weights)

    def local_rows(self, users: Sequence[int]) -> list[np.ndarray]:
        """The embeddings of `users` only, read row by row (a disk store's
        file pages are not mapped in, as indexing `local_tables` would)."""
        names = [name for name in self.store.arrays if name.startswith('local_weights_')]
        rows = self.store.gather(users, names)
        return [rows[name] for name in names]

    def checkpoint_state(self):
        """What a checkpoint saves.

        Returns:
          Every array (a `ClientState`) of a memory store; of a disk store,
          its id and the version `DiskStore.mark` gives (the files synced).
        """
        store = self.store
        if isinstance(store, user_state_store.DiskStore):
            return collections.OrderedDict(store_id=np.int64(store.store_id),
                                           store_version=np.int64(store.mark()))
        return self.state


def restore_table(saved, folder: str | os.PathLike | None, *, resume: bool) -> ClientStateTable:
    """The table a checkpoint's client states give.

    Args:
      saved: A checkpoint's client states (`checkpoint_state`).
      folder: The disk store's folder (None when the run has none).
      resume: Training resumes: a disk store is rolled back in place (the
        rows written after the checkpoint are undone); else the version is
        read into memory and the files are left as they are.

    Returns:
      The table.

    Raises:
      StoreError: If the disk store is missing, another run's, or no
        longer holds the version.
    """
    if not is_store_reference(saved):
        return ClientStateTable(saved)
    if folder is None or not user_state_store.DiskStore.exists(folder):
        raise user_state_store.StoreError(
            f'{folder}: the checkpoint names a disk user-state store, which is missing')
    store = user_state_store.DiskStore(folder, writable=resume)
    if store.store_id != int(saved['store_id']):
        raise user_state_store.StoreError(
            f'{folder}: the user-state store is not the one the checkpoint was made with')
    version = int(saved['store_version'])
    if resume:
        store.rollback(version)
        return ClientStateTable(store=store)
    if store.version == version and not store.dirty:
        # The files hold that version: map them copy-on-write (a reader's
        # writes stay in memory), no copy of the population.
        arrays = {name: np.load(store.folder / f'{name}.npy', mmap_mode='c')
                  for name in store.arrays}
    else:
        arrays = store.snapshot(version)
    store.close()
    return ClientStateTable(store=user_state_store.MemoryStore(arrays))
