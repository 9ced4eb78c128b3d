"""Simulation of FedRecGEL over a population of users on one machine."""

from tff_fedrecgel.simulation.client_states import ClientStateTable
from tff_fedrecgel.simulation.fedrecon_simulation import FedReconSimulation
from tff_fedrecgel.simulation.simulation import FedRecSimulation
