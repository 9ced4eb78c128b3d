"""Builds a `Simulation` of any method from plain settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from typing import Any

import numpy as np

import tensorflow_federated as tff

from tff_fedrecgel import algorithm_config
from tff_fedrecgel import methods
from tff_fedrecgel import sizes
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.algorithms import fedrecgel
from tff_fedrecgel.data import batching
from tff_fedrecgel.data.client_data import heldout_users_for
from tff_fedrecgel.data.preprocess import Split
from tff_fedrecgel.evaluation import protocols
from tff_fedrecgel.models import neumf
from tff_fedrecgel.simulation import context
from tff_fedrecgel.simulation.driver import Simulation


def model_config_for(method: methods.Method, num_items: int,
                     model_sizes: Mapping[str, Any] | None = None) -> neumf.ModelConfig:
    """The NeuMF sizes a method trains (FedMF: GMF only).

    Args:
      method: The method.
      num_items: Items of the data.
      model_sizes: `gmf_dim`, `mlp_dim`, `mlp_layers` (`Settings.model_sizes`);
        None or a missing one: the paper's (`sizes`).
    """
    model_sizes = dict(model_sizes or {})
    if method.gmf_only:
        return neumf.ModelConfig(num_items=num_items, use_mlp=False, mlp_layers=(),
                                 **{k: v for k, v in model_sizes.items() if k == 'gmf_dim'})
    return neumf.ModelConfig(num_items=num_items, **model_sizes)


def build_simulation(
    *,
    split: Split,
    method: str,
    work: client_update.ClientWorkConfig,
    clients_per_round: int,
    seed: int = 0,
    server_lr: float = algorithm_config.SERVER.learning_rate,
    server_optimizer: str | tff.learning.optimizers.Optimizer = algorithm_config.SERVER.optimizer,
    num_negatives: int = sizes.TRAINING_NEGATIVES,
    users_per_client: int | None = None,
    max_group_examples: int = batching.DEFAULT_MAX_GROUP_EXAMPLES,
    model_aggregator: fedrecgel.Aggregator | None = None,
    workers: str | Sequence[str] | None = None,
    sharpness_probe: float | None = None,
    heldout_fraction: float = 0.0,
    eval_users: int | None = None,
    model_sizes: Mapping[str, Any] | None = None,
    top_ks: Sequence[int] = sizes.TOP_KS,
    user_state_store: str = 'memory',
    eval_scoring: str = protocols.DEFAULT_SCORING,
) -> Simulation:
    """A simulation of `method` on `split`.

    Args:
      split: The preprocessed dataset.
      method: A name of `methods.METHODS`; its fixed radii override `work`'s.
      work: What each user does (FedRecon uses its `local_lr` and
        `reconstruction_steps`).
      clients_per_round: Cohort size.
      seed: Seed of sampling, negatives and initial weights.
      server_lr: Learning rate of the server optimizer.
      server_optimizer: A name of `methods.SERVER_OPTIMIZERS` (at
        `server_lr`), or any `tff.learning.optimizers` optimizer (FedRecGEL
        methods; FedRecon's server is Adam).
      num_negatives: Training negatives per positive.
      users_per_client: Users per TFF client (None: as many as fit
        `max_group_examples`; 1: one user per client).
      max_group_examples: Padded examples per TFF client.
      model_aggregator: A `tff.aggregators` factory (FedRecGEL methods).
      workers: TFF worker services to split rounds across (FedRecGEL).
      sharpness_probe: Radius of the sharpness probe (FedRecGEL).
      heldout_fraction: Fraction of users never trained on, evaluated with
        embeddings rebuilt from their data (`Simulation`).
      eval_users: Evaluate a fixed sample of this many users of each
        population, with standard errors (`Simulation`); None: everyone.
      model_sizes: The NeuMF sizes (`model_config_for`).
      top_ks: Cut-offs K of the evaluations.
      user_state_store: 'memory' or 'disk' (FedRecGEL methods with
        persistent local state; `Simulation.use_state_folder` names the
        disk store's folder).
      eval_scoring: How full ranking scores the users (`Simulation`).

    Returns:
      An uninitialized `Simulation`.

    Raises:
      ValueError: On an unknown method or settings it does not take.
    """
    spec = methods.get_method(method)
    given = [name for name, value in (
        ('server_optimizer', None if server_optimizer == algorithm_config.SERVER.optimizer
         else server_optimizer),
        ('workers', workers), ('sharpness_probe', sharpness_probe)) if value is not None]
    unused = spec.refused(given)
    if model_aggregator is not None and not spec.private:
        unused.append('model_aggregator')
    if user_state_store != 'memory' and spec.algorithm != methods.FEDRECGEL:
        unused.append('user_state_store')
    if unused:
        raise ValueError(f'{method} does not take {", ".join(unused)}')
    rho_sh, rho_ns = spec.radii(work.rho_sh, work.rho_ns)
    held = heldout_users_for(split.num_users, heldout_fraction)
    algorithm = spec.build(context.BuildContext(
        split=split, model_config=model_config_for(spec, split.num_items, model_sizes),
        work=dataclasses.replace(work, rho_sh=rho_sh, rho_ns=rho_ns),
        clients_per_round=clients_per_round, seed=seed, server_lr=server_lr,
        server_optimizer=server_optimizer, num_negatives=num_negatives,
        users_per_client=users_per_client,
        max_group_examples=max_group_examples, model_aggregator=model_aggregator,
        workers=workers, sharpness_probe=sharpness_probe,
        training_users=np.setdiff1d(np.arange(split.num_users), held),
        user_state_store=user_state_store))
    return Simulation(split=split, algorithm=algorithm, clients_per_round=clients_per_round,
                      seed=seed, num_negatives=num_negatives,
                      heldout_fraction=heldout_fraction, eval_users=eval_users,
                      top_ks=top_ks, eval_scoring=eval_scoring)
