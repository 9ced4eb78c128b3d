"""The authors' side of the FedRAP oracle check (run by launch/oracle_fedrap.py).

Runs FedRAP's published PyTorch code (mtics/FedRAP, given by its folder,
never copied here) on a case written by `oracle_fedrap.py`: the same initial
weights, the same users each round and the same minibatches in the same
order. Needs only numpy, pandas and torch (a separate environment):

    /tmp/torch_venv/bin/python launch/oracle_fedrap_authors.py CODE_DIR CASE.npz OUT.npz

Writes OUT.npz: per round r, `r{r}_table` (the server's C) and per user u
`r{r}_u{u}_w`, `_b`, `_personal` (its D_u after the round).
"""

import math
import sys
import types

import numpy as np
import torch

from _oracle_torch import EpochLoader  # pylint: disable=g-import-not-at-top


def main(code_dir: str, case_path: str, out_path: str) -> None:
    sys.path.insert(0, code_dir)
    sys.modules.setdefault('coloredlogs', types.SimpleNamespace(install=lambda: None))
    from model import engine as their_engine  # pylint: disable=import-outside-toplevel
    from model import model as their_model  # pylint: disable=import-outside-toplevel
    from utils import data as their_data  # pylint: disable=import-outside-toplevel

    case = np.load(case_path)
    num_users, num_items = int(case['num_users']), int(case['num_items'])
    epochs, batch_size = int(case['local_epochs']), int(case['batch_size'])
    curriculum = str(case['curriculum'])
    lam, mu = float(case['lam']), float(case['mu'])
    config = {'alias': 'FedRAP', 'num_users': num_users, 'num_items': num_items,
              'latent_dim': int(case['latent_dim']), 'top_k': 10,
              'lr_network': float(case['score_lr']), 'lr_args': float(case['item_lr']),
              'l2_regularization': float(case['weight_decay']),
              'decay_rate': float(case['round_decay']), 'batch_size': batch_size,
              'local_epoch': epochs, 'tol': float(case['tol']), 'lambda': lam, 'mu': mu,
              'regular': 'l1', 'vary_param': curriculum, 'use_cuda': False,
              'clients_sample_ratio': 1.0}
    engine = their_model.FedRAPEngine(config)
    engine.model.item_personality.weight.data = torch.tensor(case['d0'])
    engine.model.affine_output.weight.data = torch.tensor(case['w0'][None, :])
    engine.model.affine_output.bias.data = torch.tensor([float(case['b0'])])
    commonality = torch.nn.Embedding(num_items, int(case['latent_dim']))
    commonality.weight.data = torch.tensor(case['c0'])
    out = {}
    for r in range(int(case['rounds'])):
        if curriculum == 'tanh':
            # Their loss reads config['lambda'] and config['mu'], never the
            # engine's curriculum values: feed those in for this mode.
            config['lambda'], config['mu'] = engine.lam, engine.mu
        users = [int(u) for u in case[f'r{r}_users']]
        loaders = {u: EpochLoader(their_data.UserItemRatingDataset, case[f'r{r}_u{u}_items'],
                                   case[f'r{r}_u{u}_labels'],
                                   case[f'r{r}_u{u}_order'].reshape(epochs, -1), batch_size)
                   for u in users}
        users_iter = iter(users)
        engine.instanceUserTrainLoader = lambda _data: loaders[next(users_iter)]
        their_engine.random.sample = lambda _pool, _n: list(users)
        train = [[[] for _ in range(num_users)] for _ in range(3)]
        engine.federatedTrainOneRound(train, commonality, r)
        if curriculum == 'tanh':
            engine.lam, engine.mu = math.tanh(r / 10) * lam, math.tanh(r / 10) * mu
        out[f'r{r}_table'] = engine.server_model_param['item_commonality.weight'].numpy()
        for u in users:
            params = engine.client_model_params[u]
            out[f'r{r}_u{u}_w'] = params['affine_output.weight'].numpy()[0]
            out[f'r{r}_u{u}_b'] = params['affine_output.bias'].numpy()[0]
            out[f'r{r}_u{u}_personal'] = params['item_personality.weight'].numpy()
    np.savez(out_path, **out)


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
