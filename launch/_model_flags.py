"""Model flags shared by the entry points (train, export): the NeuMF sizes.

Their defaults are the paper's (`sizes`, through `run_settings.Settings`).
"""

from __future__ import annotations

from absl import flags

from tff_fedrecgel import run_settings

_default = run_settings.default


def _listed(values) -> str:
    return ','.join(map(str, values))


GMF_DIM = flags.DEFINE_integer(
    'gmf_dim', _default('gmf_dim'), 'Embedding size of the GMF branch (users and items).')
MLP_DIM = flags.DEFINE_integer(
    'mlp_dim', _default('mlp_dim'),
    'Embedding size of the MLP branch (users and items; not FedMF\'s).')
MLP_LAYERS = flags.DEFINE_list(
    'mlp_layers', _listed(_default('mlp_layers')),
    'Widths of the MLP tower\'s ReLU layers, comma-separated (not FedMF\'s).')
