"""FastTokenizer (tokenizers library) gives transformers' PreTrainedTokenizerFast ids and text."""
from __future__ import annotations

import json

import pytest

from jaxdm.models.loading import load_tokenizer
from jaxdm.models.smollm2 import smollm2_path
from jaxdm.models.tokenizer import FastTokenizer

from tests.models.helpers_models import write_tiny_tokenizer

TEXTS = [
    "", "Yes", " No", "Is the agent making progress? Answer Yes or No.",
    "go to cabinet 12, then open drawer 3 (x=1.5e-3)\n\n  two  spaces\ttab",
    "héllo wörld ✓ 你好 🙂", "<|im_start|>user\nhi<|im_end|>\n", "w5 w6 <s> w7 </s>",
]
CHATS = [
    [{"role": "user", "content": "Did the last action help? Answer Yes or No."}],
    [{"role": "system", "content": "You judge."}, {"role": "user", "content": "a\nb"},
     {"role": "assistant", "content": "Yes"}],
]


def _reference(folder):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="module", params=["smollm2", "tiny"])
def pair(request, tmp_path_factory):
    if request.param == "smollm2":
        folder = smollm2_path()
    else:
        folder = tmp_path_factory.mktemp("tok")
        write_tiny_tokenizer(folder)
    fast = load_tokenizer(folder)
    assert isinstance(fast, FastTokenizer)
    return fast, _reference(folder)


def test_same_ids_text_and_special_tokens(pair):
    fast, ref = pair
    for text in TEXTS:
        for special in (False, True):
            ids = fast(text, add_special_tokens=special)["input_ids"]
            assert ids == list(ref(text, add_special_tokens=special)["input_ids"]), text
            assert fast.encode(text, add_special_tokens=special) == ids
            for skip in (False, True):
                assert fast.decode(ids, skip_special_tokens=skip) == \
                    ref.decode(ids, skip_special_tokens=skip), (text, skip)
    assert fast(TEXTS[:3], add_special_tokens=False)["input_ids"] == \
        [list(x) for x in ref(TEXTS[:3], add_special_tokens=False)["input_ids"]]
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id",
                 "eos_token", "vocab_size"):
        assert getattr(fast, attr) == getattr(ref, attr), attr
    assert len(fast) == len(ref) == fast.get_vocab_size()
    from jaxdm.rl.text import HFTokenizer

    a, b = HFTokenizer(fast), HFTokenizer(ref)
    assert (a.vocab_size, a.eos_id, a.pad_id) == (b.vocab_size, b.eos_id, b.pad_id)
    assert a.encode(TEXTS[4]) == b.encode(TEXTS[4])
    assert not fast.transformers_loaded  # nothing above needed transformers


def test_same_chat_template_text(pair):
    fast, ref = pair
    for chat in CHATS:
        for gen in (False, True):
            assert fast.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) \
                == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
    # outside the plain-text path: transformers renders it (loaded on demand)
    out = fast.apply_chat_template(CHATS[0], tokenize=True, add_generation_prompt=True)
    want = ref.apply_chat_template(CHATS[0], tokenize=True, add_generation_prompt=True)
    assert list(out["input_ids"]) == list(want["input_ids"])


def test_settings_it_cannot_reproduce_use_transformers(tmp_path):
    write_tiny_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config,
                                                                "add_bos_token": True}))
    assert not FastTokenizer.supports(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert not isinstance(tok, FastTokenizer)
    assert tok("w5 w6", add_special_tokens=False)["input_ids"] == [5, 6]
    with pytest.raises(ValueError, match="add_bos_token=True"):
        FastTokenizer(tmp_path)


def test_scoring_start_imports_neither_torch_nor_transformers():
    # Cold start (issue 17): the CLI, the screen and a loaded SmolLM2 tokenizer + local judge
    # must not pull in torch or transformers (4-6 s of imports on 2 cores).
    import subprocess
    import sys

    code = ("import sys; import jaxdm.cli, jaxdm.screen.run, jaxdm.decision.local; "
            "from jaxdm.models.loading import load_tokenizer; "
            "from jaxdm.models.smollm2 import smollm2_path; "
            "t = load_tokenizer(smollm2_path()); t.apply_chat_template("
            "[{'role': 'user', 'content': 'x'}], tokenize=False, add_generation_prompt=True); "
            "print(sorted(m for m in ('torch', 'transformers', 'alfworld') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
