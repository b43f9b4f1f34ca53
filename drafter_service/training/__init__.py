"""The drafter training pipeline: regenerated data, target states on the fly, losses, joint training."""
