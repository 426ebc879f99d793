"""Token sampling and per-token log-probs for Hugging Face causal LMs (the torch backend's core).

Log-probs returned for sampled tokens are those of the model's own distribution (temperature 1),
the same quantity ``sequence_logprobs`` computes on a full forward pass, so rollout log-probs,
old-policy log-probs and trainer log-probs are directly comparable.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.api import Completion, SamplingParams


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


@torch.no_grad()
def sample(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    temperature: float,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator | None,
    n: int = 1,
    stop_ids: Sequence[int] = (),
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample ``n`` completions per prompt (greedy when ``temperature == 0``), prompt-major.

    Each prompt is prefilled once and its KV cache repeated ``n`` times; a row that stops leaves the
    batch (and the cache), so decoding costs what the live rows need. Returns token ids (ending
    in EOS or one of ``stop_ids`` unless ``max_tokens`` was reached) and each token's log-prob. The
    model may sit on any device; tokens are drawn on the CPU (with ``generator``), so a seed means
    the same everywhere.
    """
    stops = torch.as_tensor(sorted({eos_id, *stop_ids}), dtype=torch.long)
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1, :]
    next_pos = position[:, -1:] + 1
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits = logits.repeat_interleave(n, dim=0)
        mask = mask.repeat_interleave(n, dim=0)
        next_pos = next_pos.repeat_interleave(n, dim=0)
    batch = logits.shape[0]
    tokens = torch.full((batch, max_tokens), pad_id, dtype=torch.long)
    logps = torch.zeros((batch, max_tokens), dtype=torch.float32)
    lengths = torch.zeros(batch, dtype=torch.long)
    live = torch.arange(batch)  # the rows still decoding; the model's batch holds only these
    for t in range(max_tokens):
        logits = logits.float().cpu()
        logp = torch.log_softmax(logits, dim=-1)
        if temperature == 0:
            tok = logits.argmax(dim=-1)
        else:
            # one draw for every row of the batch, finished ones too (a dummy distribution), so a
            # row's sample never depends on when the others stopped
            probs = torch.zeros((batch, logits.shape[-1]))
            probs[:, 0] = 1.0
            probs[live] = torch.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)[live]
        tokens[live, t] = tok
        logps[live, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
        lengths[live] += 1
        going = ~torch.isin(tok, stops)
        if t == max_tokens - 1 or not bool(going.any()):
            break
        if not bool(going.all()):  # drop finished rows from the batch and the KV cache
            keep = going.nonzero().squeeze(-1)
            live, tok, mask, next_pos = live[keep], tok[keep], mask[keep.to(device)], next_pos[keep.to(device)]
            cache.batch_select_indices(keep.to(device))
        mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=device)], dim=1)
        out = model(
            input_ids=tok.to(device)[:, None],
            attention_mask=mask,
            position_ids=next_pos,
            past_key_values=cache,
            use_cache=True,
        )
        cache, logits = out.past_key_values, out.logits[:, -1, :]
        next_pos = next_pos + 1
    lens = lengths.tolist()
    return (
        [tokens[i, : lens[i]].tolist() for i in range(batch)],
        [logps[i, : lens[i]].tolist() for i in range(batch)],
    )


