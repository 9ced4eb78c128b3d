"""Registry of the datasets ("tasks") FedRecGEL runs on.

The folder `tasks/` is installed as `tff_fedrecgel.tasks` (see setup.py).

Example::

    from tff_fedrecgel import tasks
    task = tasks.get_task('filmtrust')
    split = task.load_split(data_dir='/path/to/filmtrust')
"""

from tff_fedrecgel.tasks import amazon_video
from tff_fedrecgel.tasks import csv_data
from tff_fedrecgel.tasks import filmtrust
from tff_fedrecgel.tasks import lastfm_2k
from tff_fedrecgel.tasks import qb_article
from tff_fedrecgel.tasks import synthetic
from tff_fedrecgel.tasks.base import DEFAULT_CLIENT_FRACTION
from tff_fedrecgel.tasks.base import DEFAULT_ROUNDS
from tff_fedrecgel.tasks.base import PreparedSplit
from tff_fedrecgel.tasks.base import Task
from tff_fedrecgel.errors import DataError

TASK_NAMES = ('filmtrust', 'lastfm_2k', 'amazon_video', 'qb_article', 'csv',
              'synthetic')

_TASKS = {
    module.TASK.name: module.TASK
    for module in (filmtrust, lastfm_2k, amazon_video, qb_article, csv_data,
                   synthetic)
}
assert tuple(_TASKS) == TASK_NAMES, 'registry out of sync'


def get_task(name: str) -> Task:
    """Looks a task up by name.

    Args:
      name: One of `TASK_NAMES`.

    Returns:
      The task.

    Raises:
      DataError: For an unknown name.
    """
    try:
        return _TASKS[name]
    except (KeyError, TypeError):
        raise DataError(
            f'unknown task {name!r}; choose one of {", ".join(TASK_NAMES)}'
        ) from None


__all__ = ['PreparedSplit', 'TASK_NAMES', 'Task', 'get_task']
