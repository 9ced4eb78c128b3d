"""FedRecGEL's client work for any partially local model.

The model is TFF's own `tff.learning.models.ReconstructionModel`: its global
variables are what the server aggregates, its local variables are the user's
(persistent state, or rebuilt every round in reconstruct mode). One TFF
client is one user, the deployable form. Per round, on the user's batch
(docs/ALGORITHM.md, steps 3-8):

1. the SAM gradients of both parts by the Keras SAM optimizer
   (`SharpnessAwareMinimization.sam_gradients` on the model's variables:
   group 'global' at rho_sh, group 'local' at rho_ns);
2. one step of the user's local Adam on the local part;
3. the upload: the global part's SAM gradient ('gradient') or, after
   `local_epochs` epochs of such steps over minibatches with SGD on the
   global part, the change of the global part ('model_delta').

The output has the structure of `client_update.ClientUpdate`, so the round
(`fedrecgel.build_fedrecgel_process`) treats both client works alike. For
NeuMF, `client_update.build_client_update` computes the same numbers over a
group of users at once (the simulation's fast path); tests hold the two equal.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithms import client_update as client_update_lib
from tff_fedrecgel.algorithms import local_training

ModelFn = Callable[[], tff.learning.models.ReconstructionModel]
ExampleLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def sigmoid_cross_entropy(labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
    """The implicit-feedback loss of one example each: BCE on logits, `[N]`."""
    return tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.reshape(tf.cast(labels, tf.float32), [-1]),
        logits=tf.reshape(predictions, [-1]))


def _specs(variables) -> list[tf.TensorSpec]:
    return [tf.TensorSpec(v.shape, v.dtype) for v in variables]


def model_specs(model_fn: ModelFn) -> tuple[list, list, object]:
    """The global and local trainable variables' specs and the batch spec.

    Raises:
      ValueError: If the model has non-trainable variables (nothing would
        aggregate or keep them) or no local variables.
    """
    with tf.Graph().as_default():
        model = model_fn()
        if model.global_non_trainable_variables or model.local_non_trainable_variables:
            raise ValueError('FedRecGEL trains every variable of the model: give a '
                             'ReconstructionModel without non-trainable variables')
        if not model.local_trainable_variables:
            raise ValueError('the ReconstructionModel has no local variables: FedRecGEL '
                             'needs the user part to be local')
        return (_specs(model.global_trainable_variables),
                _specs(model.local_trainable_variables), model.input_spec)


def initial_global_weights(model_fn: ModelFn) -> list[tf.Tensor]:
    """A fresh model's global weights (call inside a TF computation)."""
    return [tf.identity(v) for v in model_fn().global_trainable_variables]


def initial_client_state(model_fn: ModelFn) -> client_update_lib.ClientState:
    """A new user's state: a fresh model's local weights, zero Adam state.

    Returns:
      A `client_update.ClientState` of numpy arrays (call eagerly).
    """
    local = [v.numpy() for v in model_fn().local_trainable_variables]
    return client_update_lib.ClientState(
        local_weights=local, adam_step=np.int32(0),
        adam_m=[np.zeros_like(w) for w in local], adam_v=[np.zeros_like(w) for w in local])


def _dense(gradients) -> list[tf.Tensor]:
    return [tf.convert_to_tensor(g) for g in gradients]


