"""Optimizers used in client work."""

from tff_fedrecgel.optimizers.sam import NormSegments
from tff_fedrecgel.optimizers.sam import SamGradients
from tff_fedrecgel.optimizers.sam import SharpnessAwareMinimization
