"""FedRecGEL: sharpness-aware federated recommendation on TensorFlow Federated."""