def _all_finite(tensors) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def build_model_client_update(model_fn: ModelFn, work: client_update_lib.ClientWorkConfig,
                              *, example_loss: ExampleLoss = sigmoid_cross_entropy
                              ) -> client_update_lib.ClientUpdate:
    """Builds the one-user client update of any `ReconstructionModel`.

    Args:
      model_fn: A no-argument function returning a new
        `tff.learning.models.ReconstructionModel` (called inside the TFF
        computations, as `tff.learning.algorithms.build_fed_recon` does).
      work: What the user does (radii, local Adam, update mode, loss
        reduction, reconstruction steps).
      example_loss: `(labels, predictions) -> [N]` loss of each example of a
        batch; `work.loss_reduction` weighs them into the user's loss.

    Returns:
      A `client_update.ClientUpdate` with `single_user=True`: state
      `ClientState(local_weights, adam_step [], adam_m, adam_v)` shaped like
      the model's local variables, data one batch of the model's
      `input_spec` (all the user's examples of the round).

    Raises:
      ValueError: As `model_specs`.
    """
    _, local_specs, input_spec = model_specs(model_fn)
    state_spec = client_update_lib.ClientState(
        local_weights=local_specs, adam_step=tf.TensorSpec([], tf.int32),
        adam_m=list(local_specs), adam_v=list(local_specs))

    def weighted_loss(model, batch):
        output = model.forward_pass(batch, training=True)
        losses = example_loss(output.labels, output.predictions)
        n = tf.size(losses)
        weights = local_training.example_weights(
            n[tf.newaxis], n, loss_reduction=work.loss_reduction,
            chunk_size=work.chunk_size)[0]
        return tf.reduce_sum(losses * weights), output.num_examples

    def fn(global_weights, state, data):
        model = model_fn()
        optimizer = client_update_lib.build_sam_optimizer(work)
        global_vars = list(model.global_trainable_variables)
        local_vars = list(model.local_trainable_variables)
        groups = {'global': global_vars, 'local': local_vars}

        def sam_step(batch):
            result = optimizer.sam_gradients(lambda: weighted_loss(model, batch)[0], groups)
            return (result.loss, result.perturbed_losses['global'],
                    result.perturbed_losses['local'], _dense(result.gradients['global']),
                    _dense(result.gradients['local']))

        def adam_on_local(adam, grads):
            adam, new_local = local_training.adam_step(
                adam, [v.read_value() for v in local_vars], grads, work.local_lr)
            for var, value in zip(local_vars, new_local):
                var.assign(value)
            return adam

        def reconstruct(batch):
            for var in local_vars:
                var.assign(tf.zeros_like(var))
            adam = local_training.AdamState(
                tf.constant(0), [tf.zeros_like(v) for v in local_vars],
                [tf.zeros_like(v) for v in local_vars])
            for _ in range(work.reconstruction_steps):
                with tf.GradientTape() as tape:
                    loss = weighted_loss(model, batch)[0]
                adam = adam_on_local(adam, _dense(tape.gradient(loss, local_vars)))
            return adam

        def model_delta(batch, adam):
            num_examples = tf.shape(tf.nest.flatten(batch)[0])[0]
            chunks = (num_examples + work.chunk_size - 1) // work.chunk_size
            totals = [tf.constant(0.0)] * 3
            for _ in range(work.local_epochs):
                for c in tf.range(chunks):
                    start = c * work.chunk_size
                    chunk = tf.nest.map_structure(
                        lambda t, s=start: t[s:s + work.chunk_size], batch)
                    loss, loss_sh, loss_ns, g_global, g_local = sam_step(chunk)
                    for var, g in zip(global_vars, g_global):
                        var.assign_sub(work.client_lr * g)
                    adam = adam_on_local(adam, g_local)
                    totals = [t + x for t, x in zip(totals, (loss, loss_sh, loss_ns))]
            taken = tf.cast(tf.maximum(chunks * work.local_epochs, 1), tf.float32)
            update = [w - v for w, v in zip(received, global_vars)]
            return update, adam, [t / taken for t in totals]

        received = [tf.convert_to_tensor(w) for w in global_weights]
        data = tf.nest.map_structure(tf.convert_to_tensor, data)

        @tf.function
        def run():
            for var, value in zip(global_vars, received):
                var.assign(value)
            if work.persistent:
                old = client_update_lib.as_client_state(state)
                for var, value in zip(local_vars, old.local_weights):
                    var.assign(value)
                adam = local_training.AdamState(old.adam_step, list(old.adam_m),
                                                list(old.adam_v))
            else:
                adam = reconstruct(data)
            num_examples = tf.shape(tf.nest.flatten(data)[0])[0]
            if work.update == 'gradient':
                loss, loss_sh, loss_ns, update, g_local = sam_step(data)
                adam = adam_on_local(adam, g_local)
            else:
                update, adam, (loss, loss_sh, loss_ns) = model_delta(data, adam)
            new_local = [v.read_value() for v in local_vars]
            finite = _all_finite([loss, loss_sh, loss_ns] + update + new_local)
            weight = (tf.constant(1.0) if work.client_weighting == 'uniform'
                      else tf.cast(num_examples, tf.float32))
            weight = tf.where(finite, weight, 0.0)
            out = collections.OrderedDict(
                update=[tf.reshape(tf.where(finite, u, tf.zeros_like(u)), w.shape)
                        for u, w in zip(update, received)],
                weight=weight, dropped=1 - tf.cast(finite, tf.int32),
                users=tf.constant(1))
            if work.persistent:
                keep = lambda new, previous: tf.where(finite, new, previous)
                out['client_state'] = client_update_lib.ClientState(
                    [keep(n, o) for n, o in zip(new_local, old.local_weights)],
                    keep(adam.step, old.adam_step),
                    [keep(n, o) for n, o in zip(adam.m, old.adam_m)],
                    [keep(n, o) for n, o in zip(adam.v, old.adam_v)])
            zero = tf.constant(0.0)
            out['metrics'] = collections.OrderedDict(zip(
                client_update_lib.METRIC_NAMES,
                [tf.where(finite, x, zero) for x in (
                    loss, loss_sh, loss_ns, tf.cast(num_examples, tf.float32))]))
            return out

        return run()

    return client_update_lib.ClientUpdate(
        fn=fn,
        state_type=tff.types.tensorflow_to_type(state_spec) if work.persistent else None,
        data_type=tff.types.tensorflow_to_type(input_spec), work=work, single_user=True)
