"""Turning a task's question into prompt token ids, the same way on every side of the run."""

from __future__ import annotations


def prompt_token_ids(tokenizer, question: str, template: str = "{question}") -> list[int]:
    """Chat-template the question as one user turn and open the assistant turn."""
    messages = [{"role": "user", "content": template.format(question=question)}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 returns a BatchEncoding here, 4.x a plain list
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
