"""Client work of FedRecGEL: one user's SAM step on its round batch.

`build_client_update_fn` returns a TensorFlow function of (global weights,
client state, client data) with no hidden state: everything that changes comes
in and goes out, so the same function serves the TFF round, exported
computations, and any later vectorization over users.

Client state (persistent mode) is an OrderedDict:
  local_weights: the user's embedding rows, `[1, gmf_dim]` and `[1, mlp_dim]`;
  adam_step: int32 scalar, local Adam steps taken so far;
  adam_m, adam_v: the local Adam moments, shaped like `local_weights`.
"""

import collections
from collections.abc import Sequence
import dataclasses

import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.models import neumf
from tff_fedrecgel.optimizers import sam

LOSS_REDUCTIONS = ('chunk_sum', 'mean')
LOCAL_STATES = ('persistent', 'reconstruct')
UPDATE_MODES = ('gradient', 'model_delta')
CLIENT_WEIGHTINGS = ('uniform', 'num_examples')
# Adam's epsilon as in the authors' framework (added to sqrt(v)).
ADAM_EPSILON = 1e-8


@dataclasses.dataclass(frozen=True)
class ClientWorkConfig:
    """What one client does in a round.

    Attributes:
      rho_sh: SAM radius of the global (shared) variables; 0 skips their pass.
      rho_ns: SAM radius of the local (user) variables; 0 skips their pass.
      local_lr: Learning rate of the client's Adam on its user embedding.
      loss_reduction: 'chunk_sum' sums the mean BCE of consecutive chunks of
        `chunk_size` examples (the authors' loss); 'mean' is the plain mean.
      chunk_size: Chunk length for 'chunk_sum' (and minibatch size for
        'model_delta').
      local_state: 'persistent' keeps the user embedding and its Adam state on
        the client across rounds; 'reconstruct' keeps nothing and re-derives the
        embedding each round from zeros by `reconstruction_steps` Adam steps on
        the client's round batch, with the global weights fixed.
      reconstruction_steps: Adam steps of the 'reconstruct' mode.
      update: 'gradient' uploads the SAM gradient of the global part at the
        received point (the authors' algorithm); 'model_delta' runs
        `local_epochs` epochs of SAM steps over minibatches, moving the global
        part by SGD with `client_lr`, and uploads received minus final weights.
      local_epochs: Epochs of the 'model_delta' mode.
      client_lr: SGD learning rate of the global part in 'model_delta' mode.
      client_weighting: 'uniform' (the authors' unweighted mean) or
        'num_examples'.
    """

    rho_sh: float = 0.0
    rho_ns: float = 0.0
    local_lr: float = 0.1
    loss_reduction: str = 'chunk_sum'
    chunk_size: int = 128
    local_state: str = 'persistent'
    reconstruction_steps: int = 5
    update: str = 'gradient'
    local_epochs: int = 1
    client_lr: float = 0.01
    client_weighting: str = 'uniform'

    def __post_init__(self):
        for name, value, allowed in (
            ('loss_reduction', self.loss_reduction, LOSS_REDUCTIONS),
            ('local_state', self.local_state, LOCAL_STATES),
            ('update', self.update, UPDATE_MODES),
            ('client_weighting', self.client_weighting, CLIENT_WEIGHTINGS),
        ):
            if value not in allowed:
                raise ValueError(f'{name} must be one of {allowed}, got {value!r}')
        if self.rho_sh < 0 or self.rho_ns < 0:
            raise ValueError('SAM radii must be >= 0')
        if self.local_lr <= 0 or self.chunk_size < 1 or self.local_epochs < 1:
            raise ValueError('local_lr, chunk_size and local_epochs must be positive')
        if self.local_state == 'reconstruct' and self.reconstruction_steps < 1:
            raise ValueError('reconstruct mode needs reconstruction_steps >= 1')


def example_weights(
    num_examples: tf.Tensor, *, loss_reduction: str, chunk_size: int
) -> tf.Tensor:
    """Per-example loss weights that give the configured reduction.

    'chunk_sum': example i in chunk c weighs 1 / len(chunk c), so the weighted
    sum is the sum of the chunks' mean losses. 'mean': every example 1 / n.

    Args:
      num_examples: Scalar int, the batch length.
      loss_reduction: One of `LOSS_REDUCTIONS`.
      chunk_size: The chunk length.

    Returns:
      `[num_examples]` float32 weights.
    """
    n = tf.cast(num_examples, tf.int32)
    if loss_reduction == 'mean':
        return tf.fill([n], 1.0 / tf.cast(tf.maximum(n, 1), tf.float32))
    chunk = tf.range(n) // chunk_size
    last = (n - 1) // chunk_size
    last_size = n - last * chunk_size
    # tf.equal, not ==: inside TFF graphs == on tensors is Python identity.
    sizes = tf.where(tf.equal(chunk, last), last_size, chunk_size)
    return 1.0 / tf.cast(sizes, tf.float32)


