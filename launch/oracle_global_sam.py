r"""Checks FedLESAM's and FedGloSS's rounds against their authors' code, run as an oracle.

The authors' code is not part of this project: give a checkout of it
(MediaBrain-SJTU/FedLESAM for fedlesam, the `codebase` folder of
debcaldarola/fedgloss for fedgloss) and a Python that has PyTorch::

    python launch/oracle_global_sam.py --method=fedlesam --authors_code=/tmp/fedlesam \
        --torch_python=/tmp/torch_venv/bin/python \
        --data_dir=/path/to/datasets/filmtrust --users=4 --rounds=3
    python launch/oracle_global_sam.py --method=fedgloss \
        --authors_code=/tmp/fedgloss/codebase ...

The first --users users of the FilmTrust split (each: its training items
labelled 1, as many unseen items labelled 0, in chunks of --chunk_size, the
minibatches both sides step through in the same order) and the same NeuMF
weights go to both sides, for --rounds rounds:

* here, the TFF round of the method (one user per TFF client, SGD at
  --client_lr on the global part, the server optimizer plain SGD at rate 1 as
  both authors' commands use; the user embeddings kept fixed by a local rate
  of 1e-30, since the authors' models have none);
* there, fedlesam: the authors' client class `client.fedlesam` (their LESAM
  optimizer inside) for each user, and their server's `global_update`
  (`server.FedLESAM`) for the new weights and the global update it sends;
  fedgloss: their `FedGloSSServer` (`servers/fedgloss_server.py`) driven in
  the order of its `train_model` (ascent step, clients, pseudo-gradients,
  `update_model`), the clients plain SGD, its ADMM duals kept at 0 (an
  infinite client count) and no rho schedule.

Their weight decay is 0 here and their gradient clipping (norm 10) is left
on but never reached by these gradients. It prints each round's largest
absolute difference of the global weights, and for contrast the difference
of FedSAM (fedlesam; and of FedLESAM normalized by the global norm, as the
paper writes it) or of FedAvg (fedgloss) to the authors' result; it exits 1
when the method's difference exceeds --tolerance.
"""

from __future__ import annotations

import dataclasses
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

_METHOD = flags.DEFINE_enum('method', None, ['fedlesam', 'fedgloss'], 'The method to check.')
_AUTHORS = flags.DEFINE_string('authors_code', None, "The authors' code (see above).")
_TORCH_PYTHON = flags.DEFINE_string('torch_python', None, 'A Python with PyTorch.')
_DATA_DIR = flags.DEFINE_string('data_dir', None, 'The FilmTrust folder.')
_USERS = flags.DEFINE_integer('users', 4, 'Users (TFF clients) per round.', lower_bound=1)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds.', lower_bound=1)
_CHUNK = flags.DEFINE_integer('chunk_size', 32, 'Examples per minibatch.', lower_bound=1)
_EPOCHS = flags.DEFINE_integer('local_epochs', 2, 'Local epochs.', lower_bound=1)
_CLIENT_LR = flags.DEFINE_float('client_lr', 0.1, 'Local SGD rate.', lower_bound=0.0)
_TOLERANCE = flags.DEFINE_float('tolerance', 1e-5, 'Largest absolute difference.')

# What each side needs to find in --authors_code.
_AUTHORS_FILES = {'fedlesam': ('optimizer/LESAM.py', 'client/fedlesam.py', 'server/FedLESAM.py'),
                  'fedgloss': ('servers/fedgloss_server.py', 'servers/fedopt_server.py')}

