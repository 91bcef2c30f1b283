"""Glue between `legato rl serve` and SkyRL's trainer (NovaSky-AI/SkyRL).

Where it plugs in
-----------------
SkyRL's trainer gets its rollouts from a generator, an implementation of
``GeneratorInterface`` with one method,

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput

(skyrl/train/generators/base.py; before SkyRL's 2026 reorganisation the same
class lived in skyrl_train/generators/base.py of the skyrl-train package). An
experiment swaps its generator by overriding ``BasePPOExp.get_generator(self,
cfg, tokenizer, inference_engine_client)`` (skyrl/train/entrypoints/
main_base.py) to return ``LegatoGenerator(Client(url))``. The class below
subclasses SkyRL's ``GeneratorInterface`` when SkyRL is importable and a plain
object otherwise, so it is usable and testable without SkyRL.

The trainer builds the batch with ``prepare_generator_input``
(skyrl/train/generators/utils.py): every prompt row repeated
``n_samples_per_prompt`` times, ``trajectory_ids[i] = TrajectoryID(instance_id=
uid, repetition_id=k)``, and each data-set column other than the prompt and
env class in ``env_extras[i]``. ``LegatoGenerator`` groups the rows by
``instance_id`` (without ``trajectory_ids``: rows naming the same task form a
group) and submits one legato group per instance, of as many attempts as the
instance has rows, for the task in ``env_extras[i]["legato_task"]`` (a
tasks-file entry ``{"task_id", "domain"[, "config"]}``, or its JSON). The
prompt messages and sampling params of the batch are not used: legato's
harness builds each prompt from the task and the screen, and its own flags
(--temperature, --top-p, --max-tokens) set the sampling.

Multi-turn layout
-----------------
``layout="trajectory"`` (default) is the layout of SkyRL's own multi-turn
generators with ``generator.step_wise_trajectories=false``, the default:
``SkyRLGymGenerator.agent_loop`` and ``SkyRLVLMGymGenerator`` (the one SkyRL
uses for screenshots, which refuses step-wise) return one row per trajectory,
``prompt_token_ids`` the initial prompt and ``response_ids`` every generated
turn followed by the observation tokens the next turn's prompt adds, the
observations with loss mask 0 and logprob 0.0. Here the observation tokens
come from legato's next prompt (the new screenshot and text), so each step's
prompt must extend the previous prompt and response token for token: run
legato with ``--history contiguous``, or the glue raises ``NotContiguous``.
Rewards are per token, all 0 but the attempt's reward on the last generated
token (as ``_build_per_token_rewards`` places it).

``layout="step"`` matches ``generator.step_wise_trajectories=true``
(SkyRLGymGenerator.generate's step-wise branch; docs/content/docs/tutorials/
step-wise-training.mdx): one row per model call with its own prompt and
response, loss mask all 1, ``trajectory_ids`` repeated over the attempt's
steps (contiguous), ``is_last_step`` true on the last, the reward on the last
token of the last step. The trainer computes advantages on last steps and
broadcasts them (``RayPPOTrainer.compute_advantages_and_returns``). Works with
any history mode.

Masked attempts and advantages
------------------------------
SkyRL computes GRPO advantages itself from the rewards, per uid
(``compute_grpo_outcome_advantage`` in skyrl/backends/skyrl_train/utils/
ppo_utils.py, dividing by ``torch.std``, n - 1; legato divides by the
population std), so legato's ``advantage`` is passed along only in
``env_metrics``. Masked attempts (infrastructure failures, cancelled, skipped
or surplus attempts) never train:

* step layout: they get no rows at all, so SkyRL's GRPO sees exactly the
  attempts legato counted. A group with no attempt left keeps one
  placeholder row (loss mask all 0, reward 0), because the trainer expects
  every uid of the batch (``compute_prompt_mini_batch_boundaries``).
* trajectory layout: ``validate_generator_output`` wants one row per input
  row, so a masked attempt's row is a placeholder: loss mask all 0, logprobs
  0, borrowed tokens (a trainable sibling's first prompt and first generated
  token, else ``pad_token_id``), and as reward the mean reward of the group's
  trainable attempts, which leaves the group mean, and so the sign of every
  advantage, unchanged (the std, over more rows, is somewhat smaller).

An unmasked attempt whose steps lack prompt ids, exact generated ids or
aligned logprobs is treated like a masked one (``env_metrics`` row says why).

Weight sync and policy versions
-------------------------------
``generate()`` never changes legato's policy: under SkyRL's fully-async
trainer a generation worker prepares its batch at step k (its
``batch_metadata.global_step``) and may get its slot after step k+1 started
and new weights were synced, so a version stamped per call would name the
wrong weights. The version moves with the weights instead: ``legato_trainer(
trainer_cls, client)`` returns the trainer class with its weight save
(``dispatch.save_weights_for_sampler``, which the synchronous and the
fully-async trainer both call after each training step and once before the
first) wrapped in legato's pause and serve: ``POST /v1/policy`` paused with
drain (no model call in flight while the weights swap), then serving version
``version_prefix + str(global_step + 1)`` (default ``skyrl-step-``: the step
these weights generate for, as ``batch_metadata.global_step`` counts) with
``base_urls``, where the weights are served: the inference engines' router,
``inference_engine_client.proxy_url + "/v1"`` unless given. Each row's
``env_metrics["legato_policy_versions"]`` lists its steps' versions.

Images
------
Screenshots stay legato-image:// references. Each row's
``env_metrics["legato_images"]`` lists the sha256 of the images of its
prompt in order, as legato lists them (``step_images``: the last step's for
a trajectory row, which holds every screenshot of the attempt), and
``env_metrics["legato_image_spans"]`` where their placeholder tokens are in
the row's ``prompt_token_ids + response_ids``. A vision-language run passes
``vision_features(pngs) -> (pixel_values, image_grid_thw)`` (e.g. the model's
image processor), called with the PNGs in that order, and the output carries
``pixel_values`` and ``image_grid_thw`` per row, as SkyRLVLMGymGenerator's
does; without it both are None.

Read at NovaSky-AI/SkyRL a9564572: skyrl/train/generators/base.py,
skyrl/train/generators/skyrl_gym_generator.py, skyrl/train/generators/
skyrl_vlm_generator.py, skyrl/train/generators/utils.py, skyrl/train/utils/
trainer_utils.py (validate_generator_output), skyrl/train/trainer.py,
skyrl/train/dataset/dataset.py, skyrl/train/dataset/preprocess.py,
skyrl/train/entrypoints/main_base.py, skyrl/backends/skyrl_train/utils/
ppo_utils.py, docs/content/docs/tutorials/step-wise-training.mdx,
skyrl/train/fully_async_trainer.py, skyrl/backends/skyrl_train/workers/
worker_dispatch.py, skyrl/backends/skyrl_train/inference_servers/
remote_inference_client.py. descriptors/skyrl.json holds the interface as
read there; glue_conform.py checks this module's output against it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from legato_client import (Attempt, Client, Group, NotContiguous, WeightSync, concatenate_steps, step_images,
                           trainable, untrainable_reason)

try:  # SkyRL is optional; its current package, then the older skyrl-train one.
    from skyrl.train.generators.base import GeneratorInterface as _Base  # type: ignore
    from skyrl.train.generators.base import TrajectoryID  # type: ignore
except Exception:
    try:
        from skyrl_train.generators.base import GeneratorInterface as _Base  # type: ignore
        from skyrl_train.generators.base import TrajectoryID  # type: ignore
    except Exception:
        _Base = object

        @dataclasses.dataclass
        class TrajectoryID:  # type: ignore[no-redef]
            """Stand-in for SkyRL's TrajectoryID (same fields)."""

            instance_id: str
            repetition_id: int

            def to_string(self) -> str:
                return f"{self.instance_id}_{self.repetition_id}"

