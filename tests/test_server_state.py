"""The FedRecGEL server state as checkpoints store it."""

from tff_fedrecgel.algorithms import fedrecgel


def test_checkpoints_hold_the_server_state_as_every_version_did():
    """The distributor's and the client work's states are empty and not
    stored: a checkpoint holds the four fields checkpoints always held, under
    the same type name, so a run saved before the round was composed of
    processes resumes (`tf.nest` matches named tuples by name and fields)."""
    state = fedrecgel.ServerState('weights', 'optimizer', 'aggregator', 7)
    stored = state.stored()
    assert type(stored).__name__ == 'ServerState'
    assert stored._fields == ('global_weights', 'optimizer_state', 'aggregator_state',
                              'round_num')
    assert fedrecgel.ServerState(*stored) == state
