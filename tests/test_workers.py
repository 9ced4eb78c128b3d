"""Rounds split across TFF worker services equal the one-context round.

Starts real `worker_binary` services on local ports; every fixture that
starts one stops it in its teardown (SIGINT, then SIGKILL), so the run can
never hang on a leftover worker. Tiny synthetic data keeps this under a
minute on two cores.
"""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedrecgel.launch import workers as launcher
from tff_fedrecgel.algorithms import client_update
from tff_fedrecgel.data import preprocess
from tff_fedrecgel.data import synthetic
from tff_fedrecgel.models import neumf
from tff_fedrecgel.data import batching
from tff_fedrecgel.simulation import Simulation
from tff_fedrecgel.simulation import transport as workers_lib
from tff_fedrecgel.simulation.fedrecgel_adapter import FedRecGEL

REPO = pathlib.Path(__file__).resolve().parents[1]
WORK = client_update.ClientWorkConfig(rho_sh=0.05, rho_ns=0.1)
ROUNDS = 3
COHORT = 8
SEED = 2
ATOL = 1e-6


@pytest.fixture(scope='module')
def split():
    frame = synthetic.generate_synthetic(
        num_users=40, num_items=30, mean_interactions=12, seed=1)
    return preprocess.build_split(frame, num_negatives=10)


@pytest.fixture(scope='module')
def config(split):
    return neumf.ModelConfig(
        num_items=split.num_items, gmf_dim=4, mlp_dim=8, mlp_layers=(8, 4))


def _stop(state_file: pathlib.Path, workers: list[launcher.WorkerInfo]) -> None:
    """Stops the workers; SIGKILLs any still alive (the state file may be gone)."""
    try:
        launcher.stop_workers(state_file=state_file, timeout=5.0)
    finally:
        _kill_survivors(workers)


def _kill_survivors(workers: list[launcher.WorkerInfo]) -> None:
    for worker in workers:
        # Only a live worker_binary on its port: never a reused pid.
        if launcher._is_our_worker(worker.pid, worker.port):  # pylint: disable=protected-access
            _kill(worker)


def _start(num: int, state_file: pathlib.Path):
    return launcher.start_workers(num, state_file=state_file, ready_timeout=60.0)


@pytest.fixture(scope='module')
def two_workers(tmp_path_factory):
    """Two worker services for the module; always stopped afterwards."""
    state_file = tmp_path_factory.mktemp('workers') / 'state.json'
    workers = []
    try:
        workers = _start(2, state_file)
        yield [w.address for w in workers]
    finally:
        _stop(state_file, workers)


@pytest.fixture
def three_workers(tmp_path):
    """Three worker services that a test may kill; always stopped afterwards."""
    state_file = tmp_path / 'state.json'
    workers = []
    try:
        workers = _start(3, state_file)
        yield workers
    finally:
        _stop(state_file, workers)


MODES = {
    'per_user': (WORK, False),
    'vectorized': (WORK, True),
    'reconstruct': (client_update.ClientWorkConfig(
        rho_sh=0.05, rho_ns=0.1, local_state='reconstruct', reconstruction_steps=2), False),
}


def _algorithm(split, config, work, *, vectorized=False, **kwargs):
    return FedRecGEL(model_config=config, work=work, num_users=split.num_users, seed=SEED,
                     users_per_client=None if vectorized else 1, max_group_examples=200,
                     **kwargs)


def _simulation(split, config, *, mode='per_user', workers=None):
    work, vectorized = MODES[mode]
    simulation = Simulation(
        split=split, clients_per_round=COHORT, seed=SEED,
        algorithm=_algorithm(split, config, work, vectorized=vectorized, workers=workers))
    simulation.initialize()
    simulation.workers = simulation.algorithm.workers
    return simulation


def _snapshot(simulation, metrics):
    """Copies of the server state, every client state, and the metrics."""
    states = simulation.algorithm.client_states
    return collections.OrderedDict(
        server=_leaves(simulation.algorithm.server_state._asdict()),
        clients=_leaves(states.state._asdict() if states else []),
        metrics={k: v for k, v in metrics.items() if 'seconds' not in k},
    )


_REFERENCES = {}


def _reference(split, config, mode):
    """Snapshots after each of ROUNDS rounds in the local TFF context."""
    if mode not in _REFERENCES:
        simulation = _simulation(split, config, mode=mode)
        _REFERENCES[mode] = [
            _snapshot(simulation, simulation.run_round()) for _ in range(ROUNDS)]
    return _REFERENCES[mode]


def _assert_same(actual, expected):
    """Server state, every client state and the metrics agree to 1e-6."""
    for part in ('server', 'clients'):
        a_leaves, e_leaves = actual[part], expected[part]
        assert [p for p, _ in a_leaves] == [p for p, _ in e_leaves]
        for (path, a), (_, e) in zip(a_leaves, e_leaves):
            np.testing.assert_allclose(a, e, rtol=0, atol=ATOL, err_msg=f'{part}{path}')
    assert actual['metrics'].keys() == expected['metrics'].keys()
    for key, value in expected['metrics'].items():
        assert actual['metrics'][key] == pytest.approx(value, abs=ATOL), key


def _leaves(structure, path=''):
    if isinstance(structure, dict):
        return [leaf for k, v in structure.items() for leaf in _leaves(v, f'{path}/{k}')]
    if isinstance(structure, (list, tuple)):
        return [leaf for i, v in enumerate(structure) for leaf in _leaves(v, f'{path}/{i}')]
    return [(path, np.array(structure))]  # A copy.


