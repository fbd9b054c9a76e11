"""A character-level tokenizer built with `tokenizers`, saved as a Hugging Face tokenizer.

It loads back through AutoTokenizer.from_pretrained(dir), exactly like a real
checkpoint's tokenizer, so every other module treats both the same way.
"""

from __future__ import annotations

from pathlib import Path

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def build_char_tokenizer(alphabet: str, out_dir: Path):
    """Build, save to out_dir and return a PreTrainedTokenizerFast over `alphabet`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in alphabet:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast
