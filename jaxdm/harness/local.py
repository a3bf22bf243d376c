"""``LocalLLM``: a jaxdm generative model as the agent LLM (the KV-cache sampler).

The request becomes chat messages [system, user]; the tools are given to the tokenizer's chat
template (``apply_chat_template(..., tools=...)``); a template that ignores ``tools`` (the
rendered text does not contain the first tool's name) gets them appended to the system
message as JSON schemas instead, so the model always sees them. The model is asked to reply
with one JSON object ``{"tool": <name>, "args": {...}, "answers": {"q1": <option>, ...}}``;
the first JSON object in its (greedy) output is read like a remote tool call. Anything else is
a failed call (``ok`` False with the reason). Usage: prompt and generated token counts,
measured seconds, price 0 unless ``price_per_1k_*`` are set.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping

import jax.numpy as jnp

from jaxdm import models
from jaxdm.harness.llm_call import (ANSWER_TOOL, LLMReply, LLMRequest, parse_tool_calls,
                                    questions_text)
from jaxdm.models import generate
from jaxdm.models.smollm2 import smollm2
from jaxdm.models.tokenizer import chat_ids

INSTRUCTIONS = (
    "You are a customer-service agent for a small shop. Reply with one JSON object and nothing "
    'else: {"tool": "<tool name>", "args": {...}, "answers": {"q1": "<option number>", ...}} '
    "(\"tool\" and \"args\" when tools are listed, \"answers\" when questions are asked).")


def first_json_object(text: str) -> dict | None:
    """The first balanced ``{...}`` in ``text`` that parses as a JSON object, else None."""
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                esc = (ch == "\\") and not esc
                if ch == '"' and not esc:
                    in_str = False
                continue
            if ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    try:
                        obj = json.loads(text[start:i + 1])
                    except json.JSONDecodeError:
                        break
                    return obj if isinstance(obj, dict) else None
        start = text.find("{", start + 1)
    return None


class LocalLLM:
    """A jaxdm ``Pretrained`` model (or any ``generate_fn(prompt_ids) -> text``) as agent LLM."""

    def __init__(self, pretrained: Any, *, max_new_tokens: int = 128,
                 price_per_1k_in: float = 0.0, price_per_1k_out: float = 0.0,
                 generate_fn: Callable[[list[int]], tuple[str, int]] | None = None,
                 name: str | None = None):
        self.pretrained = pretrained
        self.tokenizer = pretrained.tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.price_in, self.price_out = float(price_per_1k_in), float(price_per_1k_out)
        self._generate_fn = generate_fn or self._generate
        self.name = name or "local"

    @classmethod
    def from_spec(cls, opts: Mapping[str, Any]) -> "LocalLLM":
        """A LocalLLM from a ``make_llm`` spec's options: ``path`` ("smollm2" or a checkpoint
        folder), ``dtype`` (default float32) and the constructor's keywords."""
        opts = dict(opts)
        path = opts.pop("path", "smollm2")
        dtype = opts.pop("dtype", None)

        if path == "smollm2":
            pre = smollm2(jnp.dtype(dtype or "float32"))
        else:
            pre = models.load_pretrained(path, jnp.dtype(dtype or "float32"))
        return cls(pre, **opts)

    def _generate(self, ids: list[int]) -> tuple[str, int]:
        out = generate(self.pretrained.params, self.pretrained.config, self.tokenizer, [ids],
                       max_new_tokens=self.max_new_tokens, greedy=True)
        toks = out.tokens[0]
        return self.tokenizer.decode(toks, skip_special_tokens=True), len(toks)

    def messages(self, req: LLMRequest) -> list[dict]:
        """The chat messages [system, user] for ``req``: the prompt, the fixed argument values, the
        held questions and the reflection ask."""
        user = req.prompt
        if req.fixed_args:
            user += "\n\nUse these argument values: " + json.dumps(dict(req.fixed_args),
                                                                   sort_keys=True)
        if req.questions:
            user += "\n\nAnswer these questions in \"answers\":\n" + questions_text(req.questions)
        if req.reflect:
            user += "\n\nFirst reflect briefly on your last step: did it fail or leave the plan?"
        return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": user}]

    def prompt_ids(self, req: LLMRequest) -> list[int]:
        """The token ids of ``req``'s chat (the offered tools in the chat template, or in the system
        message when the template ignores them); special-token strings in the text stay text."""
        msgs = self.messages(req)
        tools = [t for t in req.tools
                 if req.forced_tool is None or t["function"]["name"] == req.forced_tool]
        templated = False
        if tools:
            try:
                text = self.tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False,
                                                          add_generation_prompt=True)
                templated = tools[0]["function"]["name"] in text
            except Exception:  # noqa: BLE001 - a template without tool support
                templated = False
            if not templated:  # the template ignores tools: put them in the system message
                msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\nTools:\n"
                           + "\n".join(json.dumps(t["function"], sort_keys=True)
                                       for t in tools)}
        # Observations and tool results are untrusted: their special-token strings stay text.
        return chat_ids(self.tokenizer, [msgs], tools=tools if templated else None)[0]

    def act(self, req: LLMRequest) -> LLMReply:
        """One greedy generation for ``req``: the first JSON object of the output read as a tool
        call and answers, with token counts, measured seconds and price; no JSON object or a
        generation error is an ``ok=False`` reply."""
        t0 = time.perf_counter()
        ids = self.prompt_ids(req)
        try:
            text, n_out = self._generate_fn(ids)
        except Exception as e:  # noqa: BLE001 - a failed call, not a crashed agent
            return LLMReply(ok=False, error=f"generation failed: {type(e).__name__}: {e}",
                            tokens_in=len(ids), seconds=time.perf_counter() - t0,
                            model=self.name)
        base = dict(tokens_in=len(ids), tokens_out=int(n_out),
                    usd=len(ids) / 1000 * self.price_in + n_out / 1000 * self.price_out,
                    seconds=time.perf_counter() - t0, model=self.name)
        obj = first_json_object(text)
        if obj is None:
            return LLMReply(ok=False, error="no JSON object in the model's reply",
                            text=text[:500], **base)
        calls = []
        if req.tools and isinstance(obj.get("tool"), str):
            calls.append({"function": {"name": obj["tool"],
                                       "arguments": json.dumps(obj.get("args") or {})}})
        if req.questions and isinstance(obj.get("answers"), Mapping):
            calls.append({"function": {"name": ANSWER_TOOL,
                                       "arguments": json.dumps(obj["answers"])}})
        return parse_tool_calls({"content": text, "tool_calls": calls}, req, **base)


__all__ = ["LocalLLM", "first_json_object", "INSTRUCTIONS"]
