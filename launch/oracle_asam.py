r"""Checks FedASAM's client step against the FedSAM authors' ASAM, run as an oracle.

The authors' code (github.com/debcaldarola/fedsam) is not part of this
project: give a checkout of it and a Python that has PyTorch::

    python launch/oracle_asam.py --authors_code=/tmp/fedsam \
        --torch_python=/tmp/torch_venv/bin/python \
        --data_dir=/path/to/datasets/filmtrust --users=5

For each of the first --users users of the FilmTrust split, one batch (the
user's training items, labelled 1, and as many items it never rated,
labelled 0) and the same NeuMF weights go to both sides:

* here, the client update of `--algorithm=fedasam` for one user (the global
  part's ASAM gradient, the 'gradient' upload, rho 0.7, eta 0.2, no local
  radius, mean loss);
* there, a PyTorch NeuMF with the same weights (its user embedding a buffer,
  so ASAM moves only the global part, as here), the loss's gradient, the
  authors' `ASAM.ascent_step()`, and the gradient at the moved point.

It prints the largest absolute and relative difference of those gradients
and exits 1 when the relative one exceeds --tolerance.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

if __package__ in (None, ''):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_fedrecgel.launch import _entry

_entry.setup_environment()

from absl import flags
import numpy as np
# pylint: enable=g-import-not-at-top,wrong-import-position

_AUTHORS = flags.DEFINE_string('authors_code', None, 'A checkout of debcaldarola/fedsam.')
_TORCH_PYTHON = flags.DEFINE_string('torch_python', None, 'A Python with PyTorch.')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'The FilmTrust folder.')
_USERS = flags.DEFINE_integer('users', 5, 'Users to check.', lower_bound=1)
_TOLERANCE = flags.DEFINE_float('tolerance', 1e-4, 'Largest relative difference.')

# The torch side: the authors' ASAM on a NeuMF of the same weights.
_TORCH_SIDE = r'''
import importlib.util, json, sys
import numpy as np, torch
spec = importlib.util.spec_from_file_location('minimizers', sys.argv[1])
minimizers = importlib.util.module_from_spec(spec); spec.loader.exec_module(minimizers)
case = np.load(sys.argv[2]); meta = json.loads(sys.argv[3])
torch.set_default_dtype(torch.float32)

class NeuMF(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.item_gmf = torch.nn.Embedding(*case['g0'].shape)
        self.item_mlp = torch.nn.Embedding(*case['g1'].shape)
        self.tower = torch.nn.ModuleList(
            torch.nn.Linear(*case[f'g{2 + 2 * i}'].shape) for i in range(meta['layers']))
        self.out = torch.nn.Linear(*case[f'g{meta["n"] - 2}'].shape)
        self.register_buffer('user_gmf', torch.tensor(case['u0']))
        self.register_buffer('user_mlp', torch.tensor(case['u1']))
        with torch.no_grad():
            self.item_gmf.weight.copy_(torch.tensor(case['g0']))
            self.item_mlp.weight.copy_(torch.tensor(case['g1']))
            for i, layer in enumerate(self.tower):  # Keras kernels are [in, out].
                layer.weight.copy_(torch.tensor(case[f'g{2 + 2 * i}']).T)
                layer.bias.copy_(torch.tensor(case[f'g{3 + 2 * i}']))
            self.out.weight.copy_(torch.tensor(case[f'g{meta["n"] - 2}']).T)
            self.out.bias.copy_(torch.tensor(case[f'g{meta["n"] - 1}']))

    def forward(self, items):
        gmf = self.user_gmf * self.item_gmf(items)
        h = torch.cat([self.user_mlp.expand(len(items), -1), self.item_mlp(items)], 1)
        for layer in self.tower:
            h = torch.relu(layer(h))
        return self.out(torch.cat([gmf, h], 1))[:, 0]

model = NeuMF()
items, labels = torch.tensor(case['items']).long(), torch.tensor(case['labels'])
loss_fn = lambda: torch.nn.functional.binary_cross_entropy_with_logits(model(items), labels)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
asam = minimizers.ASAM(optimizer, model, rho=meta['rho'], eta=meta['eta'])
loss_fn().backward()
asam.ascent_step()
loss_fn().backward()
grads = [model.item_gmf.weight.grad, model.item_mlp.weight.grad]
for layer in model.tower:
    grads += [layer.weight.grad.T, layer.bias.grad]
grads += [model.out.weight.grad.T, model.out.bias.grad]
np.savez(sys.argv[4], *[g.detach().numpy() for g in grads])
'''


def _case(split, user, config, rng):
    """One user's batch and the weights both sides start from."""
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top

    positives = np.unique(split.train_items[split.train_users == user])
    unseen = np.setdiff1d(np.arange(split.num_items), positives)
    negatives = rng.choice(unseen, size=len(positives), replace=False)
    items = np.concatenate([positives, negatives]).astype(np.int32)
    labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))]
                            ).astype(np.float32)
    model = neumf.NeuMF(config, seed=user)
    scale = 0.1  # Trained-looking weights: ASAM's |w| then matters beside eta.
    weights = [(v.numpy() + rng.normal(scale=scale, size=v.shape)).astype(np.float32)
               for v in model.global_variables]
    local = [rng.normal(scale=scale, size=v.shape).astype(np.float32)
             for v in model.local_variables]
    return items, labels, weights, local


