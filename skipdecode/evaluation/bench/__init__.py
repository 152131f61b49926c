"""`skipdecode bench`: decoding speed, measured against our own full decoding, the cost-model bound,
transformers' `generate`, the per-token early-exit peer and llama.cpp on the same GGUF, all in one run.

One idea a file: what a step costs, the bound and the floor (cost); the rounds that time every case
(timing); the table's rows from them (rows); the speed goals (goals); the markdown, docs/speed.md's table
and the CSV (report); the figure the app draws (figure); the command line (command)."""