# The torch side. The NeuMF is this project's model in PyTorch (its user
# embedding fixed and outside its parameters: the authors' models have no
# per-user part).
_TORCH_SIDE = r'''
import copy, json, sys, types
import numpy as np, torch
authors, case_path, meta, out_path = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
sys.path.insert(0, authors)
case = np.load(case_path)
n, layers = meta['n'], meta['layers']

class NeuMF(torch.nn.Module):
    def __init__(self, user=None):
        super().__init__()
        self.item_gmf = torch.nn.Embedding(*case['g0'].shape)
        self.item_mlp = torch.nn.Embedding(*case['g1'].shape)
        self.tower = torch.nn.ModuleList(
            torch.nn.Linear(*case[f'g{2 + 2 * i}'].shape) for i in range(layers))
        self.out = torch.nn.Linear(*case[f'g{n - 2}'].shape)
        self.device = 'cpu'
        u = 0 if user is None else user
        # Plain attributes, outside the state dict the servers average.
        self.user_gmf = torch.tensor(case[f'u{u}_0'])
        self.user_mlp = torch.tensor(case[f'u{u}_1'])

    def load(self, weights):
        with torch.no_grad():
            self.item_gmf.weight.copy_(torch.tensor(weights[0]))
            self.item_mlp.weight.copy_(torch.tensor(weights[1]))
            for i, layer in enumerate(self.tower):  # Keras kernels are [in, out].
                layer.weight.copy_(torch.tensor(weights[2 + 2 * i]).T)
                layer.bias.copy_(torch.tensor(weights[3 + 2 * i]))
            self.out.weight.copy_(torch.tensor(weights[n - 2]).T)
            self.out.bias.copy_(torch.tensor(weights[n - 1]))
        return self

    def weights(self):
        out = [self.item_gmf.weight, self.item_mlp.weight]
        for layer in self.tower:
            out += [layer.weight.T, layer.bias]
        out += [self.out.weight.T, self.out.bias]
        return [w.detach().numpy().copy() for w in out]

    def logit(self, items):
        gmf = self.user_gmf * self.item_gmf(items)
        h = torch.cat([self.user_mlp.expand(len(items), -1), self.item_mlp(items)], 1)
        for layer in self.tower:
            h = torch.relu(layer(h))
        return self.out(torch.cat([gmf, h], 1))[:, 0]

    def forward(self, items):
        # Cross-entropy over (0, z) is the binary cross-entropy of logit z.
        z = self.logit(items)
        return torch.stack([torch.zeros_like(z), z], 1)

def chunks(u):
    items, labels = torch.tensor(case[f'items{u}']).long(), torch.tensor(case[f'labels{u}'])
    c = meta['chunk']
    return [(items[s:s + c], labels[s:s + c]) for s in range(0, len(items), c)]

weights = [case[f'g{i}'] for i in range(n)]
rounds = []
if meta['method'] == 'fedlesam':
    # Their image data and progress bar modules are imported, not used here.
    import importlib.machinery
    from unittest import mock
    for name in ('torchvision', 'torchvision.transforms', 'torchvision.datasets', 'PIL',
                 'tqdm'):
        stub = types.ModuleType(name)
        stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
        stub.__getattr__ = lambda attr: mock.MagicMock()
        sys.modules.setdefault(name, stub)
    # Their server package's __init__ imports modules it does not ship: the
    # package is registered without running it.
    package = types.ModuleType('server')
    package.__path__ = [authors + '/server']
    sys.modules['server'] = package
    import utils
    from client.fedlesam import fedlesam
    from server.FedLESAM import FedLESAM

    class Tensors(list):  # Their client calls .to() on what it receives.
        def to(self, device):
            return self

    args = types.SimpleNamespace(weight_decay=0.0, rho=meta['rho'], local_epochs=meta['epochs'],
                                 global_learning_rate=1.0)
    params = utils.get_mdl_params(NeuMF().load(weights))
    shapes = [p.shape for p in NeuMF().parameters()]
    global_update = None
    for r in range(meta['rounds']):
        updates = []
        for u in range(meta['users']):
            client = fedlesam(device='cpu', model_func=lambda u=u: NeuMF(u),
                              received_vecs={'Params_list': params, 'global_update': global_update},
                              dataset=chunks(u), lr=meta['client_lr'], args=args)
            updates.append(client.train()['local_update_list'])
        server = types.SimpleNamespace(server_model_params_list=params, args=args, comm_vecs={})
        params = FedLESAM.global_update(server, None, torch.mean(torch.stack(updates), 0), None)
        # One direction tensor per parameter, in the parameters' order.
        flat, global_update, start = server.comm_vecs['global_update'], Tensors(), 0
        for shape in shapes:
            size = int(np.prod(shape))
            global_update.append(flat[start:start + size].reshape(shape))
            start += size
        model = NeuMF()
        utils.set_client_from_params('cpu', model, params)
        rounds.append(model.weights())
else:
    from servers.fedgloss_server import FedGloSSServer
    global_model = NeuMF().load(weights)
    server = FedGloSSServer(global_model, 'sgd', 1.0, meta['rho'], 0.0, 0.001, 0, meta['rounds'],
                            1.0, float('inf'))
    for r in range(meta['rounds']):
        if server.delta_w_tilde is not None:
            server.ascent_step()
        server.server_opt.zero_grad()
        for u in range(meta['users']):
            local = NeuMF(u)
            local.load_state_dict(server.model)
            sgd = torch.optim.SGD(local.parameters(), lr=meta['client_lr'])
            data = chunks(u)
            for _ in range(meta['epochs']):
                for items, labels in data:
                    sgd.zero_grad()
                    torch.nn.functional.binary_cross_entropy_with_logits(
                        local.logit(items), labels).backward()
                    sgd.step()
            server.updates.append((len(case[f'items{u}']), copy.deepcopy(local.state_dict())))
        server._save_updates_as_pseudogradients()
        server.update_model()
        model = NeuMF()
        model.load_state_dict(server.model)
        rounds.append(model.weights())
np.savez(out_path, *[w for ws in rounds for w in ws])
'''


