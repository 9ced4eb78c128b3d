"""Federated algorithms built from TFF computations."""

from tff_fedrecgel.algorithms.client_work import ClientWorkConfig
from tff_fedrecgel.algorithms.fedrecgel import build_fedrecgel_process
