"""vLLM side of ``scoring_throughput.py --vllm``: one offline engine, driven over a pipe.

Runs under the vLLM venv's Python (``make bench-vllm`` builds ``.venv-vllm``; it does not import
jaxdm). ``argv[1]`` is a JSON object of ``vllm.LLM`` keyword arguments (model folder, dtype,
block_size, ...); environment variables such as ``VLLM_CPU_OMP_THREADS_BIND`` are set by the
parent before this process starts. The engine stays up across rounds; the parent sends one JSON
command per line on stdin and reads one JSON reply per line on the original stdout (vLLM's own
logging is moved to stderr so it cannot corrupt the protocol).

Commands (all prompts are token-id lists, exactly the ids jaxdm scores):

- ``{"op": "readout", "prompts": [[ids]], "yes": id, "no": id, "mode": "top20" | "ids"}``:
  one generated token per prompt (``max_tokens=1``) with prefix caching; ``top20`` asks for
  ``logprobs=20`` (the issue's recipe; Yes/No must both be among them), ``ids`` for exactly
  the Yes/No log-probs (``logprob_token_ids``). Replies P(Yes) / (P(Yes) + P(No)) per prompt.
- ``{"op": "options", "prompts": [[ids]], "starts": [s], "cache": bool}``: the log-prob of
  every prompt token from index ``starts[i]`` on (the option's tokens) via ``prompt_logprobs``.
  ``cache`` false: vLLM's default (requests with prompt log-probs do not read the prefix
  cache); true: ``skip_reading_prefix_cache=False`` (cached prefix blocks are not recomputed).
- ``{"op": "quit"}``.

Every timed command first empties the prefix cache (``reset_prefix_cache``), so every round
computes the same tokens; replies carry the wall seconds of ``generate`` and the tokens
computed (prompt tokens minus the prefix-cache hits vLLM reports per request).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time


def _protocol_out():
    """A private copy of stdout for replies; fd 1 (used by vLLM's logging) goes to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


def _lp(entry: dict, token: int) -> float | None:
    got = entry.get(token) if entry else None
    return None if got is None else float(got.logprob)


def main() -> None:
    out = _protocol_out()
    kwargs = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    out.write(json.dumps({"ready": True, "start_s": start_s}) + "\n")

    def run(prompts, params):
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                           use_tqdm=False)
        seconds = time.perf_counter() - t0
        computed = sum(len(p) - (r.num_cached_tokens or 0) for p, r in zip(prompts, res))
        return res, seconds, computed

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "readout":
            yes, no = int(cmd["yes"]), int(cmd["no"])
            if cmd.get("mode", "top20") == "ids":
                params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=2,
                                        logprob_token_ids=[yes, no])
            else:
                params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=20)
            res, seconds, computed = run(cmd["prompts"], params)
            scores, missing = [], 0
            for r in res:
                entry = r.outputs[0].logprobs[0]
                ly, ln = _lp(entry, yes), _lp(entry, no)
                if ly is None or ln is None:
                    missing += 1
                    scores.append(None)
                    continue
                m = max(ly, ln)
                scores.append(math.exp(ly - m) / (math.exp(ly - m) + math.exp(ln - m)))
            reply = {"seconds": seconds, "computed": computed, "scores": scores,
                     "missing": missing}
        elif op == "options":
            extra = {} if not cmd.get("cache") else {"skip_reading_prefix_cache": False}
            # detokenize=False: with cached blocks read, vLLM 0.32 hands placeholder ids of the
            # cached rows to its detokenizer, which raises OverflowError (seen 2026-12-02).
            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                    detokenize=False, **extra)
            res, seconds, computed = run(cmd["prompts"], params)
            logprobs, missing = [], 0
            for p, s, r in zip(cmd["prompts"], cmd["starts"], res):
                plp = r.prompt_logprobs or []
                # With cached prefix blocks read, only the computed tail has entries.
                shift = len(p) - len(plp)
                row = []
                for i in range(int(s), len(p)):
                    v = _lp(plp[i - shift], p[i]) if i - shift >= 0 else None
                    if v is None:
                        missing += 1
                    row.append(v)
                logprobs.append(row)
            reply = {"seconds": seconds, "computed": computed, "logprobs": logprobs,
                     "missing": missing}
        else:
            reply = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
