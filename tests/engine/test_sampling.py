"""Token sampling and sequence log-probs on a tiny random Qwen2 (fixture ``tiny_qwen``).

Three quantities must agree for GRPO's ratios to mean anything: the log-probs ``sample`` returns
while decoding with a KV cache and left padding, ``sequence_logprobs`` on one right-padded forward
pass, and transformers' own greedy decoding.
"""

import pytest
import torch

from engine.workers.sampling import left_pad, pack_rows, sample, sequence_logprobs, shared_prompt_logprobs

PAD, EOS = 0, 1
# Prompts of different lengths, no special tokens inside.
PROMPTS = [[5, 9, 2], [7], [3, 4, 5, 6, 7, 8, 9, 10], [30, 31], [12, 20, 12, 20, 12]]


def _sample(model, prompts, *, temperature=1.0, max_tokens=8, seed=0):
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return sample(model, prompts, max_tokens=max_tokens, temperature=temperature,
                  eos_id=EOS, pad_id=PAD, generator=gen)


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_sampled_logprobs_equal_a_full_forward_pass(tiny_qwen, temperature):
    prompts = PROMPTS * 3
    tokens, logps = _sample(tiny_qwen, prompts, temperature=temperature)
    assert [len(t) for t in tokens] == [len(lp) for lp in logps]
    assert all(tokens), "every completion has at least one token"
    with torch.no_grad():
        ref, mask = sequence_logprobs(tiny_qwen, prompts, tokens, PAD)
    assert mask.tolist() == [[j < len(t) for j in range(mask.shape[1])] for t in tokens]
    got = torch.zeros_like(ref)
    for i, lp in enumerate(logps):
        got[i, : len(lp)] = torch.tensor(lp)
    # log-probs are always the model's own (temperature 1), whatever temperature sampled them
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (ref[~mask] == 0).all()


def test_completions_end_at_eos_or_max_tokens(tiny_qwen):
    tokens, _ = _sample(tiny_qwen, PROMPTS * 4, max_tokens=6)
    for t in tokens:
        assert 1 <= len(t) <= 6
        assert EOS not in t[:-1], "nothing is sampled after EOS"
        assert t[-1] == EOS or len(t) == 6
    assert any(t[-1] == EOS for t in tokens), "the fixture model should stop sometimes"
    assert any(len(t) == 6 and t[-1] != EOS for t in tokens), "and run to max_tokens sometimes"


def test_greedy_matches_transformers_generate(tiny_qwen):
    for prompt in PROMPTS:
        tokens, _ = _sample(tiny_qwen, [prompt], temperature=0.0, max_tokens=8, seed=None)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = tiny_qwen.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8,
                eos_token_id=EOS, pad_token_id=PAD,
            )
        expected = out[0, len(prompt):].tolist()
        if EOS in expected:  # generate stops the row at EOS (no padding with one row)
            expected = expected[: expected.index(EOS) + 1]
        assert tokens[0] == expected, prompt


def test_left_padding_does_not_change_results(tiny_qwen):
    short = [7, 3]
    longer = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25]]
    alone_tokens, alone_logps = _sample(tiny_qwen, [short], temperature=0.0)
    batch_tokens, batch_logps = _sample(tiny_qwen, [*longer, short], temperature=0.0)
    assert batch_tokens[-1] == alone_tokens[0]
    torch.testing.assert_close(torch.tensor(batch_logps[-1]), torch.tensor(alone_logps[0]), atol=1e-5, rtol=0)
    # and the longer prompts get what they get alone, too
    for i, prompt in enumerate(longer):
        assert batch_tokens[i] == _sample(tiny_qwen, [prompt], temperature=0.0)[0][0]


def test_same_seed_same_samples(tiny_qwen):
    a = _sample(tiny_qwen, PROMPTS * 4, seed=11)
    b = _sample(tiny_qwen, PROMPTS * 4, seed=11)
    c = _sample(tiny_qwen, PROMPTS * 4, seed=12)
    assert a == b
    assert a[0] != c[0]


def test_temperature_zero_ignores_the_generator(tiny_qwen):
    assert _sample(tiny_qwen, PROMPTS, temperature=0.0, seed=1) == _sample(tiny_qwen, PROMPTS, temperature=0.0, seed=2)


def test_sequence_logprobs_layout(tiny_qwen):
    prompts = [[5, 9, 2], [7]]
    completions = [[4], [8, 6, 1]]
    with torch.no_grad():
        logp, mask = sequence_logprobs(tiny_qwen, prompts, completions, PAD)
        assert logp.shape == mask.shape == (2, 3)
        assert mask.tolist() == [[True, False, False], [True, True, True]]
        # column j of row i is log p(completion[i][j] | prompt + completion[:j]), row by row alone
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            full = torch.tensor([p + c])
            logits = tiny_qwen(input_ids=full).logits[0].float().log_softmax(-1)
            expected = torch.stack([logits[len(p) - 1 + j, tok] for j, tok in enumerate(c)])
            torch.testing.assert_close(logp[i, : len(c)], expected, atol=1e-5, rtol=0)
    assert (logp <= 0).all()


