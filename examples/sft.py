"""Supervised fine-tuning written against the PlexRL SDK: the loop runs here, the model trains on
the platform. The data is made here too: sums of two numbers and their answers.

    python examples/sft.py --url http://127.0.0.1:8000 --token $PLEXRL_TOKEN --steps 30

Each step trains on a batch of (prompt, answer) pairs with the cross-entropy loss on the answer's
tokens; before and after, the loss on held-out problems is measured (per answer token).
Needs only the SDK (``pip install ./clients/python``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys

from plexrl_client import ServiceClient


def problems(seed: int, count: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 49), rng.randint(0, 49)) for _ in range(count)]
    return [(f"{a}+{b}=", str(a + b)) for a, b in pairs]


def held_out_loss(session, tests: list[tuple[str, str]]) -> float:
    """Mean negative log-likelihood per answer token on problems it never trains on."""
    prompts = session.tokenize([p for p, _ in tests], special=True)
    answers = session.tokenize([a for _, a in tests], eos=True)
    logprobs = session.forward(prompts, answers)
    return -statistics.fmean(x for row in logprobs for x in row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="torch", help="rollout and trainer backend")
    args = parser.parse_args()

    client = ServiceClient(args.url, args.token)
    tests = problems(10_000 + args.seed, 64)
    with client.create_session(args.model, rollout=args.backend, trainer=args.backend, name="sdk-sft",
                               optimizer={"lr": args.lr}) as session:
        before = held_out_loss(session, tests)
        for step in range(1, args.steps + 1):
            batch = problems(args.seed * 1_000_003 + step, args.batch)
            prompts = session.tokenize_async([p for p, _ in batch], special=True)  # as generate encodes them
            answers = session.tokenize([a for _, a in batch], eos=True)
            loss = session.forward_backward(prompts=prompts.result(), completions=answers, loss="cross_entropy")
            session.optim_step_async()
            session.sync_weights_async()
            session.log_metrics(step, loss=loss.loss)
            print(f"step {step}: loss {loss.loss:.4f}", file=sys.stderr)
        after = held_out_loss(session, tests)
        session.log_metrics(args.steps + 1, held_out_loss_before=before, held_out_loss_after=after)
    print(json.dumps({"session": session.id, "held_out_loss_before": before, "held_out_loss_after": after}))


if __name__ == "__main__":
    main()
