"""Tests of the SAM optimizer against an independent functional reference.

The reference (`_ref_*`) is plain float64 TensorFlow on tensors, no variables
and no project code: the embedding lookup is a one-hot matmul, so its gradient
is the dense-equivalent gradient with repeated rows summed.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_fedrecgel.optimizers import sam

NUM_ROWS, DIM, HIDDEN = 6, 3, 2
# Repeated indices: rows 0 and 2 appear several times, rows 1 and 3 never.
INDICES = np.array([0, 2, 2, 5, 0, 2, 4], np.int32)
LABELS = np.array([1, 0, 1, 1, 0, 0, 1], np.float32)
EXAMPLE_WEIGHTS = np.array([0.5, 0.25, 0.25, 1.0, 0.5, 0.2, 0.3], np.float32)
HEAD = np.array([1.5, -2.0], np.float32)
EPSILON = 1e-12
RADII = [(0.0, 0.0), (0.0, 0.3), (0.2, 0.0), (0.1, 0.5), (1.0, 2.0)]


def _initial_values():
    rng = np.random.default_rng(42)
    return collections.OrderedDict(
        table=rng.normal(size=(NUM_ROWS, DIM)).astype(np.float32),
        kernel=rng.normal(size=(DIM, HIDDEN)).astype(np.float32),
        bias=rng.normal(scale=0.1, size=(HIDDEN,)).astype(np.float32),
        user=rng.normal(size=(1, DIM)).astype(np.float32),
    )


# ----------------------------------------------------------------------------
# Independent reference (float64, functional).
# ----------------------------------------------------------------------------


def _ref_loss(table, kernel, bias, user):
    one_hot = tf.one_hot(INDICES, NUM_ROWS, dtype=tf.float64)
    rows = tf.matmul(one_hot, table)
    hidden = tf.tanh(tf.matmul(rows * user, kernel) + bias)
    logits = tf.linalg.matvec(hidden, tf.constant(HEAD, tf.float64))
    losses = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.constant(LABELS, tf.float64), logits=logits)
    return tf.reduce_sum(losses * tf.constant(EXAMPLE_WEIGHTS, tf.float64))


def _ref_grad(params):
    params = [tf.constant(p, tf.float64) for p in params]
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = _ref_loss(*params)
    return [g.numpy() for g in tape.gradient(loss, params)], loss.numpy()


def _ref_sam(values, rho_sh, rho_ns, eta=None):
    """Steps 4-6 of docs/ALGORITHM.md: (global grads, local grads, loss, perturbed losses).

    With `eta`, the global step is ASAM's: T = |w| + eta on the table and the
    kernel (1 on the bias), e = rho T^2 g / (||T g|| + epsilon).
    """
    theta = [np.asarray(values[k], np.float64)
             for k in ('table', 'kernel', 'bias', 'user')]
    grads, loss = _ref_grad(theta)
    g_sh, g_ns = grads[:3], grads[3:]
    t_sh = [np.ones_like(t) if eta is None or t.ndim < 2 else np.abs(t) + eta
            for t in theta[:3]]
    norm_sh = np.sqrt(sum(np.sum((t * g) ** 2) for t, g in zip(t_sh, g_sh)))
    e_sh = [rho_sh * t * t * g / (norm_sh + EPSILON) for t, g in zip(t_sh, g_sh)]
    grads_sh, loss_sh = _ref_grad(
        [t + e for t, e in zip(theta[:3], e_sh)] + theta[3:])
    norm_ns = np.sqrt(sum(np.sum(g ** 2) for g in g_ns))
    e_ns = [rho_ns * g / (norm_ns + EPSILON) for g in g_ns]
    grads_ns, loss_ns = _ref_grad(
        theta[:3] + [t + e for t, e in zip(theta[3:], e_ns)])
    return grads_sh[:3], grads_ns[3:], loss, (loss_sh, loss_ns)


# ----------------------------------------------------------------------------
# The model under test: variables, a gather (IndexedSlices gradient).
# ----------------------------------------------------------------------------


class _Model:
    """Variables and a loss with the reference's math, counting loss calls."""

    def __init__(self, values=None):
        values = values or _initial_values()
        self.table = tf.Variable(values['table'], name='table')
        self.kernel = tf.Variable(values['kernel'], name='kernel')
        self.bias = tf.Variable(values['bias'], name='bias')
        self.user = tf.Variable(values['user'], name='user')
        self.calls = 0

    def groups(self):
        return {'global': [self.table, self.kernel, self.bias],
                'local': [self.user]}

    def values(self):
        return collections.OrderedDict(
            (k, getattr(self, k).numpy())
            for k in ('table', 'kernel', 'bias', 'user'))

    def loss(self):
        self.calls += 1
        rows = tf.gather(self.table, INDICES)
        hidden = tf.tanh(tf.matmul(rows * self.user, self.kernel) + self.bias)
        logits = tf.linalg.matvec(hidden, HEAD)
        losses = tf.nn.sigmoid_cross_entropy_with_logits(
            labels=LABELS, logits=logits)
        return tf.reduce_sum(losses * EXAMPLE_WEIGHTS)


