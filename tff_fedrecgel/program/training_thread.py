"""Runs the training program where it can drive its own event loop.

The training program runs its own asyncio event loop (checkpoints,
releases), which cannot run in a thread that already runs one, as a Jupyter
kernel's main thread does; there it runs in a thread of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import threading
from typing import Any


class _StopTraining(KeyboardInterrupt):
    """Raised in the training thread at a round's end after an interrupt."""


def run_here_or_in_thread(run: Callable[[Callable[[], None]], Any]) -> Any:
    """Calls `run(check_stop)` where the training program can drive its loop.

    The training program runs its own asyncio event loop (checkpoints,
    releases), which cannot run in a thread that already runs one, as a
    Jupyter kernel's main thread does. There it runs in a thread, with this
    thread's TFF context (TFF's context stack is per thread); an interrupt of
    the kernel stops it at the end of the current round.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run(lambda: None)
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    context = tff.framework.get_context_stack().current
    stop = threading.Event()
    outcome = {}

    def check_stop():
        if stop.is_set():
            raise _StopTraining()

    def target():
        try:
            with tff.framework.get_context_stack().install(context):
                outcome['value'] = run(check_stop)
        except BaseException as e:  # pylint: disable=broad-except
            outcome['error'] = e

    thread = threading.Thread(target=target, name='fedrecgel-training', daemon=True)
    thread.start()
    while True:
        # The whole wait is inside the try: an interrupt that lands between
        # two joins would otherwise escape and leave the thread training.
        try:
            while thread.is_alive():
                thread.join(0.1)
            break
        except KeyboardInterrupt:
            stop.set()
    if isinstance(outcome.get('error'), _StopTraining) or (
            stop.is_set() and 'error' not in outcome):
        raise KeyboardInterrupt('training interrupted; train() again resumes from the '
                                'latest checkpoint')
    if 'error' in outcome:
        raise outcome['error']
    return outcome['value']
