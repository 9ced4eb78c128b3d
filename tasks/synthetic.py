"""A small generated dataset with latent structure, for demos and tests."""

import dataclasses

from tff_fedrecgel import recipes
from tff_fedrecgel.tasks.base import Task
from tff_fedrecgel.data import synthetic

TASK = Task(
    name='synthetic',
    raw_file=None,
    rho_sh=0.01,
    rho_ns=0.05,
    # Every task's rounds (tasks.DEFAULT_ROUNDS): `auto`, its default preset, was
    # chosen on runs that long, and in 20 it stays below popularity (full ranking).
    client_fraction=0.1,
    description='Synthetic latent-factor log (500 users, 400 items default).',
    default_preset=recipes.AUTO,
    reader=synthetic.generate_synthetic,
    option_names=tuple(f.name for f in dataclasses.fields(
        synthetic.SyntheticConfig)),
    options_check=synthetic.check_options,
)