__all__ = ["LegatoGenerator", "TrajectoryID", "NotContiguous", "concatenate_steps", "untrainable_reason",
           "legato_trainer", "LegatoDispatch", "engine_base_urls"]


def _task(extras: Optional[Dict[str, Any]], key: str, row: int) -> Dict[str, Any]:
    task = (extras or {}).get(key)
    if isinstance(task, str):
        task = json.loads(task)
    if not isinstance(task, dict) or "task_id" not in task:
        raise ValueError(f"row {row}: env_extras has no {key!r} ({{\"task_id\", \"domain\"[, \"config\"]}})")
    return task


def _per_token_reward(n: int, reward: float) -> List[float]:
    r = [0.0] * n
    if n:
        r[-1] = float(reward)
    return r


@dataclasses.dataclass
class _Row:
    prompt_token_ids: List[int]
    response_ids: List[int]
    rewards: List[float]
    loss_mask: List[int]
    logprobs: List[float]
    stop_reason: str
    is_last_step: bool
    env_metrics: Dict[str, Any]
    images: List[Dict[str, Any]]  # step_images of the row's prompt, in order


class LegatoGenerator(_Base):  # type: ignore[misc, valid-type]
    """A SkyRL generator whose trajectories are legato attempts (see the
    module docstring)."""

    def __init__(self, client: Client, layout: str = "trajectory", task_key: str = "legato_task",
                 wait_timeout: float = 3600.0, pad_token_id: int = 0,
                 vision_features: Optional[Callable[[List[bytes]], Tuple[Any, Any]]] = None,
                 key_prefix: str = "") -> None:
        if layout not in ("trajectory", "step"):
            raise ValueError(f"layout {layout!r}: trajectory or step")
        self.client = client
        self.layout = layout
        self.task_key = task_key
        self.wait_timeout = wait_timeout
        self.pad_token_id = pad_token_id
        self.vision_features = vision_features
        self.key_prefix = key_prefix
        self.last_groups: List[Group] = []  # the legato groups of the last call, for inspection

    async def generate(self, input_batch: Dict[str, Any]) -> Dict[str, Any]:
        # The client blocks; keep the trainer's event loop free meanwhile.
        return await asyncio.to_thread(self.generate_blocking, input_batch)

    # -- the work --------------------------------------------------------------

    def _instances(self, input_batch: Dict[str, Any]) -> Dict[str, List[int]]:
        """The rows of each instance of the batch (one legato group), in
        repetition order, instances in order of first appearance."""
        n = len(input_batch["prompts"])
        extras = input_batch.get("env_extras") or [{} for _ in range(n)]
        tids = input_batch.get("trajectory_ids")
        if self.layout == "step" and tids is None:
            raise ValueError("layout='step' needs trajectory_ids in the input batch")
        groups: Dict[str, List[int]] = {}
        for i in range(n):
            key = tids[i].instance_id if tids is not None else json.dumps(_task(extras[i], self.task_key, i), sort_keys=True)
            groups.setdefault(key, []).append(i)
        if tids is not None:
            for rows in groups.values():
                rows.sort(key=lambda i: tids[i].repetition_id)
        return groups

    def generate_blocking(self, input_batch: Dict[str, Any]) -> Dict[str, Any]:
        n = len(input_batch["prompts"])
        extras = input_batch.get("env_extras") or [{} for _ in range(n)]
        meta = input_batch.get("batch_metadata")
        # The step the batch was prepared at names its groups' keys only: the
        # policy version is the weight sync's (legato_trainer), never this.
        step = getattr(meta, "global_step", None) if meta is not None else None
        groups = self._instances(input_batch)
        submitted = []
        for inst, rows in groups.items():
            k = f"{self.key_prefix}{step}-{inst}" if self.key_prefix else ""
            submitted.append(self.client.submit(_task(extras[rows[0]], self.task_key, rows[0]),
                                                group_size=len(rows), key=k))
        return self.output_for(input_batch, [self._wait(g.id) for g in submitted])

    def output_for(self, input_batch: Dict[str, Any], ended: Sequence[Group]) -> Dict[str, Any]:
        """The GeneratorOutput of ``input_batch`` from its ended legato
        groups, one per instance in order of first appearance."""
        n = len(input_batch["prompts"])
        tids = input_batch.get("trajectory_ids")
        groups = self._instances(input_batch)
        if len(ended) != len(groups):
            raise ValueError(f"{len(ended)} groups for the batch's {len(groups)} instances")
        per_row: Dict[int, List[_Row]] = {}
        for done, rows in zip(ended, groups.values()):
            for i, rs in zip(rows, self.group_rows(done, len(rows))):
                per_row[i] = rs
        self.last_groups = list(ended)

        out_rows: List[_Row] = []
        out_tids = []
        for i in range(n):
            for r in per_row[i]:
                out_rows.append(r)
                out_tids.append(tids[i] if tids is not None else None)
        return self._output(out_rows, out_tids if tids is not None else None, list(ended))

    def _wait(self, group_id: str) -> Group:
        deadline = time.monotonic() + self.wait_timeout
        while True:
            left = deadline - time.monotonic()
            g = self.client.group(group_id, wait=max(0.0, min(60.0, left)))
            if g.ended:
                return g
            if left <= 0:
                raise TimeoutError(f"legato group {group_id} still {g.state} after {self.wait_timeout:g}s")

    def group_rows(self, group: Group, slots: int) -> List[List[_Row]]:
        """The rows of each of ``slots`` trajectories of an ended group:
        slot k holds the k-th attempt that trains (attempt order), the rest
        hold placeholders (trajectory layout) or nothing (step layout)."""
        # Masked attempts (an infrastructure failure, a cancelled, skipped
        # or surplus attempt) never reach the loss: trainable leaves them.
        ok, why = trainable(group)
        if len(ok) > slots:
            raise ValueError(f"group {group.id}: {len(ok)} attempts count, more than its {slots} rows")

        out: List[List[_Row]] = []
        for a in ok:
            out.append(self._attempt_rows(group, a))
        left_out = [a for a in sorted(group.attempts, key=lambda a: a.attempt) if a.rollout_id in why]
        mean_reward = sum(a.reward for a in ok) / len(ok) if ok else 0.0
        for k in range(slots - len(ok)):
            a = left_out[k] if k < len(left_out) else None
            if self.layout == "step" and (ok or k > 0):
                out.append([])  # no rows: SkyRL's GRPO never sees the attempt
                continue
            reward = mean_reward if self.layout == "trajectory" else 0.0
            out.append([self._placeholder(group, a, ok, reward, why.get(a.rollout_id) if a else "no attempt")])
        return out

    def _metrics_row(self, group: Group, a: Optional[Attempt], **extra: Any) -> Dict[str, Any]:
        m: Dict[str, Any] = {"legato_group_id": group.id, "legato_task_id": group.task_id}
        if a is not None:
            m.update(legato_rollout_id=a.rollout_id, legato_attempt=a.attempt, legato_status=a.status,
                     legato_reward=a.reward, legato_advantage=a.advantage, legato_masked=a.masked)
        m.update(extra)
        return m

    def _attempt_rows(self, group: Group, a: Attempt) -> List[_Row]:
        steps = a.steps
        if self.layout == "trajectory":
            prompt, resp, mask, lps, starts = concatenate_steps(steps)
            return [_Row(
                prompt_token_ids=prompt, response_ids=resp, rewards=_per_token_reward(len(resp), a.reward),
                loss_mask=mask, logprobs=lps, stop_reason=steps[-1].get("finish_reason") or "",
                is_last_step=True,
                env_metrics=self._metrics_row(group, a, legato_policy_versions=[s["policy_version"] for s in steps],
                                              legato_step_starts=starts),
                images=step_images(steps[-1]),
            )]
        rows = []
        for j, s in enumerate(steps):
            ids = [int(t) for t in s["response_token_ids"] or []]
            last = j == len(steps) - 1
            rows.append(_Row(
                prompt_token_ids=[int(t) for t in s["prompt_token_ids"]], response_ids=ids,
                rewards=_per_token_reward(len(ids), a.reward if last else 0.0),
                loss_mask=[1] * len(ids), logprobs=[float(x) for x in s["response_logprobs"]],
                stop_reason=s.get("finish_reason") or "", is_last_step=last,
                env_metrics=self._metrics_row(group, a, legato_step=s["step"],
                                              legato_policy_versions=[s["policy_version"]]),
                images=step_images(s),
            ))
        return rows

    def _placeholder(self, group: Group, a: Optional[Attempt], ok: List[Attempt], reward: float, why: str) -> _Row:
        if ok:
            s0 = ok[0].steps[0]
            prompt = [int(t) for t in s0["prompt_token_ids"]]
            resp = [int(t) for t in (s0["response_token_ids"] or [self.pad_token_id])[:1]]
            images = step_images(s0)
        else:
            prompt, resp, images = [self.pad_token_id], [self.pad_token_id], []
        return _Row(
            prompt_token_ids=prompt, response_ids=resp, rewards=_per_token_reward(len(resp), reward),
            loss_mask=[0] * len(resp), logprobs=[0.0] * len(resp), stop_reason="masked", is_last_step=True,
            env_metrics=self._metrics_row(group, a, legato_placeholder=True, legato_masked=True,
                                          legato_untrainable=why, legato_policy_versions=[]),
            images=images,
        )

    def _output(self, rows: List[_Row], tids: Optional[List[Any]], groups: List[Group]) -> Dict[str, Any]:
        attempts = [a for g in groups for a in g.attempts]
        trained = [r.env_metrics for r in rows if not r.env_metrics.get("legato_placeholder") and r.is_last_step]
        out: Dict[str, Any] = {
            "prompt_token_ids": [r.prompt_token_ids for r in rows],
            "response_ids": [r.response_ids for r in rows],
            "rewards": [r.rewards for r in rows],
            "loss_masks": [r.loss_mask for r in rows],
            "stop_reasons": [r.stop_reason for r in rows],
            "rollout_metrics": {
                "legato/groups": len(groups),
                "legato/attempts": len(attempts),
                "legato/masked_attempts": sum(1 for a in attempts if a.masked),
                "legato/trained_attempts": len(trained),
                "legato/mean_reward": (sum(m["legato_reward"] for m in trained) / len(trained)) if trained else 0.0,
            },
            "rollout_logprobs": [r.logprobs for r in rows],
            "trajectory_ids": tids,
            "trajectory_generation_times": None,
            "trajectory_time_splits": None,
            "rollout_expert_indices": None,
            "is_last_step": [r.is_last_step for r in rows] if self.layout == "step" else None,
            "env_metrics": [dict(r.env_metrics, legato_images=[img["sha256"] for img in r.images],
                                 legato_image_spans=[img.get("token_span") for img in r.images]) for r in rows],
            # GeneratorOutput's vision fields: None unless vision_features.
            "pixel_values": None,
            "image_grid_thw": None,
        }
        if self.vision_features is not None:
            cache: Dict[str, bytes] = {}
            pv, thw = [], []
            for r in rows:
                pngs = []
                for img in r.images:
                    sha = img["sha256"]
                    if sha not in cache:
                        cache[sha] = self.client.blob(sha)
                    pngs.append(cache[sha])
                p, t = self.vision_features(pngs) if pngs else (None, None)
                pv.append(p)
                thw.append(t)
            out["pixel_values"] = pv
            out["image_grid_thw"] = thw
        return out


