"""PFedRec (Zhang et al., IJCAI 2023): its TFF round (`computation`) and its
simulation adapter (`adapter`)."""
