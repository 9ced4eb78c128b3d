"""Every TFF worker process the project runs, and the process's signals.

* `local_worker`: `LocalRuntime`, this process's own TFF worker (dies with
  it, SIGKILL included) and the execution context on it;
  `shutdown_tff_workers` stops every worker this process started.
* `executors`: TFF's executors on a worker, made to free the worker's memory
  (values as soon as Python drops them, executors when an experiment ends).
* `services`: worker services for `--workers`, started detached and
  recorded in a state file (`launch/workers.py` is the command line).
* `processes`: the worker binary, which pids are workers, their memory,
  stopping them (no TensorFlow import).
* `signals`: SIGTERM and SIGHUP handled like Ctrl-C, and held back while an
  output is written.
"""

from tff_fedrecgel.runtime.local_worker import LocalRuntime
from tff_fedrecgel.runtime.local_worker import WorkerExitedError
from tff_fedrecgel.runtime.local_worker import shutdown_tff_workers
from tff_fedrecgel.runtime.processes import peak_rss_mb
from tff_fedrecgel.runtime.processes import reset_peak_rss
from tff_fedrecgel.runtime.processes import worker_pids
from tff_fedrecgel.runtime.signals import Terminated
from tff_fedrecgel.runtime.signals import armed_signals
from tff_fedrecgel.runtime.signals import deferred_signals
from tff_fedrecgel.runtime.signals import install_signal_handlers
