"""The authors' side of the PFedRec oracle check (run by launch/oracle_pfedrec.py).

Runs PFedRec's published PyTorch code (Zhangcx19/IJCAI-23-PFedRec, given by
its folder, never copied here) on a case written by `oracle_pfedrec.py`: the
same initial weights, the same users each round and the same minibatches in
the same order. Needs only numpy and torch (a separate environment):

    /tmp/torch_venv/bin/python launch/oracle_pfedrec_authors.py CODE_DIR CASE.npz OUT.npz

Writes OUT.npz: per round r, `r{r}_table` (the server's item table) and per
user u `r{r}_u{u}_w`, `_b`, `_table` (its client model after the round).
"""

import copy
import sys
import types

import numpy as np
import torch

from _oracle_torch import EpochLoader  # pylint: disable=g-import-not-at-top


def main(code_dir: str, case_path: str, out_path: str) -> None:
    sys.path.insert(0, code_dir)
    sys.modules.setdefault('tensorboardX', types.SimpleNamespace(SummaryWriter=None))
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # Their round 2 moves to GPU.
    import data as their_data  # pylint: disable=import-outside-toplevel
    import engine as their_engine  # pylint: disable=import-outside-toplevel
    import mlp as their_mlp  # pylint: disable=import-outside-toplevel

    case = np.load(case_path)
    num_users, num_items = int(case['num_users']), int(case['num_items'])
    epochs, batch_size = int(case['local_epochs']), int(case['batch_size'])
    config = {'num_users': num_users, 'num_items': num_items,
              'latent_dim': int(case['latent_dim']), 'lr': float(case['score_lr']),
              'lr_eta': float(case['item_lr_eta']), 'batch_size': batch_size,
              'local_epoch': epochs, 'l2_regularization': 0.0, 'use_cuda': False,
              'clients_sample_ratio': 1.0, 'clients_sample_num': 0}
    engine = their_mlp.MLPEngine(config)
    engine.model.load_state_dict({
        'embedding_item.weight': torch.tensor(case['table0']),
        'affine_output.weight': torch.tensor(case['w0'][None, :]),
        'affine_output.bias': torch.tensor([float(case['b0'])])})
    out = {}
    for r in range(int(case['rounds'])):
        users = [int(u) for u in case[f'r{r}_users']]
        loaders = {u: EpochLoader(their_data.UserItemRatingDataset, case[f'r{r}_u{u}_items'],
                                   case[f'r{r}_u{u}_labels'],
                                   case[f'r{r}_u{u}_order'].reshape(epochs, -1), batch_size)
                   for u in users}
        users_iter = iter(users)
        engine.instance_user_train_loader = lambda _data: loaders[next(users_iter)]
        their_engine.random.sample = lambda _pool, _n: list(users)
        train = [[[] for _ in range(num_users)] for _ in range(3)]
        engine.fed_train_a_round(train, round_id=r)
        out[f'r{r}_table'] = engine.server_model_param['embedding_item.weight'].numpy()
        for u in users:
            params = copy.deepcopy(engine.client_model_params[u])
            out[f'r{r}_u{u}_w'] = params['affine_output.weight'].numpy()[0]
            out[f'r{r}_u{u}_b'] = params['affine_output.bias'].numpy()[0]
            out[f'r{r}_u{u}_table'] = params['embedding_item.weight'].numpy()
    np.savez(out_path, **out)


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