def weighted_bce(logits, labels, weights):
    """Sum of weighted binary cross-entropies with logits."""
    losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_sum(losses * weights)


def local_weight_specs(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    dims = [config.gmf_dim] + ([config.mlp_dim] if config.use_mlp else [])
    return [tf.TensorSpec([1, d], tf.float32) for d in dims]


def global_weight_specs(config: neumf.ModelConfig) -> list[tf.TensorSpec]:
    with tf.Graph().as_default():
        model = neumf.NeuMF(config)
        return [tf.TensorSpec(v.shape, v.dtype) for v in model.global_variables]


def client_state_spec(config: neumf.ModelConfig) -> collections.OrderedDict:
    local = local_weight_specs(config)
    return collections.OrderedDict(
        local_weights=local,
        adam_step=tf.TensorSpec([], tf.int32),
        adam_m=list(local),
        adam_v=list(local),
    )


def client_data_spec() -> collections.OrderedDict:
    return collections.OrderedDict(
        items=tf.TensorSpec([None], tf.int32),
        labels=tf.TensorSpec([None], tf.float32),
    )


def _local_adam(lr):
    return tff.learning.optimizers.build_adam(learning_rate=lr, epsilon=ADAM_EPSILON)


def _adam_state(optimizer, specs, step=None, m=None, v=None):
    """TFF Adam state as tensors (its step needs float hyperparameters)."""
    state = tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(specs))
    if step is None:
        return state
    state['step'] = step
    state['accumulator'] = list(m)
    state['preconditioner'] = list(v)
    return state


def _dense(gradient, variable):
    if gradient is None:
        return tf.zeros_like(variable)
    # tensordot's gradient loses the static shape; restore it.
    return tf.reshape(tf.convert_to_tensor(gradient), variable.shape)


def _all_finite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def reconstruct_local(model: neumf.NeuMF, loss_fn, work: ClientWorkConfig):
    """Re-derives the user embedding in place ('reconstruct' mode).

    The local variables start from zeros and take `work.reconstruction_steps`
    steps of the local Adam on `loss_fn`, the global weights fixed. Call it
    inside the caller's `tf.function`, so the variable writes are ordered.

    Args:
      model: The client's NeuMF, global weights already assigned.
      loss_fn: Computes the client's loss from the current variables.
      work: Supplies the step count and the learning rate.

    Returns:
      The local Adam state after the last step.
    """
    local_vars = model.local_variables
    specs = local_weight_specs(model.config)
    adam = _local_adam(work.local_lr)
    for var in local_vars:
        var.assign(tf.zeros_like(var))
    adam_state = _adam_state(adam, specs)
    for _ in range(work.reconstruction_steps):
        with tf.GradientTape() as tape:
            loss = loss_fn()
        grads = tape.gradient(loss, local_vars)
        adam_state, new_local = adam.next(
            adam_state,
            [v.read_value() for v in local_vars],
            [_dense(g, v) for g, v in zip(grads, local_vars)],
        )
        for var, value in zip(local_vars, new_local):
            var.assign(value)
    return adam_state


