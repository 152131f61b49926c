"""Training, above the runtime and the evaluation: skip-aware LoRA fine-tuning, one idea a file: the loop
and its command (train), its settings (config), the model that follows the layer plan (skip_lm), the losses
(losses), the examples and batches (data) and the shipped adapter with its card (card); its general-prompt
targets (targets), the student's own answers for sequence-level unlikelihood (own_answers), the teacher
outputs' cache (answer_cache) and rank cuts of trained adapters (rank_cut). What an adapter needs at decode
time is in its record (skipdecode.json) and in skipdecode/schedule.py, so that decoding never imports this
package (tests/test_layers.py)."""
