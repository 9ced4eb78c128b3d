"""Simulation of federated rounds over a population of users on one machine."""

from tff_fedrecgel.simulation.build import build_simulation
from tff_fedrecgel.simulation.build import model_config_for
from tff_fedrecgel.simulation.client_states import ClientStateTable
from tff_fedrecgel.simulation.driver import Algorithm
from tff_fedrecgel.simulation.driver import Simulation
from tff_fedrecgel.simulation.driver import clients_per_round_for
