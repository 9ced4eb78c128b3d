"""The adaptive (ASAM) group of the SAM optimizer against the reference of
tests/test_sam.py, which takes ASAM's `eta`."""

import numpy as np
import pytest
import tensorflow as tf

from tests.test_sam import NUM_ROWS
from tests.test_sam import ROW_IDS
from tests.test_sam import SEGMENTS
from tests.test_sam import _assert_close
from tests.test_sam import _dense
from tests.test_sam import _initial_values
from tests.test_sam import _Model
from tests.test_sam import _point
from tests.test_sam import _point_loss
from tests.test_sam import _ref_sam
from tests.test_sam import _segment_losses
from tests.test_sam import _segment_values
from tests.test_sam import _stacked
from tff_fedrecgel.optimizers import sam

ETA = 0.2


@pytest.mark.parametrize('rho_sh,rho_ns', [(0.7, 0.0), (0.3, 0.5)])
def test_adaptive_group_matches_asam_reference(rho_sh, rho_ns):
    """ASAM's step on the global group, on tensors and on variables (sparse rows)."""
    values = _initial_values()
    optimizer = sam.SharpnessAwareMinimization(rho={'global': rho_sh, 'local': rho_ns},
                                               adaptive_eta={'global': ETA})
    scaled = {'global': [True, True, False]}
    ref_sh, ref_ns, _, (ref_loss_sh, _) = _ref_sam(values, rho_sh, rho_ns, eta=ETA)
    plain_sh = _ref_sam(values, rho_sh, rho_ns)[0]
    assert not np.allclose(ref_sh[1], plain_sh[1], rtol=1e-4)  # ASAM moves elsewhere.
    on_tensors = optimizer.sam_gradients_at(_point_loss, _point(values), scaled=scaled)
    model = _Model(values)
    on_variables = optimizer.sam_gradients(model.loss, model.groups(), scaled=scaled)
    for result in (on_tensors, on_variables):
        _assert_close(_dense(result.gradients['global']), ref_sh)
        _assert_close(_dense(result.gradients['local']), ref_ns)
        np.testing.assert_allclose(result.perturbed_losses['global'].numpy(), ref_loss_sh,
                                   rtol=1e-6)
    _assert_close(list(model.values().values()), list(values.values()))  # Restored.


def test_adaptive_norm_per_segment_equals_each_problem_alone():
    per_segment = _segment_values()
    optimizer = sam.SharpnessAwareMinimization(rho={'global': 0.7, 'local': 0.0},
                                               adaptive_eta={'global': ETA})
    result = optimizer.sam_gradients_at(
        lambda p: _segment_losses(*p['global'], *p['local']),
        {'global': [tf.constant(v) for k, v in _stacked(per_segment).items() if k != 'user'],
         'local': [tf.constant(_stacked(per_segment)['user'])]},
        segments=sam.NormSegments(SEGMENTS, ROW_IDS), scaled={'global': [True, True, False]})
    stacked_sh = _dense(result.gradients['global'])
    for s, values in enumerate(per_segment):
        ref_sh = _ref_sam(values, 0.7, 0.0, eta=ETA)[0]
        rows = slice(s * NUM_ROWS, (s + 1) * NUM_ROWS)
        _assert_close([stacked_sh[0][rows], stacked_sh[1][s], stacked_sh[2][s]], ref_sh)


def test_adaptive_eta_refuses_unknown_group_and_negative():
    with pytest.raises(ValueError, match='without a radius'):
        sam.SharpnessAwareMinimization(rho={'global': 0.1}, adaptive_eta={'local': 0.1})
    with pytest.raises(ValueError, match='>= 0'):
        sam.SharpnessAwareMinimization(rho={'global': 0.1}, adaptive_eta={'global': -1.0})
