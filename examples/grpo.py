"""GRPO written against the PlexRL SDK, with a reward of its own: your loop and your reward run
here; generation and training run on the platform, shared with everyone else's jobs.

    python examples/grpo.py --url http://127.0.0.1:8000 --token $PLEXRL_TOKEN --steps 40

Sums of two numbers ("12+7="), rewarded by this file: 1 for the right sum, else up to 0.5 the closer
it is. Held out (64 problems): the samples' mean reward and greedy answers' exact-match accuracy,
before and after. Needs only the SDK (``pip install ./clients/python``).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys

from plexrl_client import ServiceClient


def problems(seed: int, count: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 49), rng.randint(0, 49)) for _ in range(count)]
    return [(f"{a}+{b}=", a + b) for a, b in pairs]


def reward(text: str, answer: int) -> float:
    digits = re.match(r"\s*(\d+)", text)
    if digits is None:
        return 0.0
    value = int(digits.group(1))
    return 1.0 if value == answer else 0.5 * max(0.0, 1.0 - abs(value - answer) / max(answer, 10))


def advantages(rewards: list[float], group: int) -> list[float]:
    out = []
    for i in range(0, len(rewards), group):
        chunk = rewards[i:i + group]
        mean, spread = statistics.fmean(chunk), statistics.pstdev(chunk)
        out += [(r - mean) / (spread + 1e-6) for r in chunk]
    return out


def held_out(session, tests: list[tuple[str, int]]) -> tuple[float, float]:
    """On problems it never trains on: the mean reward of the policy's samples (fixed seed), and
    the fraction its greedy answers get exactly right."""
    out = session.generate(texts=[p for p, _ in tests], n=4, temperature=1.0, max_tokens=4, seed=99)
    greedy = session.generate(texts=[p for p, _ in tests], temperature=0.0, max_tokens=4)
    return (statistics.fmean(reward(c.text, tests[c.prompt_index][1]) for c in out.completions),
            statistics.fmean(reward(c.text, tests[c.prompt_index][1]) == 1.0 for c in greedy.completions))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=10, help="steps of learning-rate warm-up")
    parser.add_argument("--updates", type=int, default=8, help="minibatches a step, an optimizer step each")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="torch", help="rollout and trainer backend")
    args = parser.parse_args()

    client = ServiceClient(args.url, args.token)
    tests = problems(10_000 + args.seed, 64)
    with client.create_session(args.model, rollout=args.backend, trainer=args.backend, name="sdk-grpo",
                               optimizer={"lr": args.lr, "warmup_steps": args.warmup * args.updates,  # cosine to 0
                                          "decay_steps": args.steps * args.updates}) as session:
        before, accuracy_before = held_out(session, tests)
        for step in range(1, args.steps + 1):
            batch = problems(args.seed * 1_000_003 + step, args.prompts)
            out = session.generate(texts=[p for p, _ in batch], n=args.group, temperature=args.temperature,
                                   max_tokens=4, seed=step)
            rewards = [reward(c.text, batch[c.prompt_index][1]) for c in out.completions]
            adv, rows = advantages(rewards, args.group), out.completions
            for part in (range(u, len(rows), args.updates) for u in range(args.updates)):  # minibatches
                loss = session.forward_backward(
                    prompts=[out.prompts[rows[i].prompt_index] for i in part], loss="grpo",
                    completions=[rows[i].token_ids for i in part], advantages=[adv[i] for i in part],
                    old_logprobs=[rows[i].logprobs for i in part])
                session.optim_step_async()  # pipelined: the next calls queue behind it, in order
            session.sync_weights_async()
            session.log_metrics(step, reward_mean=statistics.fmean(rewards), loss=loss.loss)
            print(f"step {step}: reward {statistics.fmean(rewards):.3f}, loss {loss.loss:.4f}", file=sys.stderr)
        after, accuracy_after = held_out(session, tests)
        session.log_metrics(args.steps + 1, held_out_reward_before=before, held_out_reward_after=after)
    print(json.dumps({"session": session.id, "held_out_reward_before": before, "held_out_reward_after": after,
                      "held_out_accuracy_before": accuracy_before, "held_out_accuracy_after": accuracy_after}))


if __name__ == "__main__":
    main()
