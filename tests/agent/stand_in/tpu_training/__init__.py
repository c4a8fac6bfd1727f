"""A stand-in for the training package, for what the real job cannot do on CPU."""
