"""SAM as client work runs it: FedRecGEL's client update takes its passes
from the Keras optimizer, and the docs' example puts it in a TFF client work."""

import collections
import pathlib
import runpy

import numpy as np
import tensorflow as tf

from tests.test_sam import EPSILON
from tests.test_sam import _assert_close
from tff_fedrecgel.optimizers import sam


def test_client_update_runs_the_optimizer(monkeypatch):
    """FedRecGEL's client update takes its SAM passes from this optimizer."""
    from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top

    calls = []
    original = sam.SharpnessAwareMinimization.sam_gradients_at

    def spy(self, loss_fn, point, *, segments=None, scaled=None):
        calls.append((dict(self.rho), sorted(point), segments.count))
        return original(self, loss_fn, point, segments=segments, scaled=scaled)

    monkeypatch.setattr(sam.SharpnessAwareMinimization, 'sam_gradients_at', spy)
    config = neumf.ModelConfig(num_items=10, gmf_dim=2, mlp_dim=4, mlp_layers=(4, 2))
    work = client_update.ClientWorkConfig(rho_sh=0.3, rho_ns=0.7, local_state='reconstruct')
    update = client_update.build_client_update(config, work, single_user=True)
    weights = [v.numpy() for v in neumf.NeuMF(config).global_variables]
    data = collections.OrderedDict(items=np.array([1, 4, 4, 7], np.int32),
                                   labels=np.array([1, 0, 1, 0], np.float32))
    out = update.fn(weights, None, data)
    assert len(calls) == 1
    rho, groups, count = calls[0]
    assert rho == {'global': 0.3, 'local': 0.7} and groups == ['global', 'local']
    assert int(count) == 1
    assert np.isfinite(out['metrics']['sam_loss_global'].numpy())


API_DOC = pathlib.Path(__file__).resolve().parents[1] / 'docs' / 'API.md'


def _api_doc_example() -> str:
    text = API_DOC.read_text()
    section = text[text.index('## SAM in your own TFF client work'):]
    start = section.index('```python\n') + len('```python\n')
    return section[start:section.index('\n```', start)]


def test_api_doc_example_runs_and_is_sam(tmp_path):
    """The docs' block runs as written; it trains; a client's update is SAM + SGD by hand."""
    script = tmp_path / 'sam_example.py'  # A file, so AutoGraph can read the source.
    script.write_text(_api_doc_example())
    example = runpy.run_path(str(script))
    process, client_data = example['process'], example['client_data']
    initial = process.initialize()
    trained = initial
    for _ in range(3):
        trained = process.next(trained, [client_data(0, 12), client_data(1, 8)]).state

    def mse(weights, dataset):
        model = example['build_model']()
        for var, value in zip(model.trainable_variables, weights):
            var.assign(value)
        batches = list(dataset.unbatch().batch(1000))
        return float(tf.reduce_mean(tf.square(model(batches[0]['x']) - batches[0]['y'])))

    data = client_data(0, 12)
    initial_weights = initial.global_model_weights.trainable
    assert mse(trained.global_model_weights.trainable, data) < 0.9 * mse(initial_weights, data)

    # One client's upload against SAM and SGD written out with a tape.
    result = example['client_update'](initial.global_model_weights, data)
    weights = [tf.constant(w) for w in initial_weights]
    model = example['build_model']()
    rho, lr = example['RHO'], example['CLIENT_LR']

    def gradient(at, batch):
        for var, value in zip(model.trainable_variables, at):
            var.assign(value)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(batch['x']) - batch['y']))
        return tape.gradient(loss, model.trainable_variables)

    plain = list(weights)
    for batch in data:
        g = gradient(weights, batch)
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(x)) for x in g]))
        sam_g = gradient([w + rho * x / (norm + EPSILON) for w, x in zip(weights, g)], batch)
        weights = [w - lr * x for w, x in zip(weights, sam_g)]
        plain = [w - lr * x for w, x in zip(plain, gradient(plain, batch))]
    _assert_close(result.update, [a - b.numpy() for a, b in zip(initial_weights, weights)])
    assert result.update_weight == 12
    # SAM, not plain SGD: the two uploads differ.
    assert max(np.abs(u - (a - p.numpy())).max()
               for u, a, p in zip(result.update, initial_weights, plain)) > 1e-4
