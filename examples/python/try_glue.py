"""One training step's worth of a glue, against a running `legato rl serve`.

    python3 examples/python/try_glue.py slime|skyrl|verl --url http://127.0.0.1:8300 --run-dir runs/serve \\
        --weights-url http://127.0.0.1:30000/v1

Before pointing a trainer at legato: drives the glue as the trainer does,
with stand-ins for the trainer's parts that need GPUs (the weight update does
nothing), and checks what the glue made against the trainer's interface
(descriptors/, read from its source). In order: the weight sync before
training (legato paused and drained, then serving the first version with
``--weights-url`` as base_urls: where the trainer serves its weights), one
rollout of ``--groups`` groups of ``--n`` attempts, the sync after the step.
Prints what it did; exits 1 when the output does not fit the interface.
Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import types
from typing import Any, List
from urllib.parse import urlsplit

import glue_conform as gc
import skyrl_glue
import slime_glue
import verl_glue
from legato_client import Client


def _versions(groups: List[Any]) -> List[str]:
    return sorted({s["policy_version"] for g in groups for a in g.attempts for s in a.steps})


def try_slime(client: Client, a: argparse.Namespace, task: dict) -> List[str]:
    u = urlsplit(a.weights_url)
    args = types.SimpleNamespace(legato_url=a.url, legato_run_dir=a.run_dir, rollout_batch_size=a.groups,
                                 n_samples_per_prompt=a.n, start_rollout_id=0, legato_layout=a.layout,
                                 sglang_router_ip=u.hostname, sglang_router_port=u.port)
    actor_model = types.SimpleNamespace(update_weights=lambda: None)  # slime's RayTrainGroup
    sync = slime_glue.install_weight_sync(actor_model, args, client=client)
    actor_model.update_weights()  # train.py: once before the loop

    class DataSource:
        def get_samples(self, num: int) -> List[List[Any]]:
            return [[slime_glue.LegatoSample(group_index=i, index=i * a.n + j, metadata={"legato_task": task})
                     for j in range(a.n)] for i in range(num)]

    out = slime_glue.generate_rollout(args, 0, DataSource(), evaluation=False)
    actor_model.update_weights()  # after the rollout trained
    desc = gc.load("slime")
    probs = gc.check_slime(out.samples, desc)
    flat = [s for g in out.samples for e in g for s in (e if isinstance(e, list) else [e])]
    print(f"slime: {len(out.samples)} groups, {len(flat)} samples, {sum(not s.remove_sample for s in flat)} trained; "
          f"weight versions {sorted({v for s in flat for v in s.weight_versions})}; synced {sync.synced} "
          f"on {sync.base_urls}")
    return probs


def try_skyrl(client: Client, a: argparse.Namespace, task: dict) -> List[str]:
    router = a.weights_url.rstrip("/").removesuffix("/v1")

    class Dispatch:
        async def save_weights_for_sampler(self) -> None:
            pass  # the broadcast to the engines

    class Trainer:  # the part of SkyRL's (fully-async) trainer the sync wraps
        def __init__(self) -> None:
            self.dispatch, self.global_step = Dispatch(), 0
            self.inference_engine_client = types.SimpleNamespace(proxy_url=router)

        def init_weight_sync_state(self) -> None:
            pass

    trainer = skyrl_glue.legato_trainer(Trainer, client)()
    gen = skyrl_glue.LegatoGenerator(client, layout=a.layout)

    async def step() -> Any:
        trainer.init_weight_sync_state()
        await trainer.dispatch.save_weights_for_sampler()
        trainer.global_step += 1
        batch = gc.skyrl_batch(a.groups, skyrl_glue.TrajectoryID,
                               types.SimpleNamespace(global_step=trainer.global_step, training_phase="train"),
                               size=a.n, task=task)
        out = await gen.generate(batch)
        await trainer.dispatch.save_weights_for_sampler()
        return batch, out

    batch, out = asyncio.run(step())
    probs = gc.check_skyrl(out, len(batch["prompts"]), a.layout == "step", gc.load("skyrl"))
    print(f"skyrl: {len(gen.last_groups)} groups, {len(out['response_ids'])} rows ({a.layout} layout), "
          f"{sum(sum(m) > 0 for m in out['loss_masks'])} trained; versions {_versions(gen.last_groups)}; "
          f"synced {trainer.legato_sync.synced} on {trainer.legato_sync.base_urls}")
    return probs


def try_verl(client: Client, a: argparse.Namespace, task: dict) -> List[str]:
    addr = urlsplit(a.weights_url).netloc
    trainer = types.SimpleNamespace(global_steps=0, checkpoint_manager=types.SimpleNamespace(update_weights=lambda: None),
                                    async_rollout_manager=types.SimpleNamespace(server_addresses=[addr]))
    sync = verl_glue.install_weight_sync(trainer, client)
    trainer.checkpoint_manager.update_weights()  # fit(): before the first step
    trainer.global_steps = 1
    loop = verl_glue.LegatoAgentLoop(client=client, n=a.n, response_length=None)

    async def rollout() -> List[Any]:
        runs = [loop.run({}, uid=f"try-glue-{g}", extra_info={"legato_task": task}, raw_prompt=[])
                for g in range(a.groups) for _ in range(a.n)]
        return await asyncio.gather(*runs)

    outs = asyncio.run(rollout())
    trainer.checkpoint_manager.update_weights()  # after the actor update
    probs = gc.check_verl(outs, gc.load("verl"))
    versions = sorted({v for o in outs for v in o.extra_fields["legato"]["policy_versions"]})
    print(f"verl: {len(outs)} agent loop outputs, {sum(any(o.response_mask) for o in outs)} trained, "
          f"{sum(len(o.multi_modal_data.get('images') or []) for o in outs)} images; versions {versions}; "
          f"synced {sync.synced} on {sync.base_urls}")
    return probs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=gc.FRAMEWORKS)
    ap.add_argument("--url", default="http://127.0.0.1:8300", help="legato rl serve's address")
    ap.add_argument("--run-dir", default=None, help="its run directory (for its token)")
    ap.add_argument("--weights-url", required=True,
                    help="where the trainer serves its weights: an OpenAI API root (..../v1)")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--n", type=int, default=4, help="attempts per group (the trainer's samples per prompt)")
    ap.add_argument("--layout", choices=("trajectory", "step"), default="trajectory", help="slime and SkyRL")
    ap.add_argument("--task", default=json.dumps(gc.TASK), help="a tasks-file entry, as JSON")
    a = ap.parse_args()
    if not a.weights_url.rstrip("/").endswith("/v1"):
        ap.error(f"--weights-url {a.weights_url}: an OpenAI API root, ending in /v1")
    client = Client(a.url, run_dir=a.run_dir)
    client.wait_ready()
    task = json.loads(a.task)
    probs = {"slime": try_slime, "skyrl": try_skyrl, "verl": try_verl}[a.framework](client, a, task)
    d = gc.load(a.framework)
    if probs:
        print(f"{a.framework}: does NOT fit descriptors/{a.framework}.json ({d['repository']} {d['commit'][:8]}):")
        for p in probs[:20]:
            print(f"  {p}")
        return 1
    print(f"{a.framework}: fits descriptors/{a.framework}.json ({d['repository']} {d['commit'][:8]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
