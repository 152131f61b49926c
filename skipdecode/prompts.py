"""How a prompt becomes token ids, the same way for decoding and for training."""

from __future__ import annotations


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer, prompt, chat: bool | None = None) -> list[int]:
    """Token ids of one prompt. Text goes through the chat template when the model has one (chat=None)
    or when asked (chat=True); a sequence of ints is taken as ids already."""
    if not isinstance(prompt, str):
        return [int(t) for t in prompt]
    if not prompt.strip():
        raise ValueError("prompt is empty")
    if has_chat_template(tokenizer) if chat is None else chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]