def _dense(gradients):
    return [tf.convert_to_tensor(g).numpy() for g in gradients]


def _assert_close(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('rho_sh,rho_ns', RADII)
def test_sam_gradients_match_reference(rho_sh, rho_ns):
    """Per-group SAM gradients equal the independent computation of steps 4-6."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': rho_sh, 'local': rho_ns})
    result = optimizer.sam_gradients(model.loss, model.groups())
    assert isinstance(result.gradients['global'][0], tf.IndexedSlices)
    ref_sh, ref_ns, ref_loss, _ = _ref_sam(values, rho_sh, rho_ns)
    _assert_close(_dense(result.gradients['global']), ref_sh)
    _assert_close(_dense(result.gradients['local']), ref_ns)
    np.testing.assert_allclose(result.loss.numpy(), ref_loss, rtol=1e-6)


def test_reference_perturbation_changes_gradients():
    """Sanity check of the fixture: nonzero radii move the gradients."""
    values = _initial_values()
    plain_sh, plain_ns, _, _ = _ref_sam(values, 0.0, 0.0)
    sam_sh, sam_ns, _, _ = _ref_sam(values, 0.2, 0.5)
    assert max(np.abs(a - b).max() for a, b in zip(plain_sh, sam_sh)) > 1e-2
    assert np.abs(plain_ns[0] - sam_ns[0]).max() > 1e-2
    # The duplicate rows matter: row 2 collects three examples.
    assert np.abs(plain_sh[0][2]).sum() > 0 and not plain_sh[0][1].any()


@pytest.mark.parametrize('rho_sh,rho_ns', [(0.0, 0.3), (0.2, 0.0), (1.0, 2.0)])
def test_perturbed_losses_match_reference(rho_sh, rho_ns):
    """perturbed_losses are the losses at the two perturbed points."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': rho_sh, 'local': rho_ns})
    result = optimizer.sam_gradients(model.loss, model.groups())
    _, _, ref_loss, (ref_sh, ref_ns) = _ref_sam(values, rho_sh, rho_ns)
    np.testing.assert_allclose(
        result.perturbed_losses['global'].numpy(), ref_sh, rtol=1e-6)
    np.testing.assert_allclose(
        result.perturbed_losses['local'].numpy(), ref_ns, rtol=1e-6)
    # SAM ascends: a nonzero radius raises the loss.
    for rho, name in ((rho_sh, 'global'), (rho_ns, 'local')):
        if rho:
            assert result.perturbed_losses[name].numpy() > ref_loss + 1e-4
        else:
            assert result.perturbed_losses[name].numpy() == pytest.approx(
                ref_loss, rel=1e-6)


def test_variables_restored_bitwise():
    """After sam_gradients every variable holds exactly its old bits."""
    model = _Model()
    before = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': 0.7, 'local': 1.3})
    optimizer.sam_gradients(model.loss, model.groups())
    for name, value in model.values().items():
        assert value.tobytes() == before[name].tobytes(), name


@pytest.mark.parametrize('rho_sh,rho_ns,calls', [
    (0, 0, 1), (0.0, 0.3, 2), (0.2, 0, 2), (0.2, 0.3, 3)])
def test_zero_radius_skips_pass(rho_sh, rho_ns, calls):
    """A Python 0 radius skips the extra pass and gives the plain gradient."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': rho_sh, 'local': rho_ns})
    result = optimizer.sam_gradients(model.loss, model.groups())
    assert model.calls == calls
    # The plain gradient of one tape pass on an identical model, bit for bit.
    twin = _Model(values)
    with tf.GradientTape() as tape:
        loss = twin.loss()
    plain = _dense(tape.gradient(loss, twin.groups()['global'] +
                                 twin.groups()['local']))
    if rho_sh == 0:
        for got, want in zip(_dense(result.gradients['global']), plain[:3]):
            assert got.tobytes() == want.tobytes()
        assert result.perturbed_losses['global'] is result.loss
    if rho_ns == 0:
        assert _dense(result.gradients['local'])[0].tobytes() == (
            plain[3].tobytes())
        assert result.perturbed_losses['local'] is result.loss


def test_tensor_zero_radius_runs_pass_but_is_plain():
    """A tensor radius of 0 runs the extra passes; the result stays plain."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': tf.constant(0.0), 'local': tf.constant(0.0)})
    result = optimizer.sam_gradients(model.loss, model.groups())
    assert model.calls == 3
    plain, _ = _ref_grad([np.asarray(v, np.float64) for v in values.values()])
    _assert_close(_dense(result.gradients['global']) +
                  _dense(result.gradients['local']), plain)


def test_tensor_radius_matches_python_radius():
    """A tensor radius gives the same SAM gradients as the Python float."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': tf.constant(0.1), 'local': tf.constant(0.5)})
    result = optimizer.sam_gradients(model.loss, model.groups())
    ref_sh, ref_ns, _, _ = _ref_sam(values, 0.1, 0.5)
    _assert_close(_dense(result.gradients['global']), ref_sh)
    _assert_close(_dense(result.gradients['local']), ref_ns)


def test_inside_tf_function():
    """sam_gradients traced in a tf.function matches the reference."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': 0.1, 'local': 0.5})

    @tf.function
    def run():
        result = optimizer.sam_gradients(model.loss, model.groups())
        return ([tf.convert_to_tensor(g) for g in result.gradients['global']],
                [tf.convert_to_tensor(g) for g in result.gradients['local']],
                result.perturbed_losses['global'])

    grads_sh, grads_ns, loss_sh = run()
    ref_sh, ref_ns, _, (ref_loss_sh, _) = _ref_sam(values, 0.1, 0.5)
    _assert_close([g.numpy() for g in grads_sh], ref_sh)
    _assert_close([g.numpy() for g in grads_ns], ref_ns)
    np.testing.assert_allclose(loss_sh.numpy(), ref_loss_sh, rtol=1e-6)
    for name, value in model.values().items():
        np.testing.assert_array_equal(value, values[name])


def test_minimize_applies_base_optimizers():
    """minimize steps each group with its own SGD on its SAM gradients."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': 0.2, 'local': 0.5},
        base_optimizers={'global': tf.keras.optimizers.SGD(0.1),
                         'local': tf.keras.optimizers.SGD(0.5)})
    optimizer.minimize(model.loss, model.groups())
    ref_sh, ref_ns, _, _ = _ref_sam(values, 0.2, 0.5)
    expected = [values[k] - 0.1 * g
                for k, g in zip(('table', 'kernel', 'bias'), ref_sh)]
    expected.append(values['user'] - 0.5 * ref_ns[0])
    _assert_close([v.numpy() for v in model.groups()['global']] +
                  [model.user.numpy()], expected)
    # Untouched embedding rows do not move.
    np.testing.assert_array_equal(model.table.numpy()[[1, 3]],
                                  values['table'][[1, 3]])
    assert int(optimizer.iterations.numpy()) == 1


def test_minimize_with_single_group_list():
    """A plain variable list works when exactly one group is configured."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'local': 0.5},
        base_optimizers={'local': tf.keras.optimizers.SGD(0.5)})
    optimizer.minimize(model.loss, [model.user])
    _, ref_ns, _, _ = _ref_sam(values, 0.0, 0.5)
    _assert_close([model.user.numpy()], [values['user'] - 0.5 * ref_ns[0]])
    np.testing.assert_array_equal(model.kernel.numpy(), values['kernel'])