def main(argv):
    del argv
    for name, value in (('authors_code', _AUTHORS.value), ('torch_python', _TORCH_PYTHON.value),
                        ('data_dir', _DATA_DIR.value)):
        if not value:
            raise ValueError(f'--{name} is required')
    minimizers = pathlib.Path(_AUTHORS.value) / 'models' / 'clients' / 'minimizers.py'
    if not minimizers.is_file():
        raise ValueError(f'--authors_code={_AUTHORS.value} has no models/clients/minimizers.py')
    from tff_fedrecgel import methods  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithm_config import ClientWorkConfig  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top

    method = methods.get_method('fedasam')
    rho = method.default_radii[0]
    split = tasks.get_task('filmtrust').load_split(data_dir=_DATA_DIR.value, validation=False)
    config = neumf.ModelConfig(num_items=split.num_items)
    # The 'gradient' upload is the ASAM gradient itself; the mean loss is the
    # authors' criterion.
    work = ClientWorkConfig(rho_sh=rho, rho_ns=0.0, sam_eta=method.sam_eta,
                            loss_reduction='mean', update='gradient')
    update = client_update.build_client_update(config, work, single_user=True)
    rng = np.random.default_rng(0)
    worst_abs = worst_rel = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for user in range(_USERS.value):
            items, labels, weights, local = _case(split, user, config, rng)
            state = client_update.ClientState(
                local_weights=local, adam_step=np.int32(0),
                adam_m=[np.zeros_like(w) for w in local], adam_v=[np.zeros_like(w) for w in local])
            ours = update.fn(weights, state, dict(items=items, labels=labels))['update']
            case = pathlib.Path(tmp) / 'case.npz'
            np.savez(case, items=items, labels=labels,
                     **{f'g{i}': w for i, w in enumerate(weights)},
                     u0=local[0], u1=local[1])
            meta = dict(rho=rho, eta=method.sam_eta, n=len(weights),
                        layers=len(config.mlp_layers))
            out = pathlib.Path(tmp) / 'theirs.npz'
            subprocess.run([_TORCH_PYTHON.value, '-c', _TORCH_SIDE, str(minimizers), str(case),
                            json.dumps(meta), str(out)], check=True)
            theirs = np.load(out)
            theirs = [theirs[f'arr_{i}'] for i in range(len(weights))]
            diff = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(ours, theirs))
            size = max(float(np.max(np.abs(b))) for b in theirs)
            worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / size)
            print(f'user {user} ({len(items)} examples): max |ours - authors\'| {diff:.3g} '
                  f'(largest gradient entry {size:.3g})', flush=True)
    print(f'FedASAM client step vs the authors\' ASAM over {_USERS.value} users: max abs '
          f'{worst_abs:.3g}, max relative {worst_rel:.3g}')
    return 0 if worst_rel <= _TOLERANCE.value else 1


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
