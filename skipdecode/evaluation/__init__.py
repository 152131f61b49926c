"""Evaluation, above the runtime: the E2E data and its scores (data, evaluate), the general-prompts
evaluation (general), text and token metrics (quality), the speed table (the bench package) and its
early-exit peer (peers), and the machine a measurement ran on (machine). It imports the runtime
(skipdecode/*.py) and never the training code (skipdecode/training/); the runtime never imports it
(tests/test_layers.py)."""