def test_invalid_arguments():
    """Negative radius -> ValueError; non-callable loss -> TypeError."""
    with pytest.raises(ValueError):
        sam.SharpnessAwareMinimization(rho={'global': -0.1})
    with pytest.raises(ValueError):
        sam.SharpnessAwareMinimization(
            rho={'global': 0.1},
            base_optimizers={'local': tf.keras.optimizers.SGD(0.1)})
    model = _Model()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': 0.1, 'local': 0.1},
        base_optimizers={'global': tf.keras.optimizers.SGD(0.1),
                         'local': tf.keras.optimizers.SGD(0.1)})
    with pytest.raises(TypeError):
        optimizer.minimize(model.loss(), model.groups())
    with pytest.raises(ValueError):
        optimizer.minimize(model.loss, [model.user])
    with pytest.raises(ValueError):
        optimizer.sam_gradients(model.loss, {'other': [model.user]})


def test_minimize_validates_before_updating():
    """A group without base optimizer raises before any variable moves."""
    model = _Model()
    values = model.values()
    optimizer = sam.SharpnessAwareMinimization(
        rho={'global': 0.1, 'local': 0.1},
        base_optimizers={'global': tf.keras.optimizers.SGD(0.1)})
    with pytest.raises(ValueError):
        optimizer.minimize(model.loss, model.groups())
    for name, value in model.values().items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)


