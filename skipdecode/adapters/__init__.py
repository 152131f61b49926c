"""The LoRA adapters and which one serves a prompt: the adapters on disk, picked for a speedup and merged
(lora.py), and the router that tells an E2E meaning representation from a general prompt (router.py)."""
