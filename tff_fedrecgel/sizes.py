"""Model and evaluation sizes: the one owner of their defaults (the paper's).

`ModelConfig` holds a NeuMF model's sizes (`models.neumf` builds it); the
run settings (`run_settings.Settings`), the flags and the evaluation take
their defaults from the constants here. Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses

# The paper's NeuMF: GMF and MLP embeddings of 32 and 128, a 128-64-32 tower.
GMF_DIM = 32
MLP_DIM = 128
MLP_LAYERS = (128, 64, 32)
# Cut-offs K of HR@K and NDCG@K; a run's round is selected on HR@SELECT_K.
TOP_KS = (5, 10, 15, 20)
SELECT_K = 10
# The sampled protocol ranks the held-out item among this many negatives.
EVAL_NEGATIVES = 99
# Training negatives sampled per positive (the paper's and NCF's 4).
TRAINING_NEGATIVES = 4
# Widths past this make an item table of a large catalog too big to train.
MAX_WIDTH = 4096


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes of a NeuMF model.

    Attributes:
      num_items: Number of items (rows of the item embedding tables).
      gmf_dim: Embedding size of the GMF branch (user and item).
      mlp_dim: Embedding size of the MLP branch (user and item); the tower's
        input is their concatenation, `2 * mlp_dim` wide.
      mlp_layers: Widths of the ReLU layers of the MLP tower. Empty, together
        with `use_mlp=False`, gives the GMF-only model (the FedMF baseline).
      use_mlp: Whether the MLP branch exists. False gives GMF only.
    """

    num_items: int
    gmf_dim: int = GMF_DIM
    mlp_dim: int = MLP_DIM
    mlp_layers: tuple[int, ...] = MLP_LAYERS
    use_mlp: bool = True

    def __post_init__(self):
        object.__setattr__(self, 'mlp_layers', tuple(self.mlp_layers))
        if self.num_items < 1:
            raise ValueError(f'num_items must be positive, got {self.num_items}')
        if self.gmf_dim < 1:
            raise ValueError(f'gmf_dim must be positive, got {self.gmf_dim}')
        if self.use_mlp and (self.mlp_dim < 1 or not self.mlp_layers
                             or min(self.mlp_layers) < 1):
            raise ValueError('the MLP branch needs mlp_dim > 0 and positive mlp_layers')

    @property
    def table_dims(self) -> tuple[int, ...]:
        """Widths of the item embedding tables (GMF, then MLP)."""
        return (self.gmf_dim, self.mlp_dim) if self.use_mlp else (self.gmf_dim,)

    @property
    def local_dims(self) -> tuple[int, ...]:
        """Widths of the user embedding tables (the same as the items')."""
        return self.table_dims

    @property
    def prediction_input_dim(self) -> int:
        return self.gmf_dim + (self.mlp_layers[-1] if self.use_mlp else 0)

    def num_global_params(self) -> int:
        """Number of floats in the global (aggregated) part."""
        total = self.num_items * self.gmf_dim + self.prediction_input_dim + 1
        if self.use_mlp:
            total += self.num_items * self.mlp_dim
            fan_in = 2 * self.mlp_dim
            for width in self.mlp_layers:
                total += fan_in * width + width
                fan_in = width
        return total
