"""What a method's builder gets: everything a run decided, in one value.

`methods.Method.build(context)` calls the method's builder with it; each
builder takes what its algorithm uses. Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """The run's decisions, for a method's builder.

    Attributes:
      split: The preprocessed dataset (`data.Split`).
      model_config: The model sizes the method trains (`neumf.ModelConfig`).
      work: What each user does (`algorithm_config.ClientWorkConfig`; the
        method's fixed radii already applied).
      clients_per_round: Cohort size.
      seed: Seed of sampling, negatives and initial weights.
      server_lr: Learning rate of the server optimizer.
      server_optimizer: A name of `algorithm_config.SERVER_OPTIMIZERS`, or a
        `tff.learning.optimizers` optimizer.
      num_negatives: Training negatives per positive.
      users_per_client: Users per TFF client (None: as many as fit
        `max_group_examples`; 1: one user per client).
      max_group_examples: Padded examples per TFF client.
      model_aggregator: A `tff.aggregators` factory, or None (the mean).
      workers: TFF worker services to split rounds across, or None.
      sharpness_probe: Radius of the sharpness probe, or None.
      training_users: The users that train (the held-out ones do not).
      user_state_store: Where per-user state lives, 'memory' or 'disk'
        (the FedRecGEL family's `client_states.ClientStateTable`).
    """

    split: Any
    model_config: Any
    work: Any
    clients_per_round: int
    seed: int
    server_lr: float
    server_optimizer: Any
    num_negatives: int
    users_per_client: int | None
    max_group_examples: int
    model_aggregator: Any
    workers: str | Sequence[str] | None
    sharpness_probe: float | None
    training_users: Any
    user_state_store: str = 'memory'
