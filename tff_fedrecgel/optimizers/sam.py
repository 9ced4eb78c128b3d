"""Sharpness-aware minimization (SAM) with one radius per variable group.

For each group g with radius rho_g > 0, SAM evaluates the gradient of the loss
at the point where only that group is moved along its own normalized gradient,

    e_g = rho_g * grad_g L(w) / (||grad_g L(w)|| + epsilon),
    sam_grad_g = grad_g L(w_g + e_g, w_rest),

the norm taken jointly over all the group's tensors. The groups are perturbed
separately, never jointly, and each perturbation is undone exactly (the saved
values are restored, not subtracted) before the next pass. A group with a
Python radius of 0 takes the plain gradient and costs no extra pass.

Keras 2.14's own SharpnessAwareMinimization only works through `Model.fit`
and cannot sum embedding (IndexedSlices) gradients; this optimizer takes a
callable loss, as TFF client work needs, and handles IndexedSlices sparsely:
only the touched embedding rows are perturbed and restored.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Union

import tensorflow as tf

Gradient = Union[tf.Tensor, tf.IndexedSlices]
Radius = Union[float, tf.Tensor]
# Added to the gradient norm before dividing (docs/ALGORITHM.md, steps 5-6).
EPSILON = 1e-12


def perturbation_scale(squared_norm: tf.Tensor, rho: Radius,
                       epsilon: float = EPSILON) -> tf.Tensor:
    """The factor `rho / (||g|| + epsilon)` that turns g into SAM's step e.

    The one place SAM's perturbation is computed: this optimizer applies it to
    a model's variables, the client update (`algorithms/client_update.py`) to
    each user of a group with a vector of squared norms.

    Args:
      squared_norm: `||g||^2` of a variable group (any shape: one per user).
      rho: The radius.
      epsilon: Added to the norm.

    Returns:
      The scale, shaped like `squared_norm`.
    """
    return tf.cast(rho, squared_norm.dtype) / (tf.sqrt(squared_norm) + epsilon)


def is_static_zero(rho: Radius) -> bool:
    """Whether a radius is a Python 0, so SAM can skip its extra pass."""
    return isinstance(rho, (int, float)) and rho == 0


class SamGradients(NamedTuple):
    """What one SAM step computed.

    Attributes:
      gradients: Per group, the SAM gradients (plain gradients for rho = 0), one
        per variable, in the group's variable order.
      loss: The loss at the unperturbed weights.
      perturbed_losses: Per group, the loss at the perturbed point (equal to
        `loss` for a group with rho = 0). `perturbed_losses[g] - loss` is the
        sharpness of the loss along group g's ascent direction.
    """

    gradients: dict[str, list[Gradient]]
    loss: tf.Tensor
    perturbed_losses: dict[str, tf.Tensor]


def _unique_rows(gradient: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """Sums repeated rows of an IndexedSlices: (unique indices, summed rows)."""
    unique, position = tf.unique(gradient.indices)
    rows = tf.math.unsorted_segment_sum(gradient.values, position, tf.size(unique))
    return unique, rows


class SharpnessAwareMinimization(tf.keras.optimizers.Optimizer):
    """SAM over named variable groups, each with its own radius and optimizer.

    `sam_gradients` computes the SAM gradients of every group; `minimize`
    additionally applies them with each group's base optimizer.
    """

    def __init__(
        self,
        *,
        rho: Mapping[str, Radius],
        base_optimizers: Mapping[str, tf.keras.optimizers.Optimizer] | None = None,
        epsilon: float = EPSILON,
        name: str = 'SharpnessAwareMinimization',
    ):
        """Initializes the optimizer.

        Args:
          rho: The radius of each variable group, by group name. A Python 0 skips
            that group's extra pass; a tensor radius always runs it.
          base_optimizers: Optional optimizer per group, used by `minimize`.
          epsilon: Added to the gradient norm before dividing.
          name: The optimizer's name.

        Raises:
          ValueError: If a radius is negative, or `base_optimizers` names a group
            that has no radius.
        """
        super().__init__(name=name, jit_compile=False)
        for group, value in rho.items():
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f'rho for group {group!r} must be >= 0, got {value}')
        self.rho = dict(rho)
        self.base_optimizers = dict(base_optimizers or {})
        unknown = set(self.base_optimizers) - set(self.rho)
        if unknown:
            raise ValueError(f'base optimizers for groups without a radius: {unknown}')
        self.epsilon = epsilon

    def sam_gradients(
        self,
        loss_fn: Callable[[], tf.Tensor],
        var_groups: Mapping[str, Sequence[tf.Variable]],
    ) -> SamGradients:
        """Computes the SAM gradient of every group (docs/ALGORITHM.md, steps 4-6).

        Args:
          loss_fn: Computes the scalar loss from the current variable values.
          var_groups: The variables of each group, by group name (every group
            needs a radius).

        Returns:
          A `SamGradients`.

        Raises:
          ValueError: If a group has no radius.
        """
        missing = set(var_groups) - set(self.rho)
        if missing:
            raise ValueError(f'no radius for variable groups {sorted(missing)}')
        names = list(var_groups)
        all_vars = [v for name in names for v in var_groups[name]]
        with tf.GradientTape() as tape:
            loss = loss_fn()
        flat = tape.gradient(loss, all_vars)
        base, start = {}, 0
        for name in names:
            base[name] = flat[start : start + len(var_groups[name])]
            start += len(var_groups[name])

        gradients, perturbed_losses = {}, {}
        for name in names:
            rho = self.rho[name]
            if is_static_zero(rho) or not var_groups[name]:
                gradients[name], perturbed_losses[name] = list(base[name]), loss
                continue
            gradients[name], perturbed_losses[name] = self._perturbed_gradient(
                loss_fn, list(var_groups[name]), base[name], rho
            )
        return SamGradients(gradients, loss, perturbed_losses)

    def _perturbed_gradient(self, loss_fn, variables, grads, rho):
        """Gradient of one group at its perturbed point; restores the weights."""
        pieces = []  # (variable, gradient as dense tensor or (indices, rows))
        squared = []
        for var, grad in zip(variables, grads):
            if grad is None:
                continue
            if isinstance(grad, tf.IndexedSlices):
                indices, rows = _unique_rows(grad)
                pieces.append((var, (indices, rows)))
                squared.append(tf.reduce_sum(tf.square(rows)))
            else:
                pieces.append((var, grad))
                squared.append(tf.reduce_sum(tf.square(grad)))
        squared_norm = tf.add_n(squared) if squared else tf.constant(0.0)
        scale = perturbation_scale(squared_norm, rho, self.epsilon)

        restores = []
        for var, grad in pieces:
            if isinstance(grad, tuple):
                indices, rows = grad
                saved = tf.gather(var, indices)
                var.scatter_add(tf.IndexedSlices(rows * scale, indices))
                restores.append((var, indices, saved))
            else:
                saved = tf.identity(var.read_value())
                var.assign_add(grad * scale)
                restores.append((var, None, saved))

        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            perturbed_loss = loss_fn()
        sam_grads = tape.gradient(perturbed_loss, variables)

        for var, indices, saved in restores:
            if indices is None:
                var.assign(saved)
            else:
                var.scatter_update(tf.IndexedSlices(saved, indices))
        return list(sam_grads), perturbed_loss

    def minimize(self, loss, var_list, tape=None):
        """Takes one SAM step: SAM gradients, then each group's base optimizer.

        Args:
          loss: A callable returning the scalar loss (SAM needs to re-evaluate it).
          var_list: A mapping from group name to its variables, or a plain list of
            variables when exactly one group is configured.
          tape: Unused; SAM records its own tapes.

        Returns:
          The `SamGradients` of the step.

        Raises:
          TypeError: If `loss` is not callable.
          ValueError: If a group has no base optimizer.
        """
        del tape
        if not callable(loss):
            raise TypeError('SAM needs a callable loss: it evaluates it twice or more')
        if not isinstance(var_list, Mapping):
            if len(self.rho) != 1:
                raise ValueError(
                    'pass var_list as {group: variables} with several groups'
                )
            var_list = {next(iter(self.rho)): list(var_list)}
        missing = [name for name in var_list if name not in self.base_optimizers]
        if missing:
            # Checked before any update, so a failed call changes nothing.
            raise ValueError(f'no base optimizer for variable groups {missing}')
        result = self.sam_gradients(loss, var_list)
        for name, variables in var_list.items():
            self.base_optimizers[name].apply_gradients(
                zip(result.gradients[name], variables)
            )
        self.iterations.assign_add(1)
        return result

    def get_config(self):
        config = super().get_config()
        config.update(
            rho={k: float(v) for k, v in self.rho.items()}, epsilon=self.epsilon
        )
        return config
