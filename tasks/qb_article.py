"""QB-article (Tenrec, NeurIPS 2022): article clicks without timestamps."""

from tff_fedrecgel.tasks.base import Task
from tff_fedrecgel.data import loaders

TASK = Task(
    name='qb_article',
    raw_file='QB-article.csv',
    rho_sh=0.02,
    rho_ns=0.05,
    description='Tenrec QB-article clicks; row order stands in for time.',
    reader=loaders.load_qb_article,
)