# -- weight sync ------------------------------------------------------------------

# What the weight sync relies on in SkyRL, checked against its descriptor
# (glue_conform.py): the trainers' method that sets up the weight sync, the
# dispatch's weight save their train() awaits, and the engine client's
# router address.
SEAM = {"trainer_method": "init_weight_sync_state", "dispatch_method": "save_weights_for_sampler",
        "router_field": "proxy_url"}


def engine_base_urls(trainer: Any) -> List[str]:
    """Where a SkyRL trainer's weights are served, as legato's base URLs:
    its inference engine client's router (``proxy_url``) with the OpenAI
    API's /v1, or none when it has no such client."""
    url = getattr(getattr(trainer, "inference_engine_client", None), SEAM["router_field"], None)
    return [url.rstrip("/") + "/v1"] if url else []


class LegatoDispatch:
    """A SkyRL trainer's ``dispatch`` whose ``save_weights_for_sampler``
    runs inside legato's pause (drained) and serve; everything else is the
    wrapped dispatch's."""

    def __init__(self, dispatch: Any, sync: WeightSync, version: Callable[[], str]) -> None:
        self._dispatch = dispatch
        self._sync = sync
        self._version = version

    async def save_weights_for_sampler(self, *args: Any, **kwargs: Any) -> Any:
        return await self._sync.around_async(self._version, self._dispatch.save_weights_for_sampler, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatch, name)


