"""FedRecGEL (and FedNCF, the ablations, FedMF) behind the driver's protocol.

The round is the TFF process of `fedrecgel.build_round_pieces`; this adapter
packs the sampled users into TFF clients (`data.batching`), feeds their
stored states in and keeps the new ones (`ClientStateTable`). A TFF client
stands for a group of users whose per-user math is vectorized (the default:
same results as one user per client, far faster) or for one user
(`users_per_client=1`, the deployable structure, needed where the
aggregator must see each user's upload: differential privacy and secure
aggregation).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import dataclasses
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_update as client_update_lib
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import global_perturbation
from tff_fedrecgel.data import batching
from tff_fedrecgel.data.client_data import Batch
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import client_states as client_states_lib
from tff_fedrecgel.simulation import sharded_round
from tff_fedrecgel.simulation.client_states import ClientStateTable

DEFAULT_MAX_GROUP_EXAMPLES = batching.DEFAULT_MAX_GROUP_EXAMPLES


class FedRecGEL:
    """The FedRecGEL round over a population (an `Algorithm` of the driver)."""

    def __init__(
        self,
        *,
        model_config: neumf.ModelConfig,
        work: client_update_lib.ClientWorkConfig,
        num_users: int,
        seed: int = 0,
        server_optimizer: tff.learning.optimizers.Optimizer | None = None,
        model_aggregator: fedrecgel.Aggregator | None = None,
        users_per_client: int | None = None,
        max_group_examples: int = DEFAULT_MAX_GROUP_EXAMPLES,
        workers: str | Sequence[str] | None = None,
        sharpness_probe: float | None = None,
        user_state_store: str = client_states_lib.MEMORY,
    ):
        """Builds the TFF process.

        Args:
          model_config: The model sizes.
          work: What each user does.
          num_users: Users in the population (rows of the state table).
          seed: Seed of the initial weights and user embeddings.
          server_optimizer: Default: server Adam at 0.001.
          model_aggregator: Optional `tff.aggregators` factory for the update.
          users_per_client: Users per TFF client: None packs as many as
            `max_group_examples` allows (vectorized); 1 is one user per client.
          max_group_examples: A TFF client's padded size (users x longest
            batch) stays under this unless one user alone exceeds it.
          workers: TFF worker services (`'host:port,...'` or a list) to split
            each round across (`sharded_round.ShardedRound`); None runs it in
            this process's TFF context.
          sharpness_probe: If given, every round also measures the sharpness
            L(w + e) - L(w) of the global and of the local part at this radius
            (e as in SAM) on the round's cohort before its update, whatever
            the training radii; the probe's updates are discarded.
          user_state_store: 'memory' keeps the users' states in memory (and
            whole in checkpoints); 'disk' memory-maps them in the folder
            `use_state_folder` names (checkpoints hold a version).

        Raises:
          ValueError: On inconsistent settings.
          WorkerError: If a worker does not answer.
        """
        if max_group_examples < 1 or (users_per_client is not None and users_per_client < 1):
            raise ValueError('max_group_examples and users_per_client must be positive')
        if sharpness_probe is not None and not (
                sharpness_probe > 0 and workers is None and model_aggregator is None
                and work.persistent):
            raise ValueError('sharpness_probe must be positive, with persistent local '
                             'state, no workers and no custom aggregator')
        if work.global_perturbation != 'local' and (workers is not None
                                                    or sharpness_probe is not None):
            raise ValueError(f'global_perturbation={work.global_perturbation!r} (FedLESAM, '
                             'FedGloSS) runs without --workers and without the sharpness probe')
        if workers is not None and model_aggregator is not None:
            raise ValueError('a custom model_aggregator (e.g. DP) is not supported with '
                             '--workers; only the default mean is split across workers')
        self.model_config = model_config
        self.item_scores = None  # A NeuMF: users are ranked with their embeddings.
        self.work = self.reconstruction = work
        self.num_users = num_users
        self.seed = seed
        self.users_per_client = users_per_client
        self.max_group_examples = max_group_examples
        if user_state_store not in (client_states_lib.MEMORY, client_states_lib.DISK):
            raise ValueError(f'user_state_store must be memory or disk, got {user_state_store!r}')
        self.user_state_store = user_state_store
        self.state_folder = None

        def pieces(work):
            if work.global_perturbation != 'local':
                return fedrecgel.build_round_pieces(
                    model_config=model_config,
                    client_update=global_perturbation.build_client_update(model_config, work),
                    server_optimizer=server_optimizer, model_aggregator=model_aggregator,
                    init_seed=seed, global_perturbation=global_perturbation.
                    build_global_perturbation(work, neumf.global_weight_specs(model_config)))
            return fedrecgel.build_round_pieces(
                model_config=model_config,
                client_update=client_update_lib.build_client_update(model_config, work),
                server_optimizer=server_optimizer, model_aggregator=model_aggregator,
                init_seed=seed)

        self.pieces = pieces(work)
        self.workers = None
        if workers is not None:
            self.workers = sharded_round.ShardedRound(workers=workers, pieces=self.pieces)
        self._probe = None
        if sharpness_probe is not None:
            self._probe = pieces(dataclasses.replace(
                work, rho_sh=sharpness_probe, rho_ns=sharpness_probe)).process.next
        self.server_state = None
        self.client_states: ClientStateTable | None = None

    def use_state_folder(self, folder) -> None:
        """Where the disk store keeps the users' states.

        Args:
          folder: `<run_dir>/user_states` (created at the store's first use).
        """
        self.state_folder = folder

    def initialize(self) -> None:
        runner = self.workers or self.pieces.process
        self.server_state = runner.initialize()
        self.client_states = None
        if self.work.persistent and self.user_state_store == client_states_lib.MEMORY:
            self.client_states = ClientStateTable(client_update_lib.initial_client_states(
                self.model_config, num_users=self.num_users, seed=self.seed))
        # A disk store is written at its first use: a resume opens the
        # existing one instead (`restore`).

    def _table(self) -> ClientStateTable:
        """The users' states (a new disk store at the first use after `initialize`)."""
        if self.client_states is None:
            if self.state_folder is None:
                raise ValueError('the disk user-state store needs a folder (use_state_folder)')
            self.client_states = ClientStateTable(store=client_states_lib.create_disk_store(
                self.state_folder, self.model_config, num_users=self.num_users,
                seed=self.seed))
        return self.client_states

    def next(self, users: Sequence[int], batches: Sequence[Batch]) -> dict[str, Any]:
        groups = batching.group_by_length(
            [len(items) for items, _ in batches], max_examples=self.max_group_examples,
            max_users=self.users_per_client)
        # Padded lengths come in a few sizes: TFF's worker keeps memory for
        # every input shape it has run (one user per client included).
        data = [batching.pad_batches([batches[i] for i in g])._asdict() for g in groups]
        members = [[users[i] for i in g] for g in groups]
        run = self.workers.next if self.workers else self.pieces.process.next
        if not self.work.persistent:
            self.server_state, metrics = run(self.server_state, data)
            return metrics
        table = self._table()
        states = [table.gather(m) for m in members]
        probe = self._probe_metrics(states, data)
        self.server_state, new_states, metrics = run(self.server_state, states, data)
        # One scatter a round (the cohort's users are distinct): one journal
        # record for the disk store.
        new_states = [client_update_lib.as_client_state(s) for s in new_states]
        counts = [len(m) for m in members]
        table.scatter([u for m in members for u in m], client_update_lib.ClientState(
            *[_concatenate([getattr(s, f) for s in new_states], counts)
              for f in client_update_lib.ClientState._fields]))
        metrics.update(probe)
        return metrics

    def _probe_metrics(self, states, data) -> dict:
        """Sharpness at the probe radius, from a discarded round."""
        if self._probe is None:
            return {}
        _, _, metrics = self._probe(self.server_state, states, data)
        return {'probe_sharpness_global': metrics['sam_loss_global'] - metrics['loss'],
                'probe_sharpness_local': metrics['sam_loss_local'] - metrics['loss']}

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.server_state.global_weights]

    def local_tables(self) -> list[np.ndarray] | None:
        return self._table().local_tables() if self.work.persistent else None

    def local_rows(self, users: Sequence[int]) -> list[np.ndarray] | None:
        """`local_tables()` at the rows `users`, without reading whole tables."""
        return self._table().local_rows(users) if self.work.persistent else None

    def get_state(self) -> collections.OrderedDict:
        state = collections.OrderedDict(server_state=self.server_state.stored())
        if self.work.persistent:
            if self.client_states is None:  # The structure only: no store yet.
                state['client_states'] = collections.OrderedDict(
                    store_id=np.int64(0), store_version=np.int64(0))
            else:
                state['client_states'] = self.client_states.checkpoint_state()
        return state

    def full_state(self) -> collections.OrderedDict:
        """`get_state` with every user's state whole, whatever the store (a
        state kept apart from the checkpoints, e.g. the validation-selected one)."""
        state = collections.OrderedDict(server_state=self.server_state.stored())
        if self.work.persistent:
            state['client_states'] = self._table().state
        return state

    def restore(self, state, *, resume: bool = False) -> None:
        """Resumes from a `get_state` structure.

        Args:
          state: The structure.
          resume: Training goes on from it: a disk store rolls back in place
            (else a disk version is read into memory, the files unchanged).

        Raises:
          StoreError: If a disk store cannot give the checkpoint's version.
        """
        self.server_state = fedrecgel.ServerState(*state['server_state'])
        if self.work.persistent:
            if self.client_states is not None and hasattr(self.client_states.store, 'close'):
                self.client_states.store.close()
            self.client_states = client_states_lib.restore_table(
                state['client_states'], self.state_folder, resume=resume)


