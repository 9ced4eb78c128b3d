"""Saved and restored state does not stay in memory twice (FedRAP's
per-user rows reach GiBs on Amazon-Video: docs/PERFORMANCE.md)."""

import asyncio
import collections
import contextlib
import gc

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_fedrecgel.program.outputs import run_state_io
from tff_fedrecgel.simulation import own_model

SHAPE = (37, 11)  # A shape no other variable of the session has.


@contextlib.contextmanager
def _no_automatic_collection():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _live_variables() -> int:
    return sum(1 for o in gc.get_objects()
               if isinstance(o, tf.Variable) and tuple(o.shape) == SHAPE)


def test_user_rows_restore_copies_out_of_the_loaded_array():
    rows = own_model.UserRows(3, 4)
    rows.keep(0, [2, 5], np.ones((2, 4)))
    rows.keep(2, [1], np.full((1, 4), 3.0))
    indptr, items, values = rows.csr(range(3))
    assert values.dtype == np.float32 and items.dtype == np.int32
    again = own_model.UserRows(3, 4)
    again.restore(indptr, items, values)
    for user in range(3):
        np.testing.assert_array_equal(again.items[user], rows.items[user])
        np.testing.assert_array_equal(again.rows[user], rows.rows[user])
        assert not np.shares_memory(again.rows[user], values)
        assert not np.shares_memory(again.items[user], items)


def test_run_state_io_frees_the_variables_of_a_save_and_a_load(tmp_path):
    state = collections.OrderedDict(rows=np.ones(SHAPE, np.float32), round=np.int64(3))
    loop = asyncio.new_event_loop()
    try:
        with _no_automatic_collection():
            gc.collect()
            plain = tff.program.FileProgramStateManager(str(tmp_path / 'plain'), prefix='s_')
            loop.run_until_complete(plain.save(state, 1))
            # TFF's writer leaves its variables to the cycle collector.
            assert _live_variables() > 0
            gc.collect()
            manager = tff.program.FileProgramStateManager(str(tmp_path / 'io'), prefix='s_')
            run_state_io(loop, manager.save(state, 1))
            assert _live_variables() == 0
            loaded = run_state_io(loop, manager.load(1, state))
            assert _live_variables() == 0
        np.testing.assert_array_equal(loaded['rows'], state['rows'])
    finally:
        loop.close()
