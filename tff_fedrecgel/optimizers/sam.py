"""Sharpness-aware minimization (SAM) with one radius per variable group.

For each group g with radius rho_g > 0, SAM evaluates the gradient of the loss
at the point where only that group is moved along its own normalized gradient,

    e_g = rho_g * grad_g L(w) / (||grad_g L(w)|| + epsilon),
    sam_grad_g = grad_g L(w_g + e_g, w_rest),

the norm taken jointly over all the group's tensors. The groups are perturbed
separately, never jointly, each from the unperturbed point. A group with a
Python radius of 0 takes the plain gradient and costs no extra pass.

A group may be adaptive (ASAM, Kwon et al., ICML 2021): with
`T_w = |w| + eta` elementwise on its scaled tensors (1 on the others),

    e_g = rho_g * T_w^2 grad_g L(w) / (||T_w grad_g L(w)|| + epsilon),

so the radius is relative to each weight's size.

`SharpnessAwareMinimization` runs these passes in two forms, with one
implementation of the norm, the step e and the second gradient:

* on variables (`sam_gradients`, and `minimize`, which then applies each
  group's base optimizer): e is added in place and undone exactly (the saved
  values are restored, not subtracted); embedding (IndexedSlices) gradients
  are handled sparsely, only the touched rows are moved and restored;
* on tensors (`sam_gradients_at`): the loss is a function of the point and
  nothing is written, so it runs in any trace, a TFF computation or a
  `tf.while_loop` body (FedRecGEL's client update runs it).

Both can split the norm into segments (`NormSegments`): a group that holds
many independent models stacked on a leading axis (the users of a TFF client
that stands for a group of users) gets each model's own norm and step, the
loss then being one value per segment.

Keras 2.14's own SharpnessAwareMinimization only works through `Model.fit`
and cannot sum embedding gradients; this optimizer takes a callable loss, as
TFF client work needs.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Union

import tensorflow as tf

Gradient = Union[tf.Tensor, tf.IndexedSlices]
Radius = Union[float, tf.Tensor]
# Added to the gradient norm before dividing (docs/ALGORITHM.md, steps 5-6).
EPSILON = 1e-12


def perturbation_scale(squared_norm: tf.Tensor, rho: Radius,
                       epsilon: float = EPSILON) -> tf.Tensor:
    """The factor `rho / (||g|| + epsilon)` that turns g into SAM's step e.

    Args:
      squared_norm: `||g||^2` of a variable group (any shape: one per segment).
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
        per variable or tensor, in the group's order.
      loss: The loss at the unperturbed point (what the loss function returns:
        a scalar, or one loss per segment).
      perturbed_losses: Per group, the loss at the perturbed point (`loss`
        itself for a group with rho = 0). `perturbed_losses[g] - loss` is the
        sharpness of the loss along group g's ascent direction.
    """

    gradients: dict[str, list[Gradient]]
    loss: tf.Tensor
    perturbed_losses: dict[str, tf.Tensor]


class NormSegments(NamedTuple):
    """SAM with one norm, and one step, per segment of every group.

    Attributes:
      count: The number of segments S (an int or a scalar tensor).
      row_ids: Optional, per group name, one entry per tensor of the group:
        an int vector giving the segment of each slice along the tensor's axis
        0, or None for a tensor whose axis 0 is the segment axis (`[S, ...]`).
        Every tensor of a group not named here is `[S, ...]`. For a sparse
        (IndexedSlices) gradient the entry applies to the rows it indexes.
    """

    count: Any
    row_ids: Mapping[str, Sequence[Any]] | None = None


class _Piece(NamedTuple):
    """One gradient: dense values, or the summed rows of a sparse one."""

    values: tf.Tensor
    indices: tf.Tensor | None  # The rows' indices for a sparse gradient.


def _unique_rows(gradient: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """Sums repeated rows of an IndexedSlices: (unique indices, summed rows)."""
    unique, position = tf.unique(gradient.indices)
    rows = tf.math.unsorted_segment_sum(gradient.values, position, tf.size(unique))
    return unique, rows


def _pieces(grads: Sequence[Gradient | None]) -> list[_Piece | None]:
    pieces = []
    for grad in grads:
        if grad is None:
            pieces.append(None)
        elif isinstance(grad, tf.IndexedSlices):
            indices, rows = _unique_rows(grad)
            pieces.append(_Piece(rows, indices))
        else:
            pieces.append(_Piece(grad, None))
    return pieces


def _row_sums(values: tf.Tensor) -> tf.Tensor:
    """Sums every slice along axis 0: `[R, ...] -> [R]`."""
    if values.shape.rank == 2:
        return tf.reduce_sum(values, axis=1)
    return tf.reduce_sum(tf.reshape(values, [tf.shape(values)[0], -1]), axis=1)


def _row_segments(piece: _Piece, ids) -> tf.Tensor | None:
    """The segment of each row of a piece; None when its rows are the segments."""
    if piece.indices is None:
        return ids
    return piece.indices if ids is None else tf.gather(ids, piece.indices)


def _squared_norm(pieces, ids, count) -> tf.Tensor:
    """`||g||^2` of a group: a scalar, or `[count]` with segments."""
    if count is None:
        squares = [tf.reduce_sum(tf.square(p.values)) for p in pieces if p is not None]
        return tf.add_n(squares) if squares else tf.constant(0.0)
    # Rows that share one segment vector are added before their segment sum.
    by_ids, leading = [], []
    for piece, piece_ids in zip(pieces, ids):
        if piece is None:
            continue
        rows = _row_sums(tf.square(piece.values))
        segment = _row_segments(piece, piece_ids)
        if segment is None:
            leading.append(rows)
            continue
        shared = next((entry for entry in by_ids if entry[0] is segment), None)
        if shared is None:
            by_ids.append((segment, [rows]))
        else:
            shared[1].append(rows)
    parts = [tf.math.unsorted_segment_sum(tf.add_n(rows), segment, count)
             for segment, rows in by_ids]
    if leading:
        parts.append(tf.add_n(leading))
    if not parts:
        return tf.zeros([count])
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _ascent_steps(pieces, scale: tf.Tensor, ids, count) -> list[tf.Tensor | None]:
    """SAM's step e for each piece: its gradient times its segment's scale."""
    if count is None:
        return [None if p is None else p.values * scale for p in pieces]
    gathered = []  # (segment vector, its rows' scales): one gather per vector.
    steps = []
    for piece, piece_ids in zip(pieces, ids):
        if piece is None:
            steps.append(None)
            continue
        segment = _row_segments(piece, piece_ids)
        if segment is None:
            row_scale = scale
        else:
            row_scale = next((s for seg, s in gathered if seg is segment), None)
            if row_scale is None:
                row_scale = tf.gather(scale, segment)
                gathered.append((segment, row_scale))
        rank = piece.values.shape.rank
        steps.append(tf.reshape(row_scale, [-1] + [1] * (rank - 1)) * piece.values)
    return steps


def _times(piece: _Piece | None, factor: tf.Tensor | None) -> _Piece | None:
    if piece is None or factor is None:
        return piece
    return _Piece(piece.values * factor, piece.indices)


def _adaptive(pieces, weights, eta: float, scaled) -> list[tuple]:
    """ASAM's `(T g, T)` per piece, with `T = |w| + eta` (None: not scaled)."""
    scaled = [True] * len(pieces) if scaled is None else list(scaled)
    out = []
    for piece, weight, scale_it in zip(pieces, weights, scaled):
        factor = tf.abs(weight) + eta if piece is not None and scale_it else None
        out.append((_times(piece, factor), factor))
    return out


