"""FedRAP (Li et al., ICLR 2024): its TFF round (`computation`) and its
simulation adapter (`adapter`)."""
