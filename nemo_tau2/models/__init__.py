"""Models being trained (NeMo-RL's ``nemo_rl/models``): see ``policy``."""