def generate(model, tokenizer, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Completion]:
    """``sample`` under the API's terms: seeded by ``sampling.seed``, texts decoded, prompt-major."""
    ids, logps = sample(
        model, prompts, n=sampling.n, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
        eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        generator=torch.Generator().manual_seed(sampling.seed), stop_ids=sampling.stop_token_ids,
    )
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return [
        Completion(prompt_index=i // sampling.n, token_ids=t, text=s, logprobs=lp)
        for i, (t, s, lp) in enumerate(zip(ids, texts, logps, strict=True))
    ]


def sequence_logprobs(
    model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token given its prompt, on one padded forward pass.

    Returns ``(logprobs [B, T], mask [B, T])`` on the CPU (where losses meet the batch's tensors;
    gradients flow back to the model's device) where T is the longest completion; sequences are
    right-padded so completion token j of every row sits at column j.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        attn[i, : len(s)] = 1
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float()
    logp_all = torch.log_softmax(logits[:, :-1, :], dim=-1)  # on the model's device: [B, S, V] is large
    targets = ids[:, 1:]
    token_logp = logp_all.gather(-1, targets.to(device)[..., None]).squeeze(-1).cpu()  # [B, width-1]
    t_max = max(len(c) for c in completions)
    prompt_lens = torch.as_tensor([len(p) for p in prompts], dtype=torch.long)
    comp_lens = torch.as_tensor([len(c) for c in completions], dtype=torch.long)
    cols = torch.arange(t_max)
    # completion token j of row i is predicted at position len(prompt_i) - 1 + j
    index = (prompt_lens[:, None] - 1 + cols[None, :]).clamp(max=token_logp.shape[1] - 1)
    mask = cols[None, :] < comp_lens[:, None]
    out = token_logp.gather(1, index) * mask
    return out, mask


def pack_rows(lengths: Sequence[int]) -> tuple[list[tuple[int, int]], int]:
    """Place items of the given lengths into rows as long as the longest item, best fit, longest
    first: returns each item's ``(row, offset)`` and the number of rows. Deterministic (ties keep
    input order); rows are filled in the order they are opened."""
    capacity = max(lengths)
    by_space: list[list[int]] = [[] for _ in range(capacity + 1)]  # rows by the room left in them
    room: list[int] = []
    place: list[tuple[int, int]] = [(0, 0)] * len(lengths)
    for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[item]
        space = next((s for s in range(n, capacity + 1) if by_space[s]), None)
        if space is None:
            row = len(room)
            room.append(capacity)
        else:
            row = by_space[space].pop(0)
        place[item] = (row, capacity - room[row])
        room[row] -= n
        by_space[room[row]].append(row)
    return place, len(room)


def shared_prompt_logprobs(
    model, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_logprobs`` with each distinct prompt computed once for all its completions.

    GRPO's rows come in groups that share a prompt (``samples_per_prompt`` answers to one problem),
    and on a small model the prompt is most of every row. Rows with the same prompt form one pack,
    ``prompt, completion_1, completion_2, ...``, in which each completion sees the prompt and its
    own earlier tokens only, with positions restarting after the prompt for every completion. Packs
    are then placed side by side in sequences as long as the longest pack (``pack_rows``), each
    seeing only itself, so the batch holds little padding: packs differ in length by up to the
    number of their completions times the longest one. Each token's log-prob is the one an unpacked
    row gives (to float rounding). The model must take a 4-D boolean ``attention_mask`` and
    ``position_ids`` (transformers' causal LMs do). Same return value as ``sequence_logprobs``:
    ``[B, T]`` log-probs and mask, row order kept.
    """
    packs: dict[tuple[int, ...], list[int]] = {}
    for row, prompt in enumerate(prompts):
        packs.setdefault(tuple(prompt), []).append(row)
    comp_lens = [len(c) for c in completions]
    t_max = max(comp_lens)
    pack_lens = [len(p) + sum(comp_lens[r] for r in members) for p, members in packs.items()]
    place, n_seqs = pack_rows(pack_lens)
    width = max(pack_lens)
    # Built as flat Python lists and turned into tensors once: per-row tensors cost more than the
    # model's forward pass on the small rows GRPO trains.
    ids = [[pad_id] * width for _ in range(n_seqs)]
    positions = [[0] * width for _ in range(n_seqs)]
    segments = [[-1] * width for _ in range(n_seqs)]  # which pack a token belongs to; -1: padding
    owners = [[-2] * width for _ in range(n_seqs)]  # -1: a prompt token, else the completion's row
    row_tokens: list[tuple[int, list[int], list[int]]] = [(0, [], [])] * len(prompts)
    for k, (prompt, members) in enumerate(packs.items()):
        seq_i, at = place[k]
        seq, pos, owner = list(prompt), list(range(len(prompt))), [-1] * len(prompt)
        for row in members:
            comp = list(completions[row])
            start = at + len(seq)
            # token 0 is predicted at the prompt's last position, token j at the row's token j - 1
            row_tokens[row] = (seq_i, [at + len(prompt) - 1, *range(start, start + len(comp) - 1)], comp)
            seq += comp
            pos += range(len(prompt), len(prompt) + len(comp))
            owner += [row] * len(comp)
        end = at + len(seq)
        ids[seq_i][at:end], positions[seq_i][at:end], owners[seq_i][at:end] = seq, pos, owner
        segments[seq_i][at:end] = [k] * len(seq)
    flat_seq, flat_position, flat_target = [], [], []  # per completion token, rows in order
    for (seq_i, where, comp), n in zip(row_tokens, comp_lens, strict=True):
        pad = t_max - n
        flat_seq += [seq_i] * n + [0] * pad
        flat_position += where[:n] + [0] * pad  # an empty completion has no token to predict
        flat_target += comp + [0] * pad
    rows = len(prompts)
    seq_of = torch.tensor(flat_seq, dtype=torch.long).view(rows, t_max)  # which packed sequence
    position_of = torch.tensor(flat_position, dtype=torch.long).view(rows, t_max)  # predicts token j
    targets = torch.tensor(flat_target, dtype=torch.long).view(rows, t_max)
    own = torch.tensor(owners, dtype=torch.long)
    seg = torch.tensor(segments, dtype=torch.long)
    query, key = own[:, :, None], own[:, None, :]
    causal = torch.ones((width, width), dtype=torch.bool).tril()[None]
    allowed = causal & (seg[:, :, None] == seg[:, None, :]) & ((key == -1) | (key == query)) & (key != -2)
    allowed |= torch.eye(width, dtype=torch.bool)[None] & (query == -2)  # padding sees itself (no empty row)
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor(ids, dtype=torch.long).to(device), attention_mask=allowed[:, None].to(device),
                   position_ids=torch.tensor(positions, dtype=torch.long).to(device)).logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)  # on the model's device: [K, W, V] is large
    mask = torch.arange(t_max)[None, :] < torch.as_tensor(comp_lens)[:, None]
    out = logp_all[seq_of.to(device), position_of.to(device), targets.to(device)].cpu() * mask
    return out, mask
