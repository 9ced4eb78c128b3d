"""FedRecGEL's client work for any partially local model.

The model is TFF's own `tff.learning.models.ReconstructionModel`: its global
variables are what the server aggregates, its local variables are the user's
(persistent state, or rebuilt every round in reconstruct mode). One TFF
client is one user, the deployable form. The steps of the update are
`client_steps.group_update`'s (the same function the NeuMF group form runs);
what this module adds is how a model's loss and SAM gradients are taken
(`_ModelUser`): on the model's own variables, by the Keras SAM optimizer's
`sam_gradients` (group 'global' at rho_sh, group 'local' at rho_ns). For
NeuMF, `client_update.build_client_update` computes the same numbers over a
group of users at once (the simulation's fast path); tests hold the two equal.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.algorithm_config import ClientWorkConfig
from tff_fedrecgel.algorithms import client_steps
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


def initial_client_state(model_fn: ModelFn) -> client_steps.ClientState:
    """A new user's state: a fresh model's local weights, zero Adam state.

    Returns:
      A `client_update.ClientState` of numpy arrays (call eagerly).
    """
    local = [v.numpy() for v in model_fn().local_trainable_variables]
    return client_steps.ClientState(
        local_weights=local, adam_step=np.int32(0),
        adam_m=[np.zeros_like(w) for w in local], adam_v=[np.zeros_like(w) for w in local])


def _dense(gradients) -> list[tf.Tensor]:
    return [tf.convert_to_tensor(g) for g in gradients]


class _ModelUser:
    """One user of a `ReconstructionModel` as the group of one (`client_steps.UserGroup`).

    The point and the local part carry a leading axis of 1; the loss is the
    model's, evaluated on its variables after the point is written into them.
    """

    def __init__(self, model, example_loss, work, data):
        self._model = model
        self._example_loss = example_loss
        self._work = work
        self._data = tf.nest.map_structure(tf.convert_to_tensor, data)
        self._global = list(model.global_trainable_variables)
        self._local = list(model.local_trainable_variables)
        num_examples = tf.shape(tf.nest.flatten(self._data)[0])[0]
        self.num_users = tf.constant(1)
        self.lengths = num_examples[tf.newaxis]
        self.max_length = num_examples
        self.rows = [None] * len(self._global)

    def _loss(self, part):
        batch = tf.nest.map_structure(lambda t: t[part.start:part.end], self._data)
        output = self._model.forward_pass(batch, training=True)
        losses = self._example_loss(output.labels, output.predictions)
        return tf.reduce_sum(losses * part.weights[0])[tf.newaxis]

    def _write(self, variables, values):
        for var, value in zip(variables, values):
            var.assign(value[0])

    def point(self, global_weights):
        return [w[tf.newaxis] for w in global_weights]

    def sam(self, optimizer, point, local, part):
        self._write(self._global, point)
        self._write(self._local, local)
        result = optimizer.sam_gradients(
            lambda: self._loss(part), {'global': self._global, 'local': self._local},
            scaled=client_steps.asam_scaled([v.shape for v in self._global]))
        return result._replace(gradients={
            name: [g[tf.newaxis] for g in _dense(grads)]
            for name, grads in result.gradients.items()})

    def reconstruct(self, global_weights, weights):
        self._write(self._global, self.point(global_weights))
        local = [tf.zeros_like(v)[tf.newaxis] for v in self._local]
        adam = local_training.initial_adam_state(local)
        whole = client_steps.Part(0, self.max_length, weights)
        for _ in range(self._work.reconstruction_steps):
            self._write(self._local, local)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(self._loss(whole))
            grads = [g[tf.newaxis] for g in _dense(tape.gradient(loss, self._local))]
            adam, local = local_training.adam_step(adam, local, grads, self._work.local_lr)
        return local, adam


def build_model_client_update(model_fn: ModelFn, work: ClientWorkConfig,
                              *, example_loss: ExampleLoss = sigmoid_cross_entropy
                              ) -> client_steps.ClientUpdate:
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
      A `client_steps.ClientUpdate` with `single_user=True`: state
      `ClientState(local_weights, adam_step [], adam_m, adam_v)` shaped like
      the model's local variables, data one batch of the model's
      `input_spec` (all the user's examples of the round).

    Raises:
      ValueError: As `model_specs`.
    """
    _, local_specs, input_spec = model_specs(model_fn)
    state_spec = client_steps.ClientState(
        local_weights=local_specs, adam_step=tf.TensorSpec([], tf.int32),
        adam_m=list(local_specs), adam_v=list(local_specs))

    def fn(global_weights, state, data):
        model = model_fn()
        optimizer = client_steps.build_sam_optimizer(work)

        @tf.function
        def run():
            user = _ModelUser(model, example_loss, work, data)
            group_state = (client_steps.as_group_of_one(state, add_axis=True)
                           if work.persistent else None)
            out = client_steps.group_update(user, work, optimizer, global_weights, group_state)
            if work.persistent:
                out['client_state'] = client_steps.as_device_state(out['client_state'],
                                                                   drop_axis=True)
            return out

        return run()

    return client_steps.ClientUpdate(
        fn=fn,
        state_type=tff.types.tensorflow_to_type(state_spec) if work.persistent else None,
        data_type=tff.types.tensorflow_to_type(input_spec), work=work, single_user=True)
