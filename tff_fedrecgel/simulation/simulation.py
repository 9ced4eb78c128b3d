"""Runs FedRecGEL rounds over a population of users in one process.

The round itself is the TFF computation of `build_fedrecgel_process`; this
driver samples the cohort, builds each sampled client's round batch, feeds the
sampled users' state rows in and stores the new ones, and evaluates.

Randomness is counter-based, so a checkpoint needs no generator state: the
cohort of round r comes from TFF's uniform sampling function seeded with
`seed` (a function of r), a client's batch from `default_rng([seed, r, user])`,
and the initial weights from `seed`.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
import dataclasses
import time

import numpy as np
import tensorflow_federated as tff

from tff_fedrecgel import evaluation
from tff_fedrecgel.algorithms import client_work as client_work_lib
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.algorithms import group_client_work
from tff_fedrecgel.data.client_data import FederatedTrainData
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import workers as workers_lib
from tff_fedrecgel.simulation.client_states import ClientStateTable

# Reconstruct-mode evaluation draws its reconstruction batches as "round 0"
# (training rounds are numbered from 1).
EVAL_ROUND = 0


def clients_per_round_for(num_users: int, fraction: float) -> int:
    """int(fraction * num_users), at least 1 (SPEC step 1)."""
    if not 0 < fraction <= 1:
        raise ValueError(f'client fraction must be in (0, 1], got {fraction}')
    return max(1, int(fraction * num_users))


def _flatten(value, prefix: str = '') -> dict[str, float]:
    """Nested metrics to {'a/b': float}; empty structures vanish."""
    if isinstance(value, Mapping):
        out = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f'{prefix}{key}/'))
        return out
    if isinstance(value, (list, tuple)):
        return {}
    return {prefix[:-1]: float(np.asarray(value))}


class FedRecSimulation:
    """FedRecGEL (and its settings FedNCF, ablations, FedMF) in simulation."""

    def __init__(
        self,
        *,
        split: Split,
        model_config: neumf.ModelConfig,
        work: client_work_lib.ClientWorkConfig,
        clients_per_round: int,
        seed: int = 0,
        server_lr: float = 0.001,
        server_optimizer=None,
        num_negatives: int = 4,
        model_aggregator=None,
        vectorized: bool = False,
        max_group_examples: int = 16384,
        workers: str | list[str] | None = None,
        sharpness_probe: float | None = None,
    ):
        """Builds the TFF process and the per-user data.

        Args:
          split: The preprocessed dataset.
          model_config: The model sizes (`num_items` must match the split).
          work: What each client does.
          clients_per_round: Cohort size (fixed, so TFF never retraces).
          seed: Seed of sampling, negatives and initial weights.
          server_lr: Learning rate of the server Adam.
          server_optimizer: Optional `tff.learning.optimizers` optimizer for
            the server; overrides the Adam of `server_lr`.
          num_negatives: Training negatives per positive.
          model_aggregator: Optional `tff.aggregators` factory for the update.
          vectorized: Simulate several users per TFF client, vectorized
            (equal to one user per client up to float rounding; persistent
            state and gradient updates only).
          max_group_examples: With `vectorized`, a group's padded size
            (users x longest batch) stays under this unless one user alone
            exceeds it; bounds memory.
          workers: TFF worker services (`'host:port,...'` or a list) to run
            each round on, split across them (`workers.MultiWorkerRound`);
            None runs it in this process's local TFF context.
          sharpness_probe: If given, every round also measures the sharpness
            L(w + e) - L(w) of the global and of the local part at this radius
            (e as in SAM: the radius along each client's normalized gradient)
            on the round's cohort before its update, whatever the training
            radii, so runs with and without SAM are compared at one radius.
            The probe's own updates are discarded: training is unchanged.

        Raises:
          ValueError: On inconsistent sizes, or `model_aggregator` or
            `server_optimizer` with `workers` (only the defaults are split
            across workers).
          WorkerError: If a worker does not answer.
        """
        if model_config.num_items != split.num_items:
            raise ValueError(
                f'model has {model_config.num_items} items, data {split.num_items}'
            )
        if not 1 <= clients_per_round <= split.num_users:
            raise ValueError(
                f'clients_per_round must be in [1, {split.num_users}], '
                f'got {clients_per_round}'
            )
        self.split = split
        self.model_config = model_config
        self.work = work
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.num_negatives = num_negatives
        self.persistent = work.local_state == 'persistent'
        if vectorized:
            group_client_work.check_supported(work)
        if max_group_examples < 1:
            raise ValueError('max_group_examples must be positive')
        if sharpness_probe is not None and (
                sharpness_probe <= 0 or workers is not None
                or model_aggregator is not None or not self.persistent):
            raise ValueError('sharpness_probe must be positive, with persistent '
                             'local state, no workers and no custom aggregator')
        self.vectorized = vectorized
        self.max_group_examples = max_group_examples
        self.train_data = FederatedTrainData.from_split(split)
        self.workers = None
        if workers is not None:
            # Before the slow process build: a bad worker fails fast.
            if model_aggregator is not None:
                raise ValueError(
                    'a custom model_aggregator (e.g. DP) is not supported with '
                    '--workers; only the default mean is split across workers')
            if server_optimizer is not None:
                raise ValueError('a server optimizer other than Adam is not '
                                 'supported with --workers')
            self.workers = workers_lib.MultiWorkerRound(
                workers=workers, model_config=model_config, work=work,
                server_lr=server_lr, vectorized=vectorized)
        self.process = fedrecgel.build_fedrecgel_process(
            model_config=model_config,
            work=work,
            server_lr=server_lr,
            server_optimizer=server_optimizer,
            model_aggregator=model_aggregator,
            init_seed=seed,
            vectorized=vectorized,
        )
        self._next = self.workers.next if self.workers else self.process.next
        self._probe = None
        if sharpness_probe is not None:
            self._probe = fedrecgel.build_fedrecgel_process(
                model_config=model_config,
                work=dataclasses.replace(work, rho_sh=sharpness_probe,
                                         rho_ns=sharpness_probe),
                server_lr=server_lr, server_optimizer=server_optimizer,
                init_seed=seed, vectorized=vectorized).next
        self._sample = tff.simulation.build_uniform_sampling_fn(
            range(split.num_users), replace=False, random_seed=seed
        )
        self.server_state = None
        self.client_states: ClientStateTable | None = None
        self.round_num = 0

    def initialize(self) -> None:
        """Sets round 0: initial global weights and every user's state."""
        if self.workers is not None:
            self.server_state = self.workers.initialize(self.process)
        else:
            self.server_state = self.process.initialize()
        if self.persistent:
            self.client_states = ClientStateTable.initial(
                self.model_config, num_users=self.split.num_users, seed=self.seed
            )
        self.round_num = 0

    def sample_clients(self, round_num: int) -> list[int]:
        """The cohort of `round_num` (uniform, without replacement)."""
        return [int(u) for u in self._sample(round_num, self.clients_per_round)]

    def _batches(self, users, round_num):
        return self.train_data.round_batches(
            users, seed=self.seed, round_num=round_num, num_negatives=self.num_negatives
        )

    def _groups(self, users, batches):
        """Splits a cohort into groups of similar batch length under the budget."""
        order = sorted(range(len(users)), key=lambda i: (-len(batches[i][0]), users[i]))
        groups, current, longest = [], [], 0
        for i in order:
            length = group_client_work.padded_length(len(batches[i][0]))
            longest_if_added = max(longest, length)
            if current and longest_if_added * (len(current) + 1) > self.max_group_examples:
                groups.append(current)
                current, longest_if_added = [], length
            current.append(i)
            longest = longest_if_added
        groups.append(current)
        return groups

    def _run_vectorized(self, users, batches):
        groups = self._groups(users, batches)
        members = [[users[i] for i in group] for group in groups]
        states = [self.client_states.gather_stacked(m) for m in members]
        data = [group_client_work.pad_batches([batches[i] for i in g]) for g in groups]
        probe = self._probe_metrics(states, data)
        self.server_state, new_states, metrics = self._next(
            self.server_state, states, data
        )
        metrics.update(probe)
        for m, state in zip(members, new_states):
            self.client_states.scatter_stacked(m, state)
        return metrics

    def run_round(self) -> dict[str, float]:
        """Runs the next round; returns its training metrics (flat floats)."""
        if self.server_state is None:
            raise RuntimeError('call initialize() or restore() first')
        round_num = self.round_num + 1
        start = time.perf_counter()
        users = self.sample_clients(round_num)
        batches = self._batches(users, round_num)
        if self.vectorized:
            metrics = self._run_vectorized(users, batches)
        else:
            data = [collections.OrderedDict(items=i, labels=l) for i, l in batches]
            if self.persistent:
                states = self.client_states.gather(users)
                probe = self._probe_metrics(states, data)
                self.server_state, new_states, metrics = self._next(
                    self.server_state, states, data
                )
                metrics.update(probe)
                self.client_states.scatter(users, new_states)
            else:
                self.server_state, metrics = self._next(self.server_state, data)
        self.round_num = round_num
        flat = _flatten(metrics)
        flat['sharpness_global'] = flat['sam_loss_global'] - flat['loss']
        flat['sharpness_local'] = flat['sam_loss_local'] - flat['loss']
        flat['round_seconds'] = time.perf_counter() - start
        return flat

    def _probe_metrics(self, states, data) -> dict:
        """Sharpness at the probe radius, from a discarded round."""
        if self._probe is None:
            return {}
        _, _, metrics = self._probe(self.server_state, states, data)
        return {
            'probe_sharpness_global': metrics['sam_loss_global'] - metrics['loss'],
            'probe_sharpness_local': metrics['sam_loss_local'] - metrics['loss'],
        }

    @property
    def global_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.server_state['global_weights']]

    def local_tables(self) -> list[np.ndarray]:
        """Every user's embedding as `[num_users, dim]` tables.

        Persistent mode: the stored states. Reconstruct mode: re-derived from
        each user's training data with the current global weights.
        """
        if self.persistent:
            return self.client_states.local_tables()
        users = range(self.split.num_users)
        batches = self._batches(users, EVAL_ROUND)
        return evaluation.reconstruct_local_tables(
            self.model_config, self.work, self.global_weights, batches
        )

    def evaluate(self, which: str = 'test') -> dict[str, float]:
        """HR@K and NDCG@K over all users (the fast batched path)."""
        metrics = evaluation.evaluate_users(
            self.model_config,
            self.global_weights,
            self.local_tables(),
            self.split.candidates(which),
        )
        return {k: float(v) for k, v in metrics.items()}

    def get_state(self) -> collections.OrderedDict:
        """Everything needed to resume: server state, client states, round."""
        state = collections.OrderedDict(
            round_num=np.int64(self.round_num),
            seed=np.int64(self.seed),
            server_state=self.server_state,
        )
        if self.persistent:
            state['client_states'] = self.client_states.to_arrays()
        return state

    def restore(self, state: Mapping) -> None:
        """Resumes from a `get_state()` structure."""
        if int(state['seed']) != self.seed:
            raise ValueError(
                f'checkpoint was made with seed {int(state["seed"])}, not {self.seed}'
            )
        self.server_state = state['server_state']
        if self.persistent:
            self.client_states = ClientStateTable(state['client_states'])
        self.round_num = int(state['round_num'])