@pytest.mark.parametrize('mode', list(MODES))
def test_two_workers_equal_one_local_context(split, config, two_workers, mode):
    """Three rounds on 2 workers: same server state, client states, metrics."""
    reference = _reference(split, config, mode)
    simulation = _simulation(split, config, mode=mode, workers=two_workers)
    for expected in reference:
        _assert_same(_snapshot(simulation, simulation.run_round()), expected)
    # Both workers did work every round (no silent fallback to one).
    assert set(simulation.workers.shards_done) == set(two_workers)
    assert all(n >= ROUNDS for n in simulation.workers.shards_done.values())
    assert simulation.workers.failures == []


def test_dead_workers_are_reported_and_the_round_retried(
        split, config, three_workers, monkeypatch, capsys):
    """A worker killed before a round, another killed mid-round: same results.

    When the last worker is gone too, the round raises and nothing changes.
    """
    reference = _reference(split, config, 'per_user')
    addresses = [w.address for w in three_workers]
    simulation = _simulation(split, config, workers=addresses)
    _assert_same(_snapshot(simulation, simulation.run_round()), reference[0])

    # Round 2: worker 0 died between rounds.
    _kill(three_workers[0])
    _assert_same(_snapshot(simulation, simulation.run_round()), reference[1])
    err = capsys.readouterr().err
    assert f'worker {addresses[0]} failed in round 2' in err
    assert simulation.workers.live_workers == addresses[1:]

    # Round 3: worker 1 dies mid-round, after its shard's values were sent
    # and before the result is fetched.
    original = workers_lib._FailFastStub.compute

    def compute_then_die(stub, request):
        if stub.address == addresses[1]:
            _kill(three_workers[1])
        return original(stub, request)

    monkeypatch.setattr(workers_lib._FailFastStub, 'compute', compute_then_die)
    _assert_same(_snapshot(simulation, simulation.run_round()), reference[2])
    err = capsys.readouterr().err
    failure_lines = [line for line in err.splitlines() if 'failed in round 3' in line]
    assert len(failure_lines) == 1 and addresses[1] in failure_lines[0]
    assert 'retrying' in err
    assert simulation.workers.live_workers == addresses[2:]

    # Round 4: the last worker is gone; nothing of the round is applied.
    before = _snapshot(simulation, reference[2]['metrics'])
    _kill(three_workers[2])
    with pytest.raises(workers_lib.WorkerError, match='nothing of the round was applied'):
        simulation.run_round()
    assert simulation.round_num == ROUNDS
    _assert_same(_snapshot(simulation, reference[2]['metrics']), before)
    assert [f.address for f in simulation.workers.failures] == addresses


def _kill(worker: launcher.WorkerInfo) -> None:
    os.kill(worker.pid, signal.SIGKILL)
    try:
        os.waitpid(worker.pid, 0)
    except ChildProcessError:
        # Not our child (started by the script): wait until it is gone.
        while launcher._is_our_worker(worker.pid, worker.port):  # pylint: disable=protected-access
            time.sleep(0.02)


def test_unreachable_worker_and_bad_addresses_fail_fast():
    """A wrong address is a clear error at start, not a hang."""
    (port,) = launcher._free_ports(1)  # pylint: disable=protected-access
    start = time.monotonic()
    with pytest.raises(workers_lib.WorkerError, match=f'localhost:{port} does not answer'):
        workers_lib.connect_worker(f'localhost:{port}', connect_timeout=1.0)
    assert time.monotonic() - start < 10
    for bad in ('', 'localhost', 'localhost:0', 'a:1,a:1', ':80'):
        with pytest.raises(ValueError):
            workers_lib.parse_worker_addresses(bad)
    assert workers_lib.parse_worker_addresses('h1:1, h2:2') == ['h1:1', 'h2:2']


def test_custom_aggregator_is_refused_with_workers(split, config):
    with pytest.raises(ValueError, match='not supported with --workers'):
        _algorithm(split, config, WORK, model_aggregator=tff.aggregators.MeanFactory(),
                   workers=['localhost:1'])


def test_shards_are_balanced_and_cover_every_client():
    shards = batching.split_into_shards([5, 1, 1, 3, 2, 2], 2)
    assert sorted(i for s in shards for i in s) == list(range(6))
    assert [sum([5, 1, 1, 3, 2, 2][i] for i in s) for s in shards] == [7, 7]
    assert batching.split_into_shards([4.0], 3) == [[0]]


def test_start_workers_script_starts_and_stops(tmp_path):
    """start_workers.sh N prints host:port,...; the ports answer; stop ends all."""
    state_file = tmp_path / 'state.json'
    env = dict(os.environ, FEDRECGEL_WORKERS_STATE=str(state_file), PYTHON=sys.executable)
    script = str(REPO / 'launch' / 'start_workers.sh')
    recorded = []
    try:
        started = subprocess.run(
            [script, '2'], env=env, capture_output=True, text=True, timeout=90,
            stdin=subprocess.DEVNULL)
        assert started.returncode == 0, started.stderr
        recorded = launcher.read_state(state_file)
        pids = [w.pid for w in recorded]
        addresses = started.stdout.strip().splitlines()[-1].split(',')
        assert len(addresses) == 2 and len(pids) == 2
        for address in addresses:
            host, port = address.rsplit(':', 1)
            assert launcher.port_answers(host, int(port))
        again = subprocess.run(
            [script, '1'], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and 'still running' in again.stderr

        stopped = subprocess.run(
            [script, 'stop'], env=env, capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert 'stopped 2 TFF workers' in stopped.stderr
        for pid, address in zip(pids, addresses):
            port = int(address.rsplit(':', 1)[1])
            assert not launcher._is_our_worker(pid, port)  # pylint: disable=protected-access
            assert not launcher.port_answers('localhost', port)
        assert not state_file.exists()
    finally:
        _kill_survivors(recorded)
