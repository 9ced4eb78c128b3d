"""Installs the `tff_fedrecgel` library.

What gets installed: the `tff_fedrecgel` package and, under its name, the
dataset registry of the repository's top-level `tasks/` folder as
`tff_fedrecgel.tasks` and the command-line entry points of `launch/` as
`tff_fedrecgel.launch`, with the commands `tff-fedrecgel-train`, `-recommend`,
`-export`, `-tune` and `-download` (`launch/_commands.py`). No other top-level
name is installed.

Dependencies. TensorFlow Federated 0.87.0 (the last release) pins
jax==0.4.14 / jaxlib==0.4.14, and jaxlib 0.4.14 is no longer served, so pip
cannot resolve TFF with its dependencies. TFF is therefore not declared here;
it is installed with `pip install --no-deps tensorflow-federated==0.87.0`
after its own dependencies (requirements.txt, with a served jax pair).
`make venv` does it all, with every version pinned by constraints.txt.
"""

import setuptools

setuptools.setup(
    name='tff_fedrecgel',
    version='0.1.0',
    description=(
        'FedRecGEL (sharpness-aware federated recommendation) on '
        'TensorFlow Federated.'
    ),
    packages=setuptools.find_packages(include=['tff_fedrecgel', 'tff_fedrecgel.*'])
    + ['tff_fedrecgel.tasks', 'tff_fedrecgel.launch'],
    package_dir={'tff_fedrecgel.tasks': 'tasks', 'tff_fedrecgel.launch': 'launch'},
    entry_points={'console_scripts': [
        f'tff-fedrecgel-{name}=tff_fedrecgel.launch._commands:{name}'
        for name in ('train', 'recommend', 'export', 'tune', 'download')]},
    python_requires='>=3.9,<3.12',
    # What the library imports itself (TFF: see the module docstring).
    install_requires=[
        'absl-py>=1.0,<2',
        'dp-accounting==0.4.3',
        'grpcio>=1.46',
        'numpy>=1.25,<2',
        'optuna>=4,<6',
        'pandas>=2.1,<2.3',
        'tensorboard>=2.14,<2.15',
        'tensorflow>=2.14,<2.15',
        'tensorflow-privacy==0.9.0',
        'tqdm>=4.64',
    ],
    extras_require={
        # Test tools (nbclient, nbformat and ipykernel run docs/*.ipynb).
        # IPython 8.23+ imports typing_extensions.TypeAliasType, which the
        # typing-extensions that TFF pins (4.5.0) does not have.
        'dev': ['pytest>=8', 'pytest-timeout>=2.3', 'pytest-xdist>=3.5', 'nbclient>=0.10',
                'nbformat>=5.9', 'ipykernel>=6.29', 'ipython>=8.20,<8.23'],
        # launch/report_study.py's figures.
        'plots': ['matplotlib>=3.8'],
    },
)
