"""GPFedRec (Zhang et al., KDD 2024): its users' TFF round and user graph
(`computation`) and its simulation adapter with the server's graph step
(`adapter`)."""
