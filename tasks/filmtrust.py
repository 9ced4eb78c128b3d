"""FilmTrust (Guo et al., IJCAI 2013): explicit ratings used as positives."""

from tff_fedrecgel.tasks.base import Task
from tff_fedrecgel.data import loaders

TASK = Task(
    name='filmtrust',
    raw_file='filmtrust-ratings.txt',
    rho_sh=0.0,
    rho_ns=0.02,
    description='FilmTrust ratings; seeded pseudo-timestamps (no real ones).',
    reader=loaders.load_filmtrust,
)