def test_n_samples_share_one_prefill_and_equal_repeated_prompts(tiny_qwen):
    """``n`` completions per prompt (prefill once, cache repeated) equal sampling each prompt n times."""
    n = 3
    shared = sample(tiny_qwen, PROMPTS, n=n, max_tokens=8, temperature=1.0, eos_id=EOS, pad_id=PAD,
                    generator=torch.Generator().manual_seed(5))
    repeated = sample(tiny_qwen, [p for p in PROMPTS for _ in range(n)], max_tokens=8, temperature=1.0,
                      eos_id=EOS, pad_id=PAD, generator=torch.Generator().manual_seed(5))
    assert shared[0] == repeated[0]
    for a, b in zip(shared[1], repeated[1], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)


def test_stop_tokens_end_a_sample_and_change_nothing_before_them(tiny_qwen):
    """A stop token ends a sample as EOS does (kept as its last token); what came before, and every
    other sample, is what sampling without it draws with the same seed."""
    free_tokens, free_logps = _sample(tiny_qwen, PROMPTS * 4, seed=3)
    counts = torch.bincount(torch.tensor([t for s in free_tokens for t in s[:-1]]), minlength=32)
    counts[EOS] = 0
    stop = int(counts.argmax())  # the token most often sampled mid-answer
    tokens, logps = sample(tiny_qwen, PROMPTS * 4, max_tokens=8, temperature=1.0, eos_id=EOS, pad_id=PAD,
                           generator=torch.Generator().manual_seed(3), stop_ids=[stop])
    cut = 0
    for free, free_lp, got, got_lp in zip(free_tokens, free_logps, tokens, logps, strict=True):
        end = free.index(stop) + 1 if stop in free else len(free)
        cut += end < len(free)
        assert got == free[:end]
        # rows that stop leave the batch, so later steps run on other batch shapes: the same values
        # to float rounding (as for the shared prompt above), bit-equal only with one BLAS thread
        torch.testing.assert_close(torch.tensor(got_lp), torch.tensor(free_lp[:end]), atol=1e-5, rtol=0)
    assert cut > 0, "the stop token should cut some samples short"


def test_shared_prompt_forward_equals_one_row_per_completion(tiny_qwen):
    """Rows sharing a prompt, packed into one sequence under a block mask, give the log-probs and
    the gradients of the plain right-padded forward pass: rows in any order, prompts repeated a
    different number of times, completions of different lengths (padding inside and between packs)."""
    prompts = [p for p, times in zip(PROMPTS, (6, 1, 4, 1, 3), strict=True) for _ in range(times)]
    tokens, _ = _sample(tiny_qwen, prompts, temperature=1.0, max_tokens=6)
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(3)).tolist()
    prompts, tokens = [prompts[i] for i in order], [tokens[i] for i in order]
    assert len(set(map(len, tokens))) > 1, "completions of several lengths"

    def run(fn):
        tiny_qwen.zero_grad(set_to_none=True)
        logp, mask = fn(tiny_qwen, prompts, tokens, PAD)
        (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum().backward()
        return logp.detach(), mask, [p.grad.clone() for p in tiny_qwen.parameters()]

    ref, ref_mask, ref_grads = run(sequence_logprobs)
    widths = []
    forward = tiny_qwen.forward

    def recording(*args, **kwargs):
        widths.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    tiny_qwen.forward = recording
    try:
        got, mask, grads = run(shared_prompt_logprobs)
    finally:
        del tiny_qwen.forward
    # the short packs shared sequences with others (fewer sequences than distinct prompts)
    assert len(widths) == 1
    assert widths[0][0] < len(set(map(tuple, prompts)))
    assert torch.equal(mask, ref_mask)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got[~mask] == 0).all()
    for g, r in zip(grads, ref_grads, strict=True):  # fp32 sums in another order: relative 1e-5
        assert float((g - r).norm() / r.norm()) <= 1e-5


def test_pack_rows_fits_every_item_once_without_overlap():
    lengths = [7, 3, 3, 9, 1, 5, 2, 4, 6, 9, 2, 1]
    place, rows = pack_rows(lengths)
    capacity = max(lengths)
    used: dict[int, set[int]] = {}
    for (row, at), n in zip(place, lengths, strict=True):
        cells = set(range(at, at + n))
        assert at + n <= capacity
        assert not used.setdefault(row, set()) & cells
        used[row] |= cells
    assert rows == len(used) == -(-sum(lengths) // capacity)  # as few rows as the tokens need, here
    assert pack_rows(lengths) == (place, rows)  # deterministic
    assert pack_rows([4]) == ([(0, 0)], 1)