# ----------------------------------------------------------------------------
# The functional form (tensors) and norms per segment.
# ----------------------------------------------------------------------------


def _point_loss(point):
    """`_Model.loss` on tensors: point = {'global': [table, kernel, bias], 'local': [user]}."""
    (table, kernel, bias), (user,) = point['global'], point['local']
    rows = tf.gather(table, INDICES)
    hidden = tf.tanh(tf.matmul(rows * user, kernel) + bias)
    losses = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=LABELS, logits=tf.linalg.matvec(hidden, HEAD))
    return tf.reduce_sum(losses * EXAMPLE_WEIGHTS)


def _point(values):
    return {'global': [tf.constant(values[k]) for k in ('table', 'kernel', 'bias')],
            'local': [tf.constant(values['user'])]}


@pytest.mark.parametrize('rho_sh,rho_ns', RADII)
def test_sam_gradients_at_matches_reference_and_variables(rho_sh, rho_ns):
    """On tensors: the reference's gradients and losses, and the variable form's."""
    values = _initial_values()
    optimizer = sam.SharpnessAwareMinimization(rho={'global': rho_sh, 'local': rho_ns})
    result = optimizer.sam_gradients_at(_point_loss, _point(values))
    ref_sh, ref_ns, ref_loss, (ref_loss_sh, ref_loss_ns) = _ref_sam(values, rho_sh, rho_ns)
    _assert_close([g.numpy() for g in result.gradients['global']], ref_sh)
    _assert_close([g.numpy() for g in result.gradients['local']], ref_ns)
    np.testing.assert_allclose(result.loss.numpy(), ref_loss, rtol=1e-6)
    np.testing.assert_allclose(result.perturbed_losses['global'].numpy(), ref_loss_sh, rtol=1e-6)
    np.testing.assert_allclose(result.perturbed_losses['local'].numpy(), ref_loss_ns, rtol=1e-6)
    model = _Model(values)
    on_variables = optimizer.sam_gradients(model.loss, model.groups())
    for name in ('global', 'local'):
        _assert_close([g.numpy() for g in result.gradients[name]],
                      _dense(on_variables.gradients[name]))


SEGMENTS = 3


def _segment_values():
    """Three independent problems of the reference's kind."""
    out = []
    for seed in range(SEGMENTS):
        rng = np.random.default_rng(100 + seed)
        out.append(collections.OrderedDict(
            (k, rng.normal(scale=0.5, size=v.shape).astype(np.float32))
            for k, v in _initial_values().items()))
    return out


def _stacked(per_segment):
    """The problems stacked: the tables' rows one after the other, the rest on axis 0."""
    return collections.OrderedDict(
        table=np.concatenate([v['table'] for v in per_segment]),
        **{k: np.stack([v[k] for v in per_segment]) for k in ('kernel', 'bias', 'user')})


def _segment_losses(table, kernel, bias, user):
    """Problem s reads rows s * NUM_ROWS... of the table and slice s of the rest."""
    losses = []
    for s in range(SEGMENTS):
        rows = tf.gather(table, INDICES + s * NUM_ROWS)
        hidden = tf.tanh(tf.matmul(rows * user[s], kernel[s]) + bias[s])
        logits = tf.linalg.matvec(hidden, HEAD)
        losses.append(tf.reduce_sum(EXAMPLE_WEIGHTS * tf.nn.sigmoid_cross_entropy_with_logits(
            labels=LABELS, logits=logits)))
    return tf.stack(losses)


TABLE_SEGMENTS = np.repeat(np.arange(SEGMENTS, dtype=np.int32), NUM_ROWS)
ROW_IDS = {'global': [tf.constant(TABLE_SEGMENTS), None, None]}


