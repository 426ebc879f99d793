"""A tenant's own model, end to end on the platform as production runs it (issue 34): a tiny Llama and
a tiny Qwen3, built here, are uploaded through the SDK, trained by jobs on vLLM + Megatron (TP=2)
and on the torch backends (the engine on a Ray cluster, a Celery worker, daphne), and their final
weights downloaded as one archive; unpacked, each folder loads with ``transformers`` as it is and
generates, and holds exactly the weights the engine exported. The jobs of the two architectures run
at once, each architecture on a vLLM engine of its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.platform import live

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.django_db(transaction=True)]

GRPO = {"prompts_per_step": 4, "samples_per_prompt": 4, "updates_per_step": 1, "eval_every": 2, "eval_size": 8,
        "max_tokens": 6}
BACKENDS = ({"rollout": "vllm", "trainer": "megatron", "tp": 2}, {"rollout": "torch", "trainer": "torch"})


def test_upload_train_and_download_a_llama_and_a_qwen3_on_vllm_megatron_tp2_and_torch(engine_home, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accounts.services import organization_create, token_create
    from jobs.models import Job
    from plexrl_client import ServiceClient
    from tests.modelfiles import build_tiny_model
    from tests.platform.factories import UserFactory

    owner = UserFactory(username="byo")
    organization = organization_create(name="Byo", owner=owner)
    _, token = token_create(user=owner, organization=organization, name="test")
    # two vLLM engines (one per architecture), the Megatron TP=2 pair, the torch pair
    with live.running_platform(engine_home, tmp_path, devices=6) as platform:
        client = ServiceClient(platform.url, token, timeout=60)
        jobs = {}
        for arch, tied in (("llama", False), ("qwen3", True)):
            model = client.upload_model(build_tiny_model(tmp_path / arch, arch, tied=tied, seed=2), f"tiny-{arch}")
            assert model["architecture"] == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
            for backends in BACKENDS:
                spec = {"task": "arith", "model": f"tiny-{arch}", "steps": 2, "seed": 1, "grpo": GRPO, **backends}
                jobs[(arch, backends["trainer"])] = client.submit(spec, name=f"{arch} on {backends['trainer']}")["id"]

        deadline = time.monotonic() + 780
        while time.monotonic() < deadline and not all(
                client.job(i)["state"] in ("succeeded", "failed", "cancelled") for i in jobs.values()):
            for process in platform.processes:
                process.check_alive()
            time.sleep(3)
        states = {key: (client.job(i)["state"], client.job(i)["state_reason"]) for key, i in jobs.items()}
        assert all(state == "succeeded" for state, _ in states.values()), states
        platform.wait_until(lambda: all(Job.objects.get(pk=i).events_complete for i in jobs.values()), 120,
                            "the jobs' events were not all ingested")

        # the two architectures ran at once, each on a vLLM engine of its own
        rows = {key: Job.objects.get(pk=i) for key, i in jobs.items()}
        llama, qwen3 = rows[("llama", "megatron")], rows[("qwen3", "megatron")]
        assert max(llama.started_at, qwen3.started_at) < min(llama.finished_at, qwen3.finished_at)
        rollout = {key: set(row.usage.filter(fn="generate").values_list("wpg", flat=True)) for key, row in rows.items()}
        assert rollout[("llama", "megatron")]
        assert not rollout[("llama", "megatron")] & rollout[("qwen3", "megatron")]

        for (arch, trainer), job_id in jobs.items():
            folder = Path(client.download_artifact(job_id, tmp_path / "downloads" / f"{arch}-{trainer}"))
            exported = Path(next(e.data["path"] for e in Job.objects.get(pk=job_id).events.filter(kind="artifact")))
            got, want = load_file(folder / "model.safetensors"), load_file(exported / "model.safetensors")
            assert got.keys() == want.keys()
            assert all(torch.equal(got[name], want[name]) for name in want)
            model = AutoModelForCausalLM.from_pretrained(folder).eval()
            assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
            tokenizer = AutoTokenizer.from_pretrained(folder)
            prompt = tokenizer("12+7=", return_tensors="pt")
            out = model.generate(**prompt, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            assert out.shape[1] > prompt["input_ids"].shape[1]