def _concatenate(parts, counts):
    """The clients' states of one field stacked over their users: arrays,
    or lists of arrays element-wise (a one-user client's may lack the
    users axis)."""
    def rows(part, n):
        part = np.asarray(part)
        return part if part.ndim and part.shape[0] == n else part.reshape((n, *part.shape))

    if isinstance(parts[0], (list, tuple)):
        return [np.concatenate([rows(p[i], n) for p, n in zip(parts, counts)])
                for i in range(len(parts[0]))]
    return np.concatenate([rows(p, n) for p, n in zip(parts, counts)])


def build(method, context) -> FedRecGEL:
    """The algorithm of a FedRecGEL-family method (its `methods.Method.builder`).

    Args:
      method: The `methods.Method` (its radii are already in `context.work`).
      context: The run's `simulation.context.BuildContext`.
    """
    del method
    optimizer = context.server_optimizer
    if isinstance(optimizer, str):
        optimizer = fedrecgel.build_server_optimizer(context.server_lr, optimizer)
    return FedRecGEL(
        model_config=context.model_config, work=context.work,
        num_users=context.split.num_users, seed=context.seed, server_optimizer=optimizer,
        model_aggregator=context.model_aggregator, users_per_client=context.users_per_client,
        max_group_examples=context.max_group_examples, workers=context.workers,
        sharpness_probe=context.sharpness_probe, user_state_store=context.user_state_store)
