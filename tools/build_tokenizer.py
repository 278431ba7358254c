"""Rebuild the packaged character-level tokenizer (``sagc_jax/assets/tokenizer``).

The tokenizer is a ``tokenizers`` WordLevel model over single characters: every printable ASCII
character plus newline and tab is one token, so ``decode(encode(text)) == text`` exactly for any
such text (the built-in ``arith`` task uses only digits, ``+ - = #``, space and newline). Special
tokens: ``<pad>`` (id 0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3, anything outside the
alphabet). The tokenizer itself prepends ``<bos>`` (``add_bos_token``: a ``TemplateProcessing``
post-processor in tokenizer.json), exactly as training encodes prompts, so ``tok(text)`` needs no
help. A minimal jinja chat template makes ``apply_chat_template`` work:

    <bos>user: {content}\\nassistant: {content}<eos>... and, with add_generation_prompt,
    a trailing ``assistant: ``.

Nothing is downloaded. Usage::

    python -m tools.build_tokenizer [--out sagc_jax/assets/tokenizer]
"""

from __future__ import annotations

import argparse
import pathlib

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "\n\t" + "".join(chr(c) for c in range(32, 127))

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

DEFAULT_OUT = pathlib.Path(__file__).resolve().parent.parent / "sagc_jax" / "assets" / "tokenizer"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the char-level tokenizer in memory and wrap it for ``transformers``."""
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character (newline included) is its own pre-token; nothing is normalised away.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        add_bos_token=True,  # the tokenizer itself prepends <bos>, as training does
        add_eos_token=False,
        model_max_length=4096,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main() -> None:
    """Build and save the tokenizer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args()
    tok = build_tokenizer()
    assert tok.pad_token_id == 0 and tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok("a")["input_ids"] == [1, tok.convert_tokens_to_ids("a")]  # one bos, no eos
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(args.out))
    print(f"saved tokenizer (vocab {len(tok)}) to {args.out}")


if __name__ == "__main__":
    main()
