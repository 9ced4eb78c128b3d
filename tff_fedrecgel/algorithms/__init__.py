"""Federated algorithms built from TFF computations."""

from tff_fedrecgel.algorithms.client_update import ClientWorkConfig
from tff_fedrecgel.algorithms.client_update import build_client_update
from tff_fedrecgel.algorithms.fedrecgel import build_fedrecgel_process
from tff_fedrecgel.algorithms.model_client_work import initial_client_state
