"""Installs the `tff_fedrecgel` library (with `tasks` and `launch`)."""

import setuptools

setuptools.setup(
    name='tff_fedrecgel',
    version='0.1.0',
    description=(
        'FedRecGEL (sharpness-aware federated recommendation) on '
        'TensorFlow Federated.'
    ),
    packages=setuptools.find_packages(include=['tff_fedrecgel*', 'tasks*', 'launch*']),
    python_requires='>=3.9,<3.12',
    # Dependencies are pinned in requirements.txt; TFF itself must be installed
    # with --no-deps (see requirements.txt for why).
    install_requires=[],
)
