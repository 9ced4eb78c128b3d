"""Recommendation models with a global (item) part and a local (user) part."""

from tff_fedrecgel.models.neumf import ModelConfig
from tff_fedrecgel.models.neumf import NeuMF
from tff_fedrecgel.models.neumf import build_keras_model
from tff_fedrecgel.models.neumf import build_reconstruction_model
from tff_fedrecgel.models.neumf import score_items