def _case(split, users, config, rng):
    """The users' batches, their embeddings and the initial weights."""
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top

    case = {}
    for user in range(users):
        positives = np.unique(split.train_items[split.train_users == user])
        unseen = np.setdiff1d(np.arange(split.num_items), positives)
        negatives = rng.choice(unseen, size=len(positives), replace=False)
        order = rng.permutation(2 * len(positives))
        case[f'items{user}'] = np.concatenate([positives, negatives]).astype(np.int32)[order]
        case[f'labels{user}'] = np.concatenate(
            [np.ones(len(positives)), np.zeros(len(negatives))]).astype(np.float32)[order]
        for i, d in enumerate(config.local_dims):
            case[f'u{user}_{i}'] = rng.normal(scale=0.1, size=(1, d)).astype(np.float32)
    model = neumf.NeuMF(config, seed=0)
    weights = [(v.numpy() + rng.normal(scale=0.05, size=v.shape)).astype(np.float32)
               for v in model.global_variables]
    case.update({f'g{i}': w for i, w in enumerate(weights)})
    return case, weights


def _ours(case, weights, config, work, users, rounds):
    """The project's round, `rounds` times: the global weights after each."""
    from tff_fedrecgel.algorithms import client_update  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import fedrecgel  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import global_perturbation  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top

    pieces = fedrecgel.build_round_pieces(
        model_config=config,
        # A TFF client is a group of one user, as the simulation's per-user mode.
        client_update=global_perturbation.build_client_update(config, work),
        server_optimizer=fedrecgel.build_server_optimizer(1.0, 'sgd'),
        global_perturbation=global_perturbation.build_global_perturbation(
            work, neumf.global_weight_specs(config)))
    state = pieces.process.initialize()._replace(global_weights=weights)
    states = []
    for user in range(users):
        local = [case[f'u{user}_{i}'] for i in range(len(config.local_dims))]
        states.append(client_update.ClientState(
            local_weights=local, adam_step=np.zeros([1], np.int32),
            adam_m=[np.zeros_like(w) for w in local], adam_v=[np.zeros_like(w) for w in local]))
    data = [dict(items=case[f'items{u}'][np.newaxis], labels=case[f'labels{u}'][np.newaxis],
                 lengths=np.array([len(case[f'items{u}'])], np.int32)) for u in range(users)]
    out = []
    for _ in range(rounds):
        state, states, _ = pieces.process.next(state, states, data)
        out.append([np.asarray(w) for w in state.global_weights])
    return out


def _max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - y))) for x, y in zip(a, b))