def _assert_segments_match_reference(result, per_segment, rho_sh, rho_ns):
    stacked_sh = _dense(result.gradients['global'])
    (stacked_ns,) = _dense(result.gradients['local'])
    for s, values in enumerate(per_segment):
        ref_sh, ref_ns, ref_loss, (ref_loss_sh, ref_loss_ns) = _ref_sam(values, rho_sh, rho_ns)
        rows = slice(s * NUM_ROWS, (s + 1) * NUM_ROWS)
        _assert_close([stacked_sh[0][rows], stacked_sh[1][s], stacked_sh[2][s]], ref_sh)
        _assert_close([stacked_ns[s]], ref_ns)
        np.testing.assert_allclose(result.loss.numpy()[s], ref_loss, rtol=1e-6)
        np.testing.assert_allclose(result.perturbed_losses['global'].numpy()[s], ref_loss_sh,
                                   rtol=1e-6)
        np.testing.assert_allclose(result.perturbed_losses['local'].numpy()[s], ref_loss_ns,
                                   rtol=1e-6)


@pytest.mark.parametrize('rho_sh,rho_ns', [(0.2, 0.0), (0.1, 0.5), (1.0, 2.0)])
def test_norm_per_segment_equals_each_problem_alone(rho_sh, rho_ns):
    """With segments, every stacked problem gets its own norm: as if run alone.

    On tensors and on variables (where the table's gradient is sparse and
    its rows are mapped to their problem by `row_ids`).
    """
    per_segment = _segment_values()
    stacked = _stacked(per_segment)
    optimizer = sam.SharpnessAwareMinimization(rho={'global': rho_sh, 'local': rho_ns})
    segments = sam.NormSegments(count=SEGMENTS, row_ids=ROW_IDS)
    on_tensors = optimizer.sam_gradients_at(
        lambda p: _segment_losses(*p['global'], *p['local']),
        {'global': [tf.constant(stacked[k]) for k in ('table', 'kernel', 'bias')],
         'local': [tf.constant(stacked['user'])]}, segments=segments)
    _assert_segments_match_reference(on_tensors, per_segment, rho_sh, rho_ns)

    variables = {k: tf.Variable(v) for k, v in stacked.items()}
    on_variables = optimizer.sam_gradients(
        lambda: _segment_losses(*variables.values()),
        {'global': [variables[k] for k in ('table', 'kernel', 'bias')],
         'local': [variables['user']]}, segments=segments)
    assert isinstance(on_variables.gradients['global'][0], tf.IndexedSlices)
    _assert_segments_match_reference(on_variables, per_segment, rho_sh, rho_ns)
    for name, value in variables.items():
        assert value.numpy().tobytes() == stacked[name].tobytes(), name
    # One norm over all the problems is another computation.
    joint = optimizer.sam_gradients_at(
        lambda p: tf.reduce_sum(_segment_losses(*p['global'], *p['local'])),
        {'global': [tf.constant(stacked[k]) for k in ('table', 'kernel', 'bias')],
         'local': [tf.constant(stacked['user'])]})
    assert np.abs(joint.gradients['global'][1].numpy()
                  - on_tensors.gradients['global'][1].numpy()).max() > 1e-4


def test_sam_gradients_at_in_a_while_loop():
    """The tensor form writes nothing, so it runs in a `tf.while_loop` body."""
    values = _initial_values()
    optimizer = sam.SharpnessAwareMinimization(rho={'global': 0.1, 'local': 0.5})

    @tf.function
    def two_sgd_steps(point):
        def body(step, point):
            grads = optimizer.sam_gradients_at(_point_loss, point).gradients
            return step + 1, {name: [x - 0.1 * g for x, g in zip(point[name], grads[name])]
                              for name in point}
        return tf.while_loop(lambda step, _: step < 2, body, (tf.constant(0), point))[1]

    got = two_sgd_steps(_point(values))
    expected = dict(values)
    for _ in range(2):
        ref_sh, ref_ns, _, _ = _ref_sam(expected, 0.1, 0.5)
        expected = collections.OrderedDict(
            (k, expected[k] - 0.1 * g) for k, g in zip(expected, ref_sh + ref_ns))
    _assert_close([x.numpy() for x in got['global'] + got['local']], list(expected.values()))


def test_segments_must_match_groups():
    optimizer = sam.SharpnessAwareMinimization(rho={'global': 0.1, 'local': 0.1})
    point = _point(_initial_values())
    for row_ids in ({'global': [None]}, {'other': [None]}):
        with pytest.raises(ValueError):
            optimizer.sam_gradients_at(_point_loss, point,
                                       segments=sam.NormSegments(count=1, row_ids=row_ids))
    with pytest.raises(ValueError):
        optimizer.sam_gradients_at(_point_loss, {'other': point['local']})