def build_client_update_fn(model_config: neumf.ModelConfig, work: ClientWorkConfig):
    """Returns the client update as a function to call inside a TF graph.

    The returned function creates its model and optimizers when first called
    (inside a `tff.tensorflow.computation`), then runs all stateful work inside
    one `tf.function`, so TensorFlow orders the variable reads and writes.

    Args:
      model_config: The NeuMF sizes.
      work: What the client does.

    Returns:
      A function `(global_weights, client_state, data) -> OrderedDict` with keys
      `update` (the global part's SAM gradient or model delta, dense),
      `weight` (its aggregation weight, 0 when the client is dropped),
      `dropped` (int32, 1 when the update or state was not finite),
      `users` (int32, 1: the vectorized group path reports its group size),
      `client_state` (the new state; the old one when dropped; omitted in
      'reconstruct' mode), and `metrics` (loss, sam_loss_global,
      sam_loss_local, num_examples). In 'reconstruct' mode `client_state` is
      ignored and may be None.
    """
    local_specs = local_weight_specs(model_config)

    def client_update(global_weights, client_state, data):
        model = neumf.NeuMF(model_config)
        optimizer = sam.SharpnessAwareMinimization(
            rho={'global': work.rho_sh, 'local': work.rho_ns}
        )
        adam = _local_adam(work.local_lr)

        @tf.function
        def run(global_weights, client_state, items, labels):
            global_vars, local_vars = model.global_variables, model.local_variables
            for var, value in zip(global_vars, global_weights):
                var.assign(value)
            num_examples = tf.size(items)

            def loss_on(batch_items, batch_labels, weights):
                return lambda: weighted_bce(model(batch_items), batch_labels, weights)

            full_weights = example_weights(
                num_examples,
                loss_reduction=work.loss_reduction,
                chunk_size=work.chunk_size,
            )
            full_loss = loss_on(items, labels, full_weights)

            if work.local_state == 'persistent':
                for var, value in zip(local_vars, client_state['local_weights']):
                    var.assign(value)
                adam_state = _adam_state(
                    adam,
                    local_specs,
                    client_state['adam_step'],
                    client_state['adam_m'],
                    client_state['adam_v'],
                )
            else:
                adam_state = reconstruct_local(model, full_loss, work)

            groups = {'global': global_vars, 'local': local_vars}
            if work.update == 'gradient':
                result = optimizer.sam_gradients(full_loss, groups)
                update = [
                    _dense(g, v)
                    for g, v in zip(result.gradients['global'], global_vars)
                ]
                adam_state, new_local = adam.next(
                    adam_state,
                    [v.read_value() for v in local_vars],
                    [
                        _dense(g, v)
                        for g, v in zip(result.gradients['local'], local_vars)
                    ],
                )
                first = result
            else:
                initial = [v.read_value() for v in global_vars]
                new_local = [v.read_value() for v in local_vars]
                num_chunks = (num_examples + work.chunk_size - 1) // work.chunk_size
                # Losses are averaged over the local steps.
                totals = [tf.constant(0.0)] * 3
                for _ in range(work.local_epochs):
                    for c in tf.range(num_chunks):
                        start = c * work.chunk_size
                        end = tf.minimum(start + work.chunk_size, num_examples)
                        size = end - start
                        step = optimizer.sam_gradients(
                            loss_on(
                                items[start:end],
                                labels[start:end],
                                tf.fill([size], 1.0 / tf.cast(size, tf.float32)),
                            ),
                            groups,
                        )
                        for var, grad in zip(global_vars, step.gradients['global']):
                            if isinstance(grad, tf.IndexedSlices):
                                var.scatter_sub(
                                    tf.IndexedSlices(
                                        grad.values * work.client_lr, grad.indices
                                    )
                                )
                            else:
                                var.assign_sub(grad * work.client_lr)
                        adam_state, new_local = adam.next(
                            adam_state,
                            [v.read_value() for v in local_vars],
                            [
                                _dense(g, v)
                                for g, v in zip(step.gradients['local'], local_vars)
                            ],
                        )
                        for var, value in zip(local_vars, new_local):
                            var.assign(value)
                        totals = [
                            totals[0] + step.loss,
                            totals[1] + step.perturbed_losses['global'],
                            totals[2] + step.perturbed_losses['local'],
                        ]
                steps = tf.cast(num_chunks * work.local_epochs, tf.float32)
                first = sam.SamGradients(
                    gradients={},
                    loss=totals[0] / steps,
                    perturbed_losses={
                        'global': totals[1] / steps,
                        'local': totals[2] / steps,
                    },
                )
                update = [a - v.read_value() for a, v in zip(initial, global_vars)]
                update = [tf.reshape(u, v.shape) for u, v in zip(update, global_vars)]

            metrics = collections.OrderedDict(
                loss=first.loss,
                sam_loss_global=first.perturbed_losses['global'],
                sam_loss_local=first.perturbed_losses['local'],
                num_examples=num_examples,
            )
            finite = _all_finite(update + list(new_local) + [first.loss])
            if work.client_weighting == 'uniform':
                weight = tf.constant(1.0)
            else:
                weight = tf.cast(num_examples, tf.float32)
            out = collections.OrderedDict(
                update=[tf.where(finite, u, tf.zeros_like(u)) for u in update],
                weight=tf.where(finite, weight, 0.0),
                dropped=tf.cast(tf.logical_not(finite), tf.int32),
                users=tf.constant(1, tf.int32),
            )
            if work.local_state == 'persistent':
                new_state = collections.OrderedDict(
                    local_weights=list(new_local),
                    adam_step=tf.cast(adam_state['step'], tf.int32),
                    adam_m=list(adam_state['accumulator']),
                    adam_v=list(adam_state['preconditioner']),
                )
                out['client_state'] = tf.nest.map_structure(
                    lambda new, old: tf.where(finite, new, old), new_state, client_state
                )
            # Metrics of a dropped client are zeroed; the round averages metrics
            # over the clients that contributed.
            out['metrics'] = collections.OrderedDict(
                (k, tf.where(finite, tf.cast(v, tf.float32), 0.0))
                for k, v in metrics.items()
            )
            return out

        return run(global_weights, client_state, data['items'], data['labels'])

    return client_update
