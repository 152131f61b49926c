"""Speculative decoding: SkipDecode drafts that the full-depth model verifies (verify.py), how much to draft
(drafting.py), drafts copied from the prompt (prompt_lookup.py) and the draft's LM head over a shortlist
(shortlist.py)."""
