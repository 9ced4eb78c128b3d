"""Every peer method through the API: trained with checkpoints, loaded back
from its run folder, and evaluated to the same figures."""

import numpy as np
import pytest

from tff_fedrecgel import api

PEERS = ['pfedrec', 'fedrap', 'gpfedrec', 'fedlesam', 'fedgloss']


@pytest.mark.parametrize('algorithm', PEERS)
def test_a_peer_trains_checkpoints_and_loads_back(algorithm, tmp_path):
    with api.Session():
        experiment = api.experiment('synthetic', run_dir=tmp_path / algorithm,
                                    data_options={'num_users': 40}, algorithm=algorithm,
                                    total_rounds=2, rounds_per_checkpoint=1,
                                    client_fraction=1.0, eval_protocol='both')
        summary = experiment.train()
        assert summary['rounds'] == 2 and np.isfinite(summary['final']['hr@10'])
        loaded = api.load_run(experiment.paths.root)
        assert loaded.round_num == 2
        assert loaded.evaluate() == pytest.approx(summary['final'])
        assert api.load_run(experiment.paths.root, round_num=1).round_num == 1
