"""The learned drafters and everything that makes them, as a plugin of the `dspark` engine.

- `models/`: the drafter networks (DSpark/DFlash block drafters, EAGLE-3/MTP-1 autoregressive ones),
  their configuration and checkpoints;
- `runtime/`: the drafters serving inside the engine behind `dspark.drafter.Drafter`; registered with
  the engine through the `dspark.drafters` entry points in pyproject.toml;
- `training/`: the DeepSpec-style pipeline (the target's own regenerated answers, target states on
  the fly, the losses, joint training);
- `calibration/`: recording verify rounds and fitting the confidence head's STS temperatures;
- `demo/`: the demo stack built by `make models` (corpus, tokenizer, target, then the drafters).
"""
