"""SAM whose perturbation of the global part comes from the server.

Two members of the federated SAM family replace the client's own ascent
step on the global part (SAM's first backward pass) by one the server
provides (docs/ALGORITHM.md, "FedLESAM" and "FedGloSS"):

* 'global_change' (FedLESAM, Fan et al., ICML 2024): the distributor sends
  the global weights w_t and the last global model change
  c_t = w_{t-1} - w_t (zero in the first round), an estimate of the global
  gradient's direction. Every local step of a client takes one gradient, at
  its point moved by e = rho * c_t / (sum over tensors of ||c_t||), the
  normalization of the authors' optimizer;
* 'server' (FedGloSS, Caldarola et al., CVPR 2025): the server keeps the
  last aggregated pseudo-gradient d and broadcasts w + rho * d / ||d||
  (w itself while d is zero, the first round); the clients train without
  SAM from there; the finalizer steps the unperturbed w (the server state
  never holds the perturbed point) and the new aggregate becomes d.

Each is a `tff.learning.templates.DistributionProcess` with typed
SERVER-placed state (the previous weights, or d), which the round keeps in
`ServerState.distributor_state` and checkpoints with it. The client work of
'global_change' is `client_steps.group_update` run with
`FixedStepSam` in place of the Keras SAM optimizer.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithm_config import ClientWorkConfig
from tff_fedrecgel.algorithms import client_steps
from tff_fedrecgel.algorithms import client_update as client_update_lib
from tff_fedrecgel.models import neumf
from tff_fedrecgel.optimizers import sam

GLOBAL_CHANGE = 'global_change'
SERVER = 'server'
# Added to FedLESAM's norm (the authors' optimizer's value).
LESAM_EPSILON = 1e-7


class GlobalPerturbation(NamedTuple):
    """The distributor of a server-provided perturbation and its bookkeeping.

    Attributes:
      distributor: A `tff.learning.templates.DistributionProcess`:
        `next(state@SERVER, global_weights@SERVER)` -> what the clients
        receive @CLIENTS.
      record: None, or a function traced inside the round's federated
        computation, `(distributor state@SERVER, aggregated update@SERVER,
        contributing users@SERVER) -> new distributor state@SERVER`
        (FedGloSS keeps the aggregate as the next round's d).
    """

    distributor: tff.learning.templates.DistributionProcess
    record: Callable | None = None


def sum_of_norms(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """The sum over tensors of each one's L2 norm (FedLESAM's normalizer)."""
    return tf.add_n([tf.norm(tf.reshape(t, [-1])) for t in tensors])


class FixedStepSam:
    """SAM with a given step on group 'global': one backward pass, no ascent.

    It stands in for `sam.SharpnessAwareMinimization` in
    `client_steps.group_update` (the same `sam_gradients_at`): the gradient of
    both groups is taken once, at the point whose global part is moved by
    `step`; the local part is not moved. The loss it reports is the loss
    there (no pass is spent at the unmoved point).

    Attributes:
      step: The global part's step, shaped like the point's global tensors.
      gradient_passes: Backward passes traced so far (one per local step).
    """

    def __init__(self, step: Sequence[tf.Tensor]):
        """Initializes it.

        Args:
          step: One tensor per global tensor of the point.
        """
        self.step = list(step)
        self.gradient_passes = 0

    def sam_gradients_at(self, loss_fn: Callable, point: Mapping[str, Sequence[tf.Tensor]], *,
                         segments=None, scaled=None) -> sam.SamGradients:
        """The gradients of every group at the moved point.

        Args:
          loss_fn: Maps a point (`{'global': [...], 'local': [...]}`) to the
            loss: a scalar, or one loss per segment (their sum is
            differentiated).
          point: The unmoved point.
          segments: Unused (the step is already per user).
          scaled: Unused.

        Returns:
          A `sam.SamGradients` whose perturbed losses are the loss itself.

        Raises:
          ValueError: If the step does not match the global part.
        """
        del segments, scaled
        point = {name: [tf.convert_to_tensor(x) for x in xs] for name, xs in point.items()}
        if len(self.step) != len(point['global']):
            raise ValueError(f'the step has {len(self.step)} tensors, the global part '
                             f'{len(point["global"])}')
        # The point's static shapes, which a `tf.while_loop` over steps keeps.
        moved = [tf.ensure_shape(x + e, x.shape) for x, e in zip(point['global'], self.step)]
        local = point.get('local', [])
        flat = moved + local
        with tf.GradientTape() as tape:
            tape.watch(flat)
            loss = loss_fn({**point, 'global': moved})
            total = loss if loss.shape.rank == 0 else tf.reduce_sum(loss)
        grads = [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
                 for g, x in zip(tape.gradient(total, flat), flat)]
        self.gradient_passes += 1
        return sam.SamGradients(
            gradients={'global': grads[:len(moved)], 'local': grads[len(moved):]},
            loss=loss, perturbed_losses={'global': loss, 'local': loss})


def lesam_step(group: client_update_lib.NeuMFGroup, direction: Sequence[tf.Tensor],
               rho: float) -> list[tf.Tensor]:
    """FedLESAM's step, `rho * c / (sum of ||c_k|| + 1e-7)`, on each user's copy.

    Args:
      group: The users (their copies of the rows they touch and of the dense
        layers).
      direction: The global model change, shaped like the global weights.
      rho: The radius.

    Returns:
      The step, shaped like `group.point(...)`.
    """
    direction = [tf.convert_to_tensor(d) for d in direction]
    scale = tf.constant(rho, tf.float32) / (sum_of_norms(direction) + LESAM_EPSILON)
    return [scale * d for d in group.point(direction)]


def build_lesam_client_update(model_config: neumf.ModelConfig, work: ClientWorkConfig, *,
                              single_user: bool = False) -> client_steps.ClientUpdate:
    """FedLESAM's client update: `client_steps.group_update` with `FixedStepSam`.

    Its first argument is what the distributor sends,
    `OrderedDict(weights=global weights, direction=the last global change)`.

    Args:
      model_config: The NeuMF sizes.
      work: What each user does (`global_perturbation='global_change'`).
      single_user: The one-user device form (as `client_update.build_client_update`).

    Returns:
      A `client_steps.ClientUpdate`.

    Raises:
      ValueError: If `work` is not FedLESAM's.
    """
    if work.global_perturbation != GLOBAL_CHANGE:
        raise ValueError(f"needs global_perturbation='{GLOBAL_CHANGE}', got "
                         f'{work.global_perturbation!r}')
    base = client_update_lib.build_client_update(model_config, work, single_user=single_user)

    def group_fn(received, state, data):
        group = client_update_lib.NeuMFGroup(model_config, work, data)
        optimizer = FixedStepSam(lesam_step(group, received['direction'], work.rho_sh))
        return client_steps.group_update(group, work, optimizer, list(received['weights']),
                                         state)

    fn = client_update_lib.single_user_form(group_fn, work) if single_user else group_fn
    return dataclasses.replace(base, fn=fn)


def build_client_update(model_config: neumf.ModelConfig, work: ClientWorkConfig, *,
                        single_user: bool = False) -> client_steps.ClientUpdate:
    """The client update of any `work.global_perturbation`.

    'local' is `client_update.build_client_update` itself; 'server' is it
    without client SAM (rho_sh is the server's radius).

    Args:
      model_config: The NeuMF sizes.
      work: What each user does.
      single_user: The one-user device form.

    Returns:
      A `client_steps.ClientUpdate`.
    """
    if work.global_perturbation == GLOBAL_CHANGE:
        return build_lesam_client_update(model_config, work, single_user=single_user)
    if work.global_perturbation == SERVER:
        work = dataclasses.replace(work, rho_sh=0.0)
    return client_update_lib.build_client_update(model_config, work, single_user=single_user)


def _no_measurements():
    return tff.federated_value((), tff.SERVER)


def build_global_change_distributor(global_specs: Sequence[tf.TensorSpec]
                                    ) -> tff.learning.templates.DistributionProcess:
    """FedLESAM's distributor: the weights and the last global change.

    State `OrderedDict(previous=the weights last sent, sent=int32 0 or 1)`;
    `next(state, w)` sends `OrderedDict(weights=w, direction=previous - w)`
    (direction 0 the first time) and keeps w.

    Args:
      global_specs: The global weights' specs.

    Returns:
      A `tff.learning.templates.DistributionProcess`.
    """
    specs = list(global_specs)
    global_type = tff.types.tensorflow_to_type(specs)

    @tff.tensorflow.computation
    def initial_state():
        return collections.OrderedDict(previous=[tf.zeros(s.shape, s.dtype) for s in specs],
                                       sent=tf.constant(0, tf.int32))

    state_type = initial_state.type_signature.result

    @tff.tensorflow.computation(state_type, global_type)
    def change(state, weights):
        weights = list(weights)
        # 0 before anything was sent: no perturbation in the first round.
        seen = tf.cast(state['sent'] > 0, tf.float32)
        direction = [seen * (p - w) for p, w in zip(state['previous'], weights)]
        new_state = collections.OrderedDict(previous=weights, sent=tf.constant(1, tf.int32))
        return new_state, collections.OrderedDict(weights=weights, direction=direction)

    @tff.federated_computation
    def initialize_fn():
        return tff.federated_eval(initial_state, tff.SERVER)

    @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                               tff.FederatedType(global_type, tff.SERVER))
    def next_fn(state, weights):
        out = tff.federated_map(change, (state, weights))
        return tff.templates.MeasuredProcessOutput(
            state=out[0], result=tff.federated_broadcast(out[1]),
            measurements=_no_measurements())

    return tff.learning.templates.DistributionProcess(initialize_fn, next_fn)


def build_server_sam_distributor(global_specs: Sequence[tf.TensorSpec], rho: float
                                 ) -> GlobalPerturbation:
    """FedGloSS's distributor: the weights moved by the server's SAM step.

    State d, the last aggregated pseudo-gradient (zeros at first); `next(d,
    w)` sends `w + rho * d / ||d||` (w while d is 0; the norm is the global
    one over every tensor) and keeps d; `record` replaces d by a round's
    aggregate when some user contributed.

    Args:
      global_specs: The global weights' specs.
      rho: The server's radius.

    Returns:
      A `GlobalPerturbation` with its `record`.
    """
    specs = list(global_specs)
    global_type = tff.types.tensorflow_to_type(specs)

    @tff.tensorflow.computation
    def initial_state():
        return [tf.zeros(s.shape, s.dtype) for s in specs]

    @tff.tensorflow.computation(global_type, global_type)
    def perturb(d, weights):
        d = list(d)
        scale = tf.math.divide_no_nan(tf.constant(rho, tf.float32), tf.linalg.global_norm(d))
        return [w + scale * g for w, g in zip(weights, d)]

    @tff.tensorflow.computation(global_type, global_type, np.int32)
    def keep(d, update, contributing):
        return tf.cond(contributing > 0, lambda: list(update), lambda: list(d))

    @tff.federated_computation
    def initialize_fn():
        return tff.federated_eval(initial_state, tff.SERVER)

    @tff.federated_computation(tff.FederatedType(global_type, tff.SERVER),
                               tff.FederatedType(global_type, tff.SERVER))
    def next_fn(d, weights):
        return tff.templates.MeasuredProcessOutput(
            state=d, result=tff.federated_broadcast(tff.federated_map(perturb, (d, weights))),
            measurements=_no_measurements())

    def record(d, update, contributing):
        return tff.federated_map(keep, (d, update, contributing))

    return GlobalPerturbation(tff.learning.templates.DistributionProcess(initialize_fn, next_fn),
                              record)


def build_global_perturbation(work: ClientWorkConfig, global_specs: Sequence[tf.TensorSpec]
                              ) -> GlobalPerturbation | None:
    """The distributor `work.global_perturbation` needs; None for 'local'.

    Args:
      work: What each user does (rho_sh is the server's radius for 'server').
      global_specs: The global weights' specs.

    Returns:
      A `GlobalPerturbation`, or None (the round's plain broadcast).
    """
    if work.global_perturbation == GLOBAL_CHANGE:
        return GlobalPerturbation(build_global_change_distributor(global_specs))
    if work.global_perturbation == SERVER:
        return build_server_sam_distributor(global_specs, work.rho_sh)
    return None