def main(argv):
    del argv
    for name, value in (('method', _METHOD.value), ('authors_code', _AUTHORS.value),
                        ('torch_python', _TORCH_PYTHON.value), ('data_dir', _DATA_DIR.value)):
        if not value:
            raise ValueError(f'--{name} is required')
    method = _METHOD.value
    missing = [f for f in _AUTHORS_FILES[method]
               if not (pathlib.Path(_AUTHORS.value) / f).is_file()]
    if missing:
        raise ValueError(f'--authors_code={_AUTHORS.value} has no {", ".join(missing)}')
    from tff_fedrecgel import methods  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel import tasks  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithm_config import ClientWorkConfig  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.algorithms import global_perturbation  # pylint: disable=g-import-not-at-top
    from tff_fedrecgel.models import neumf  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    _entry.tff_runtime()
    spec = methods.get_method(method)
    rho = spec.default_radii[0]
    split = tasks.get_task('filmtrust').load_split(data_dir=_DATA_DIR.value, validation=False)
    config = neumf.ModelConfig(num_items=split.num_items)
    if _USERS.value > split.num_users:
        raise ValueError(f'--users={_USERS.value} exceeds the {split.num_users} users')
    case, weights = _case(split, _USERS.value, config, np.random.default_rng(0))
    # A local rate of 1e-30 leaves the embeddings' float32 values unchanged.
    work = ClientWorkConfig(
        rho_sh=rho, rho_ns=0.0, local_lr=1e-30, update='model_delta', chunk_size=_CHUNK.value,
        local_epochs=_EPOCHS.value, client_lr=_CLIENT_LR.value,
        client_weighting='uniform' if method == 'fedlesam' else 'num_examples',
        global_perturbation=spec.global_perturbation)
    meta = dict(method=method, rho=rho, n=len(weights), layers=len(config.mlp_layers),
                users=_USERS.value, rounds=_ROUNDS.value, chunk=_CHUNK.value,
                epochs=_EPOCHS.value, client_lr=_CLIENT_LR.value)
    with tempfile.TemporaryDirectory() as tmp:
        case_path, out = pathlib.Path(tmp) / 'case.npz', pathlib.Path(tmp) / 'theirs.npz'
        np.savez(case_path, **case)
        torch_side = subprocess.run(
            [_TORCH_PYTHON.value, '-c', _TORCH_SIDE, _AUTHORS.value, str(case_path),
             json.dumps(meta), str(out)], stderr=subprocess.PIPE, text=True, check=False)
        if torch_side.returncode:
            sys.stderr.write(torch_side.stderr)
            last = (torch_side.stderr.strip().splitlines() or ['no output'])[-1]
            raise ValueError(f'the torch side failed: {last}')
        flat = np.load(out)
        flat = [flat[f'arr_{i}'] for i in range(len(flat.files))]
    theirs = [flat[r * len(weights):(r + 1) * len(weights)] for r in range(_ROUNDS.value)]
    ours = _ours(case, weights, config, work, _USERS.value, _ROUNDS.value)
    contrasts = {}
    if method == 'fedlesam':
        contrasts['FedSAM (local SAM)'] = _ours(
            case, weights, config, dataclasses.replace(work, global_perturbation='local'),
            _USERS.value, _ROUNDS.value)
        # The paper's normalization: the global norm instead of the sum of norms.
        saved = global_perturbation.sum_of_norms
        global_perturbation.sum_of_norms = lambda tensors: tf.linalg.global_norm(list(tensors))
        try:
            contrasts['FedLESAM, global norm'] = _ours(case, weights, config, work,
                                                      _USERS.value, _ROUNDS.value)
        finally:
            global_perturbation.sum_of_norms = saved
    else:
        contrasts['FedAvg (rho 0)'] = _ours(
            case, weights, config, dataclasses.replace(work, rho_sh=0.0),
            _USERS.value, _ROUNDS.value)
    worst = 0.0
    for r in range(_ROUNDS.value):
        diff = _max_diff(ours[r], theirs[r])
        moved = _max_diff(theirs[r], weights)
        worst = max(worst, diff)
        others = ', '.join(f'{name} {_max_diff(c[r], theirs[r]):.3g}'
                           for name, c in contrasts.items())
        print(f'round {r + 1}: max |ours - authors\'| {diff:.3g} (largest weight change '
              f'{moved:.3g}); for contrast: {others}', flush=True)
    print(f'{spec.label} over {_ROUNDS.value} rounds of {_USERS.value} users: max abs {worst:.3g}')
    return 0 if worst <= _TOLERANCE.value else 1


if __name__ == '__main__':
    _entry.register_tff_shutdown()
    _entry.run_main(main)