def _total(loss: tf.Tensor) -> tf.Tensor:
    """What is differentiated: the loss, or the sum of the segments' losses."""
    return loss if loss.shape.rank == 0 else tf.reduce_sum(loss)


def _dense(grads, like) -> list[tf.Tensor]:
    return [tf.zeros_like(x) if g is None else tf.convert_to_tensor(g)
            for g, x in zip(grads, like)]


def _split(flat: Sequence, groups: Mapping[str, Sequence]) -> dict[str, list]:
    out, start = {}, 0
    for name, members in groups.items():
        out[name] = list(flat[start : start + len(members)])
        start += len(members)
    return out


class SharpnessAwareMinimization(tf.keras.optimizers.Optimizer):
    """SAM over named variable groups, each with its own radius and optimizer.

    `sam_gradients` (variables) and `sam_gradients_at` (tensors) compute the
    SAM gradients of every group; `minimize` additionally applies them with
    each group's base optimizer.
    """

    def __init__(
        self,
        *,
        rho: Mapping[str, Radius],
        base_optimizers: Mapping[str, tf.keras.optimizers.Optimizer] | None = None,
        epsilon: float = EPSILON,
        adaptive_eta: Mapping[str, float] | None = None,
        name: str = 'SharpnessAwareMinimization',
    ):
        """Initializes the optimizer.

        Args:
          rho: The radius of each variable group, by group name. A Python 0 skips
            that group's extra pass; a tensor radius always runs it.
          base_optimizers: Optional optimizer per group, used by `minimize`.
          epsilon: Added to the gradient norm before dividing.
          adaptive_eta: Optional, per group name: ASAM's eta, making that
            group adaptive (its step scaled by `|w| + eta`).
          name: The optimizer's name.

        Raises:
          ValueError: If a radius or an eta is negative, or `base_optimizers`
            or `adaptive_eta` names a group that has no radius.
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
        self.adaptive_eta = {k: float(v) for k, v in (adaptive_eta or {}).items()}
        if set(self.adaptive_eta) - set(self.rho):
            raise ValueError('adaptive_eta for groups without a radius: '
                             f'{set(self.adaptive_eta) - set(self.rho)}')
        if any(v < 0 for v in self.adaptive_eta.values()):
            raise ValueError(f'adaptive_eta must be >= 0, got {self.adaptive_eta}')

    def _check(self, groups: Mapping[str, Sequence], segments: NormSegments | None):
        missing = set(groups) - set(self.rho)
        if missing:
            raise ValueError(f'no radius for variable groups {sorted(missing)}')
        row_ids = (segments.row_ids or {}) if segments is not None else {}
        for name, ids in row_ids.items():
            if name not in groups or len(ids) != len(groups[name]):
                raise ValueError(f'segments.row_ids[{name!r}] needs one entry per tensor '
                                 'of that group')

    def sam_gradients(
        self,
        loss_fn: Callable[[], tf.Tensor],
        var_groups: Mapping[str, Sequence[tf.Variable]],
        *,
        segments: NormSegments | None = None,
        scaled: Mapping[str, Sequence[bool]] | None = None,
    ) -> SamGradients:
        """Computes the SAM gradient of every group of variables (steps 4-6 (docs/ALGORITHM.md)).

        Args:
          loss_fn: Computes the loss from the current variable values: a scalar,
            or with `segments` one loss per segment (their sum is differentiated).
          var_groups: The variables of each group, by group name (every group
            needs a radius).
          segments: Optional: one norm per segment instead of one per group.
          scaled: Optional, per adaptive group, which of its variables ASAM
            scales (default: all).

        Returns:
          A `SamGradients`; embedding gradients stay IndexedSlices.

        Raises:
          ValueError: If a group has no radius, or `segments` does not match the
            groups.
        """
        self._check(var_groups, segments)
        all_vars = [v for name in var_groups for v in var_groups[name]]
        with tf.GradientTape() as tape:
            loss = loss_fn()
            total = _total(loss)
        base = _split(tape.gradient(total, all_vars), var_groups)

        def gradient_at(name, pieces, steps):
            variables = list(var_groups[name])
            restores = []
            for var, piece, step in zip(variables, pieces, steps):
                if piece is None:
                    continue
                if piece.indices is None:
                    saved = tf.identity(var.read_value())
                    var.assign_add(step)
                else:
                    saved = tf.gather(var, piece.indices)
                    var.scatter_add(tf.IndexedSlices(step, piece.indices))
                restores.append((var, piece.indices, saved))
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(variables)
                moved_loss = loss_fn()
                moved_total = _total(moved_loss)
            grads = tape.gradient(moved_total, variables)
            for var, indices, saved in restores:
                if indices is None:
                    var.assign(saved)
                else:
                    var.scatter_update(tf.IndexedSlices(saved, indices))
            return moved_loss, list(grads)

        def values(name, pieces):
            return [tf.gather(var, piece.indices) if piece.indices is not None
                    else var.read_value() for var, piece in zip(var_groups[name], pieces)]

        return self._sam_passes(base, loss, gradient_at, segments, values, scaled)

    def sam_gradients_at(
        self,
        loss_fn: Callable[[dict[str, list[tf.Tensor]]], tf.Tensor],
        point: Mapping[str, Sequence[tf.Tensor]],
        *,
        segments: NormSegments | None = None,
        scaled: Mapping[str, Sequence[bool]] | None = None,
    ) -> SamGradients:
        """Computes the SAM gradient of every group of a point given as tensors.

        The functional form: no variable is read or written, so it can run
        inside any trace (a TFF computation, a `tf.while_loop` body).

        Args:
          loss_fn: Maps a point (a dict of lists of tensors, structured like
            `point`) to the loss: a scalar, or with `segments` one loss per
            segment (their sum is differentiated).
          point: The tensors of each group, by group name (every group needs a
            radius).
          segments: Optional: one norm per segment instead of one per group.
          scaled: As `sam_gradients`.

        Returns:
          A `SamGradients` with dense gradients (zeros where the loss does not
          depend on a tensor).

        Raises:
          ValueError: If a group has no radius, or `segments` does not match the
            groups.
        """
        self._check(point, segments)
        point = {name: [tf.convert_to_tensor(x) for x in xs] for name, xs in point.items()}
        flat = [x for name in point for x in point[name]]
        with tf.GradientTape() as tape:
            tape.watch(flat)
            loss = loss_fn(point)
            total = _total(loss)
        base = _split(_dense(tape.gradient(total, flat), flat), point)

        def gradient_at(name, pieces, steps):
            moved = [x if step is None else x + step
                     for x, piece, step in zip(point[name], pieces, steps)]
            with tf.GradientTape() as tape:
                tape.watch(moved)
                moved_loss = loss_fn({**point, name: moved})
                moved_total = _total(moved_loss)
            return moved_loss, _dense(tape.gradient(moved_total, moved), moved)

        return self._sam_passes(base, loss, gradient_at, segments,
                                lambda name, pieces: point[name], scaled)

    def _sam_passes(self, base, loss, gradient_at, segments, values_of=None,
                    scaled=None) -> SamGradients:
        """The groups' SAM passes, each from the unperturbed point.

        Args:
          base: Per group, the gradients at the unperturbed point.
          loss: The loss there.
          gradient_at: `(group, pieces, steps) -> (loss, gradients)` at the point
            where the group is moved by `steps` (the form's own way of moving).
          segments: The `NormSegments`, or None for one norm per group.
          values_of: `(group, pieces) -> the weights at the pieces` (each
            piece's rows for a sparse one), for an adaptive group.
          scaled: Per adaptive group, which tensors ASAM scales.

        Returns:
          A `SamGradients`.
        """
        count = None if segments is None else segments.count
        row_ids = (segments.row_ids or {}) if segments is not None else {}
        gradients, perturbed_losses = {}, {}
        for name, grads in base.items():
            rho = self.rho[name]
            if is_static_zero(rho) or not grads:
                gradients[name], perturbed_losses[name] = list(grads), loss
                continue
            pieces = _pieces(grads)
            ids = list(row_ids.get(name, [None] * len(grads)))
            directions = pieces
            if name in self.adaptive_eta:
                pieces_t = _adaptive(pieces, values_of(name, pieces), self.adaptive_eta[name],
                                     (scaled or {}).get(name))
                # ||T g|| and T (T g): `directions` times the scale is the step.
                directions = [_times(pt, t) for pt, t in pieces_t]
                pieces_for_norm = [pt for pt, _ in pieces_t]
            else:
                pieces_for_norm = pieces
            scale = perturbation_scale(_squared_norm(pieces_for_norm, ids, count), rho,
                                       self.epsilon)
            steps = _ascent_steps(directions, scale, ids, count)
            perturbed_losses[name], gradients[name] = gradient_at(name, pieces, steps)
        return SamGradients(gradients, loss, perturbed_losses)

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
            rho={k: float(v) for k, v in self.rho.items()}, epsilon=self.epsilon,
            adaptive_eta=dict(self.adaptive_eta),
        )
        return config