def legato_trainer(trainer_cls: type, client: Client, base_urls: Optional[Sequence[str]] = None,
                   version_prefix: str = "skyrl-step-") -> type:
    """``trainer_cls`` (SkyRL's RayPPOTrainer, FullyAsyncRayPPOTrainer or a
    subclass) with legato's weight sync around each weight save (see the
    module docstring). An experiment returns it from ``get_trainer``:

        trainer_cls = legato_trainer(FullyAsyncRayPPOTrainer, Client(url, run_dir=...))
        return trainer_cls(cfg=cfg, tracker=tracker, ...)
    """

    class LegatoTrainer(trainer_cls):  # type: ignore[misc, valid-type]
        def init_weight_sync_state(self, *args: Any, **kwargs: Any) -> Any:
            out = super().init_weight_sync_state(*args, **kwargs)
            sync = WeightSync(client, list(base_urls) if base_urls is not None else engine_base_urls(self))
            self.legato_sync = sync
            # Called once the weights are saved: global_step is the step
            # that trained them (0 before the first), so they generate for
            # the next one.
            self.dispatch = LegatoDispatch(self.dispatch, sync, lambda: f"{version_prefix}{self.global_step + 1}")
            return out

    LegatoTrainer.__name__ = LegatoTrainer.__qualname__ = f"Legato{trainer_cls.__name__}"
    return LegatoTrainer
