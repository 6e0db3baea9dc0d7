"""Build a small byte-level BPE tokenizer offline, as a folder that ``transformers``'
``AutoTokenizer.from_pretrained(FOLDER)`` loads (``tokenizer.json`` + ``tokenizer_config.json``).

Benchmark clients (GuideLLM's ``--processor``, AIPerf's ``--tokenizer``, ``vllm bench serve
--tokenizer``) need a tokenizer to make synthetic prompts of N tokens and to count the tokens
of what a server sends back; where no model hub can be reached, this one serves. It is trained
on the repository's own Markdown (README and docs) plus a list of common English words, so an
English text of plain words tokenizes to about one token per word, as a real model's
tokenizer (GPT-2, Llama, Qwen) does. Same repository, same tokenizer (training is
deterministic).

    python benchmarks/offline_tokenizer.py /tmp/simctl-tokenizer

Library use: :func:`build_tokenizer` returns the ``tokenizers.Tokenizer`` without writing it.
Needs the ``tokenizers`` package (``transformers`` only to load the folder).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: vocabulary size: enough for every common word and most of the docs' words to be one token
VOCAB = 8000


def corpus(words: bool = True) -> Iterator[str]:
    """The training texts: the README and docs pages, then (``words``) a few hundred lines of
    the sleep backend's word list (so each of its words is surely one token)."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if path.is_file():
            yield path.read_text(encoding="utf-8")
    if not words:
        return
    try:
        from simulator.serve.backends import WORDS
    except ImportError:  # the package is not importable: the docs alone still train a tokenizer
        return
    for i in range(400):
        yield " ".join(WORDS[(i + j) % len(WORDS)] for j in range(len(WORDS)))


def build_tokenizer(vocab_size: int = VOCAB, words: bool = True):  # type: ignore[no-untyped-def]
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on :func:`corpus` (``words``: with
    the sleep backend's word list; without it, on the docs' prose alone)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(words), trainer=trainer)
    return tokenizer


def write_tokenizer(folder: Path, vocab_size: int = VOCAB) -> Path:
    """Train (:func:`build_tokenizer`) and save into ``folder`` as a ``transformers`` tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(vocab_size).save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
              "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
              # a plain template, so clients that apply one (chat prompts counted client-side) can
              "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {k: "<|endoftext|>" for k in ("bos_token", "eos_token", "unk_token", "pad_token")}, indent=2) + "\n",
        encoding="utf-8")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write tokenizer.json and tokenizer_config.json")
    parser.add_argument("--vocab-size", type=int, default=VOCAB)
    args = parser.parse_args()
    write_tokenizer(args.folder, args.vocab_size)
    print(f"{args.folder}: tokenizer written (load with AutoTokenizer.from_pretrained({str(args.folder)!r}))")


if __name__ == "__main__":
    main()
