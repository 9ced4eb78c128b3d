"""The authors' side of the GPFedRec oracle check (run by launch/oracle_gpfedrec.py).

Runs GPFedRec's published PyTorch code (Zhangcx19/GPFedRec, given by its
folder, never copied here) on a case written by `oracle_gpfedrec.py`: the
same initial weights, every user of the case each round (their code's
`clients_sample_ratio=1`) and the same minibatches in the same order. Needs
numpy, torch and scikit-learn (a separate environment):

    /tmp/torch_venv/bin/python launch/oracle_gpfedrec_authors.py CODE_DIR CASE.npz OUT.npz

Writes OUT.npz: per round r, `r{r}_global` (the server's global table), and
per user u `r{r}_u{u}_target` (the server's table for it) and `_table`,
`_user`, `_mlp` (its client model after the round; the MLP flattened).
"""

import copy
import sys
import types

import numpy as np
import torch

from _oracle_torch import EpochLoader  # pylint: disable=g-import-not-at-top


class _NoNoise:
    """Their Laplace noise at scale 0 (torch refuses a zero scale)."""

    def __init__(self, *_):
        pass

    def expand(self, shape):
        self.shape = shape
        return self

    def sample(self):
        return torch.zeros(self.shape)


def _flat_mlp(params, layers):
    parts = []
    for i in range(layers):
        parts += [params[f'fc_layers.{i}.weight'].numpy().T.ravel(),
                  params[f'fc_layers.{i}.bias'].numpy()]
    parts += [params['affine_output.weight'].numpy().ravel(),
              params['affine_output.bias'].numpy()]
    return np.concatenate(parts)


def main(code_dir: str, case_path: str, out_path: str) -> None:
    sys.path.insert(0, code_dir)
    sys.modules.setdefault('tensorboardX', types.SimpleNamespace(SummaryWriter=None))
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # Their code moves to GPU.
    import data as their_data  # pylint: disable=import-outside-toplevel
    import engine as their_engine  # pylint: disable=import-outside-toplevel
    import mlp as their_mlp  # pylint: disable=import-outside-toplevel

    case = np.load(case_path)
    num_users, num_items = int(case['num_users']), int(case['num_items'])
    epochs, batch_size = int(case['local_epochs']), int(case['batch_size'])
    layers = [int(x) for x in case['layers']]
    config = {'num_users': num_users, 'num_items': num_items,
              'latent_dim': int(case['latent_dim']), 'layers': layers,
              'lr': float(case['lr']), 'lr_eta': float(case['lr_eta']),
              'reg': float(case['reg']), 'batch_size': batch_size, 'local_epoch': epochs,
              'neighborhood_size': 0, 'neighborhood_threshold': float(case['threshold']),
              'mp_layers': int(case['mp_layers']), 'similarity_metric': 'cosine',
              'dp': 0.0, 'use_cuda': False, 'clients_sample_ratio': 1.0,
              'clients_sample_num': 0, 'l2_regularization': 0.0}
    their_engine.Laplace = _NoNoise
    engine = their_mlp.MLPEngine(config)
    weights = {'embedding_user.weight': torch.tensor(case['user0'][None, :]),
               'embedding_item.weight': torch.tensor(case['table0']),
               'affine_output.weight': torch.tensor(case['w_out0'][None, :]),
               'affine_output.bias': torch.tensor([float(case['b_out0'])])}
    for i in range(len(layers) - 1):
        weights[f'fc_layers.{i}.weight'] = torch.tensor(case[f'w{i}0'].T.copy())
        weights[f'fc_layers.{i}.bias'] = torch.tensor(case[f'b{i}0'])
    engine.model.load_state_dict(weights)
    out = {}
    users = list(range(num_users))
    for r in range(int(case['rounds'])):
        loaders = {u: EpochLoader(their_data.UserItemRatingDataset, case[f'r{r}_u{u}_items'],
                                   case[f'r{r}_u{u}_labels'],
                                   case[f'r{r}_u{u}_order'].reshape(epochs, -1), batch_size)
                   for u in users}
        users_iter = iter(users)
        engine.instance_user_train_loader = lambda _data: loaders[next(users_iter)]
        their_engine.random.sample = lambda _pool, _n: list(users)
        train = [[[] for _ in range(num_users)] for _ in range(3)]
        engine.fed_train_a_round(train, round_id=r)
        server = engine.server_model_param['embedding_item.weight']
        out[f'r{r}_global'] = server['global'].numpy()
        for u in users:
            params = copy.deepcopy(engine.client_model_params[u])
            out[f'r{r}_u{u}_target'] = server[u].numpy()
            out[f'r{r}_u{u}_table'] = params['embedding_item.weight'].numpy()
            out[f'r{r}_u{u}_user'] = params['embedding_user.weight'].numpy()[0]
            out[f'r{r}_u{u}_mlp'] = _flat_mlp(params, len(layers) - 1)
    np.savez(out_path, **out)


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
