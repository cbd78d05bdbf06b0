"""Input batches, deterministic per global sample index.

Sample ``i`` depends only on ``(plan.seed, i)``, never on the world size or the accumulation
split, so every split of one global batch sees the same data: that is what lets the search
change the split while the maths stays exact, and what the gradient tests check.

Step ``s`` covers global samples ``[s*G, (s+1)*G)``; rank ``r`` owns the contiguous slice
starting at ``s*G + r*G/world``, and micro-step ``m`` takes the next ``micro_batch`` samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from train_fns.plan import TrialPlan

MLM_FRACTION = 0.15
FALLBACK_MASK_TOKEN_ID = 103
"""BERT's ``[MASK]``; used when neither config nor tokenizer names a mask token."""
IGNORE_INDEX = -100
_SEED_MIX = 0x9E3779B97F4A7C15


def num_masked(seq_len: int) -> int:
    """Masked positions per MLM sample: the same count in every sample.

    Equal labelled-token counts make the mean of micro-batch mean losses equal the
    big-batch mean loss, so accumulation is exact.
    """
    return max(1, round(MLM_FRACTION * seq_len))


def sample_seed(seed: int, index: int) -> int:
    """A generator seed for one sample, distinct across (seed, index) pairs in practice."""
    return (seed * _SEED_MIX + index) % (2**63)


def sample_indices(plan: TrialPlan, rank: int, step: int, micro_step: int) -> range:
    """The global sample indices one rank consumes at one micro-step."""
    if not 0 <= rank < plan.world_size:
        raise ValueError(f"rank={rank} outside world_size={plan.world_size}")
    if not 0 <= micro_step < plan.accumulation_steps:
        raise ValueError(f"micro_step={micro_step} outside {plan.accumulation_steps} micro-steps")
    per_rank = plan.global_batch // plan.world_size
    if step < plan.first_step:
        raise ValueError(f"step={step} is before the plan's first_step={plan.first_step}")
    start = (
        plan.first_sample
        + (step - plan.first_step) * plan.global_batch
        + rank * per_rank
        + micro_step * plan.micro_batch
    )
    return range(start, start + plan.micro_batch)


def _mask_token_id(config: PretrainedConfig, tokenizer_mask_id: int | None = None) -> int:
    vocab_size = config.vocab_size
    for candidate in (tokenizer_mask_id, getattr(config, "mask_token_id", None)):
        if isinstance(candidate, int) and 0 <= candidate < vocab_size:
            return candidate
    return min(FALLBACK_MASK_TOKEN_ID, vocab_size - 1)


class BatchSource:
    """Turns global sample indices into model inputs for one plan."""

    def __init__(
        self, plan: TrialPlan, vocab_size: int, mask_token_id: int, blocks: Tensor | None = None
    ) -> None:
        self.plan = plan
        self.vocab_size = vocab_size
        self.mask_token_id = mask_token_id
        self.blocks = blocks
        """``[num_blocks, seq_len]`` tokens from a file; None means synthetic tokens."""

    def sample(self, index: int) -> tuple[Tensor, Tensor]:
        """``(input_ids, labels)`` of global sample ``index``, each ``[seq_len]`` int64."""
        seq_len = self.plan.seq_len
        generator = torch.Generator().manual_seed(sample_seed(self.plan.seed, index))
        if self.blocks is None:
            tokens = torch.randint(0, self.vocab_size, (seq_len,), generator=generator)
        else:
            tokens = self.blocks[index % len(self.blocks)].clone()
        if self.plan.task == "clm":
            return tokens, tokens.clone()  # HF shifts labels inside the model
        positions = torch.randperm(seq_len, generator=generator)[: num_masked(seq_len)]
        labels = torch.full_like(tokens, IGNORE_INDEX)
        labels[positions] = tokens[positions]
        tokens[positions] = self.mask_token_id
        return tokens, labels

    def collate(self, indices: list[int] | range) -> dict[str, Tensor]:
        """The samples with these global indices, stacked (on CPU)."""
        pairs = [self.sample(i) for i in indices]
        return {
            "input_ids": torch.stack([p[0] for p in pairs]),
            "labels": torch.stack([p[1] for p in pairs]),
        }

    def batch(
        self, rank: int, step: int, micro_step: int, device: torch.device
    ) -> dict[str, Tensor]:
        """The micro-batch of ``rank`` at ``(step, micro_step)``, on ``device``."""
        batch = self.collate(sample_indices(self.plan, rank, step, micro_step))
        non_blocking = device.type == "cuda"
        return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


def read_documents(path: Path) -> list[str]:
    """Documents of a ``.txt`` (one per line) or ``.jsonl`` (a ``text`` field) file."""
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist (plan.data)")
    if path.suffix not in (".txt", ".jsonl"):
        raise ValueError(f"data file {str(path)!r}: use a .txt or .jsonl file, or 'synthetic'")
    documents = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if path.suffix == ".txt":
                documents.append(line.strip())
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{line_no}: each .jsonl line needs a string 'text' field")
            documents.append(record["text"])
    return documents


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A tokenizer from a local directory only: workers never download."""
    if not Path(path).expanduser().is_dir():
        raise FileNotFoundError(
            f"tokenizer directory {path!r} does not exist; set plan.tokenizer to a local "
            "directory holding the tokenizer files (file data needs a local tokenizer)"
        )
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"no usable tokenizer in {path!r}: {e}") from e


def tokenize_to_blocks(
    documents: list[str], tokenizer: PreTrainedTokenizerBase, seq_len: int
) -> Tensor:
    """Concatenate the documents' tokens (separated by EOS/SEP) into ``[n, seq_len]`` blocks."""
    separator = tokenizer.eos_token_id
    if separator is None:
        separator = tokenizer.sep_token_id
    ids: list[int] = []
    for encoded in tokenizer(documents, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        if separator is not None:
            ids.append(separator)
    num_blocks = len(ids) // seq_len
    if num_blocks == 0:
        raise ValueError(f"data has {len(ids)} tokens, fewer than one seq_len={seq_len} block")
    return torch.tensor(ids[: num_blocks * seq_len], dtype=torch.long).view(num_blocks, seq_len)


def make_batch_source(plan: TrialPlan, config: PretrainedConfig) -> BatchSource:
    """Synthetic tokens, or a local text file tokenized once up front (not timed per step)."""
    if plan.data == "synthetic":
        return BatchSource(plan, config.vocab_size, _mask_token_id(config))
    documents = read_documents(Path(plan.data).expanduser())
    tokenizer = load_tokenizer(plan.tokenizer or plan.model)
    blocks = tokenize_to_blocks(documents, tokenizer, plan.seq_len)
    if int(blocks.max()) >= config.vocab_size:
        raise ValueError(
            f"tokenizer {plan.tokenizer or plan.model!r} produced id {int(blocks.max())} but the "
            f"model's vocab_size is {config.vocab_size}; use the model's own tokenizer"
        )
    return BatchSource(
        plan, config.vocab_size, _mask_token_id(config, tokenizer.mask_token_id), blocks
    )
