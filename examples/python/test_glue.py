"""Tests of the slime and SkyRL glue against a real `legato rl serve`.

    LEGATO_BIN=/path/to/legato python3 -m unittest -v test_glue

Each test starts its own service on fake desktops with --oversample 1, so
every group also has masked attempts (cancelled, skipped or surplus), and
checks what the glue made of the ended groups against the groups themselves:
lengths that line up, rewards and advantages, masked attempts left out,
policy versions carried. Neither slime nor SkyRL is needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib
import sys
import types
import unittest
from typing import Any, Dict, List

import skyrl_glue
import slime_glue
from glue_conform import stub_modules
from legato_client import Client, Group
from test_serve import TASK, ServiceCase

G = 3  # attempts per group (n_samples_per_prompt)
# No latencies, and no wait for the screen to settle after each action
# (the fake's screen has settled at once; looking twice would add 300 ms
# an action): the glue sees the same groups, sooner.
FLAGS = ("--fake-speed", "none", "--no-ready-signal", "--desktops", "2", "--oversample", "1")


class FakeDataSource:
    """slime's data source as its rollout function sees it: get_samples(n)
    gives n groups of n_samples_per_prompt copies of a prompt sample."""

    def __init__(self, n_per_prompt: int) -> None:
        self.n = n_per_prompt
        self.next_group = 0
        self.next_index = 0

    def get_samples(self, num: int) -> List[List[slime_glue.LegatoSample]]:
        out = []
        for _ in range(num):
            group = []
            for _ in range(self.n):
                group.append(slime_glue.LegatoSample(group_index=self.next_group, index=self.next_index,
                                                     prompt="write a note", metadata={"legato_task": dict(TASK)}))
                self.next_index += 1
            self.next_group += 1
            out.append(group)
        return out


def raw_group(c: Client, gid: str) -> Dict[str, Any]:
    """The group's JSON as the service sends it."""
    return c._request("GET", f"/v1/groups/{gid}")


def mask_bytes(lm: Any) -> List[int]:
    """The service's loss mask: a JSON list of 0 and 1."""
    assert isinstance(lm, list) and set(lm) <= {0, 1}, f"loss_mask is not a list of 0/1: {lm!r:.80}"
    return lm


def gen_tokens(a) -> int:
    return sum(len(s["response_token_ids"]) for s in a.steps)


def with_first_unmasked_masked(g: Group) -> tuple:
    """``g`` with its first counted attempt masked and nothing else changed:
    steps, reward and advantage kept, as legato sends an attempt whose
    contiguous sequence could not be built. Only its mask keeps it out."""
    victim = next(a for a in g.attempts if not a.masked)
    attempts = [dataclasses.replace(a, masked=True) if a is victim else a for a in g.attempts]
    return dataclasses.replace(g, attempts=attempts), victim


class GlueCase(ServiceCase):
    def service(self, *flags: str) -> Client:
        svc = self.start(*FLAGS, *flags)
        c = Client(svc.url, run_dir=self.out)
        c.wait_ready()
        return c

    def assert_has_masked(self, groups: List[Group]) -> None:
        masked = [a for g in groups for a in g.attempts if a.masked]
        self.assertTrue(masked, "no masked attempt: the test would not exercise masking")
        for g in groups:
            self.assertEqual(g.state, "closed", g.id)
            self.assertEqual(sum(1 for a in g.attempts if not a.masked), G, g.id)


class TestSlimeGlue(GlueCase):
    def test_trajectory_layout_via_generate_rollout(self) -> None:
        c = self.service("--history", "contiguous")
        # The version in force, which the rollout function leaves alone
        # (the weight sync moves it: test_conform.py).
        c.serve("slime-rollout-3")
        args = types.SimpleNamespace(legato_url=c.base_url, legato_run_dir=self.out, rollout_batch_size=2, n_samples_per_prompt=G,
                                     legato_layout="trajectory")
        out = slime_glue.generate_rollout(args, 3, FakeDataSource(G), evaluation=False)
        self.assertEqual(len(out.samples), 2)
        self.assertEqual(out.metrics["legato/trained_attempts"], 2 * G)
        groups = {}
        for group in out.samples:
            self.assertEqual(len(group), G, "a slime group must keep n_samples_per_prompt entries")
            gids = {s.metadata["legato"]["group_id"] for s in group}
            self.assertEqual(len(gids), 1)
            gid = gids.pop()
            groups[gid] = c.group(gid)
        self.assert_has_masked(list(groups.values()))

        flat = [s for group in out.samples for s in group]
        self.assertEqual(len({s.rollout_id for s in flat}), len(flat), "rollout ids must be unique per attempt")
        for group in out.samples:
            g = groups[group[0].metadata["legato"]["group_id"]]
            raw = {a["rollout_id"]: a for a in raw_group(c, g.id)["attempts"]}
            by_id = {a.rollout_id: a for a in g.attempts}
            trained = [s for s in group if not s.remove_sample]
            self.assertEqual({s.metadata["legato"]["rollout_id"] for s in trained},
                             {a.rollout_id for a in g.attempts if not a.masked},
                             "trained samples must be exactly the unmasked attempts")
            for s in trained:
                a = by_id[s.metadata["legato"]["rollout_id"]]
                self.assertFalse(a.masked)
                n_prompt = s.metadata["legato"]["prompt_length"]
                self.assertEqual(len(s.tokens), n_prompt + s.response_length)
                self.assertEqual(len(s.loss_mask), s.response_length)
                self.assertEqual(len(s.rollout_log_probs), s.response_length)
                self.assertEqual(sum(s.loss_mask), gen_tokens(a), "loss mask must cover exactly the generated tokens")
                self.assertEqual(s.reward, a.reward)
                self.assertEqual(s.metadata["legato"]["advantage"], a.advantage)
                self.assertEqual(s.status, "completed")
                self.assertEqual(s.weight_versions, ["slime-rollout-3"] * len(a.steps))
                # The service's own contiguous sequence of the attempt.
                seq = raw[a.rollout_id]["sequence"]
                self.assertEqual(s.tokens, seq["token_ids"])
                self.assertEqual(n_prompt, seq["prompt_length"])
                self.assertEqual(s.loss_mask, mask_bytes(seq["loss_mask"])[n_prompt:])
                self.assertEqual(s.rollout_log_probs, seq["logprobs"][n_prompt:])
                self.assertEqual([n_prompt + x for x in s.metadata["legato"]["step_starts"]], seq["step_starts"])
                for i, m in enumerate(s.loss_mask):
                    if not m:
                        self.assertEqual(s.rollout_log_probs[i], 0.0)
            for s in group:
                if s.remove_sample:
                    self.assertEqual(sum(s.loss_mask), 0)
                    self.assertEqual(s.reward, 0.0)
                    self.assertEqual(len(s.loss_mask), s.response_length)

        raw_rewards, adv = slime_glue.reward_post_process(args, flat)
        self.assertEqual(raw_rewards, [s.reward for s in flat])
        for s, x in zip(flat, adv):
            if s.remove_sample:
                self.assertEqual(x, 0.0)
            else:
                want = next(a.advantage for a in groups[s.metadata["legato"]["group_id"]].attempts
                            if a.rollout_id == s.metadata["legato"]["rollout_id"])
                self.assertEqual(x, want)

        # A masked attempt that kept its steps (a surplus one) is a
        # placeholder, never a trained sample.
        g0 = next(iter(groups.values()))
        g1, victim = with_first_unmasked_masked(g0)
        conv = slime_glue.group_to_samples(g1, FakeDataSource(G).get_samples(1)[0], layout="trajectory")
        self.assertEqual(len(conv), G)
        self.assertNotIn(victim.rollout_id, {s.metadata["legato"]["rollout_id"] for s in conv if not s.remove_sample})
        self.assertEqual(sum(1 for s in conv if s.remove_sample), 1)
        self.assertEqual(sum(sum(s.loss_mask) for s in conv if s.remove_sample), 0)
        self.assertEqual([s.reward for s in conv if s.remove_sample], [0.0])
        self.assertEqual(slime_glue.reward_post_process(None, [s for s in conv if s.remove_sample])[1], [0.0])

        # With legato_key_prefix, the same rollout submitted again (a resumed
        # run) gets the same groups back; another rollout gets new ones. (One
        # group a rollout shows that as well as two.)
        kargs = types.SimpleNamespace(**dict(vars(args), rollout_batch_size=1), legato_key_prefix="run1")
        first = slime_glue.generate_rollout(kargs, 4, FakeDataSource(G), evaluation=False)
        again = slime_glue.generate_rollout(kargs, 4, FakeDataSource(G), evaluation=False)
        other = slime_glue.generate_rollout(kargs, 5, FakeDataSource(G), evaluation=False)
        ids = lambda o: [g[0].metadata["legato"]["group_id"] for g in o.samples]  # noqa: E731
        self.assertEqual(ids(first), ids(again))
        self.assertFalse(set(ids(first)) & set(ids(other)))
        self.assertFalse(set(ids(first)) & set(groups), "a rollout without a key must not reuse groups")

        # Evaluation: the tasks of legato_eval_tasks, one sample per attempt that counts.
        eargs = types.SimpleNamespace(legato_url=c.base_url, legato_run_dir=self.out, legato_eval_tasks=[TASK], n_samples_per_eval_prompt=2)
        ev = slime_glue.generate_rollout(eargs, 3, None, evaluation=True)
        data = ev.data["legato"]
        self.assertEqual(len(data["samples"]), 2)
        self.assertEqual(len(data["rewards"]), len(data["truncated"]))
        self.assertEqual(data["rewards"], [s.reward for s in data["samples"]])

    def test_step_layout_and_cancelled_group(self) -> None:
        c = self.service()
        c.serve("v9")
        prompt_groups = FakeDataSource(G).get_samples(2)
        out, metrics, ended = slime_glue.rollout_groups(c, prompt_groups, layout="step")
        self.assert_has_masked(ended)
        self.assertEqual(metrics["legato/masked_attempts"], sum(1 for g in ended for a in g.attempts if a.masked))
        for entries, g in zip(out, ended):
            self.assertEqual(len(entries), G)
            by_id = {a.rollout_id: a for a in g.attempts}
            trained = [e for e in entries if not e[0].remove_sample]
            self.assertEqual([e[0].metadata["legato"]["rollout_id"] for e in trained],
                             [a.rollout_id for a in sorted(g.attempts, key=lambda a: a.attempt) if not a.masked])
            for e in entries:
                self.assertEqual(len({s.rollout_id for s in e}), 1, "an attempt's step samples share rollout_id")
            for e in trained:
                a = by_id[e[0].metadata["legato"]["rollout_id"]]
                self.assertEqual(len(e), len(a.steps))
                for s, step in zip(e, a.steps):
                    self.assertEqual(s.tokens, step["prompt_token_ids"] + step["response_token_ids"])
                    self.assertEqual(s.response_length, len(step["response_token_ids"]))
                    self.assertEqual(s.loss_mask, [1] * s.response_length)
                    self.assertEqual(s.rollout_log_probs, step["response_logprobs"])
                    self.assertEqual(s.reward, a.reward)
                    self.assertEqual(s.metadata["legato"]["advantage"], a.advantage)
                    self.assertEqual(s.weight_versions, ["v9"])
                    self.assertEqual(s.metadata["legato"]["images"][-1], step["messages"][-1]["content"][-1]["image_url"]["url"].rsplit("/", 1)[-1])
            for e in entries:
                if e[0].remove_sample:
                    self.assertEqual(len(e), 1)
                    self.assertEqual(sum(e[0].loss_mask), 0)
        g1, victim = with_first_unmasked_masked(ended[0])
        conv = slime_glue.group_to_samples(g1, prompt_groups[0], layout="step")
        self.assertNotIn(victim.rollout_id, {e[0].metadata["legato"]["rollout_id"] for e in conv if not e[0].remove_sample})
        self.assertEqual(sum(1 for e in conv if e[0].remove_sample), 1)

        # A group cancelled before any attempt ran: nothing trains.
        c.pause()
        g = c.submit(TASK, group_size=2)
        c.cancel(g.id)
        c.serve()
        done = c.group(g.id, wait=30)
        self.assertTrue(all(a.masked for a in done.attempts))
        conv = slime_glue.group_to_samples(done, FakeDataSource(2).get_samples(1)[0], layout="trajectory")
        self.assertEqual(len(conv), 2)
        self.assertTrue(all(s.remove_sample and sum(s.loss_mask) == 0 and s.reward == 0.0 for s in conv))


class TestWithTrainerInstalled(GlueCase):
    """The guarded imports: with slime's and SkyRL's modules importable (here
    small stand-ins with the names and fields of theirs, since neither can be
    installed here) the glue builds their objects."""

    def test_real_classes_when_importable(self) -> None:
        class Status(enum.Enum):
            PENDING = "pending"
            COMPLETED = "completed"
            TRUNCATED = "truncated"
            ABORTED = "aborted"
            FAILED = "failed"

        @dataclasses.dataclass
        class Sample:  # slime.utils.types.Sample's fields the glue touches
            group_index: Any = None
            index: Any = None
            rollout_id: Any = None
            prompt: Any = ""
            tokens: list = dataclasses.field(default_factory=list)
            multimodal_inputs: Any = None
            multimodal_train_inputs: Any = None
            response: str = ""
            response_length: int = 0
            label: Any = None
            reward: Any = None
            loss_mask: Any = None
            weight_versions: list = dataclasses.field(default_factory=list)
            rollout_log_probs: Any = None
            remove_sample: bool = False
            status: Status = Status.PENDING
            metadata: dict = dataclasses.field(default_factory=dict)

        Sample.Status = Status

        @dataclasses.dataclass
        class RolloutFnTrainOutput:
            samples: list
            metrics: Any = None

        @dataclasses.dataclass
        class RolloutFnEvalOutput:
            data: dict
            metrics: Any = None

        class GeneratorInterface:
            pass

        @dataclasses.dataclass
        class TrajectoryID:
            instance_id: str
            repetition_id: int

            def to_string(self) -> str:
                return f"{self.instance_id}_{self.repetition_id}"

        remove = stub_modules({
            "slime.utils.types": {"Sample": Sample},
            "slime.rollout.base_types": {"RolloutFnTrainOutput": RolloutFnTrainOutput,
                                         "RolloutFnEvalOutput": RolloutFnEvalOutput},
            "skyrl.train.generators.base": {"GeneratorInterface": GeneratorInterface, "TrajectoryID": TrajectoryID},
        })

        def restore() -> None:
            remove()
            importlib.reload(slime_glue)
            importlib.reload(skyrl_glue)
        self.addCleanup(restore)
        importlib.reload(slime_glue)
        importlib.reload(skyrl_glue)

        self.assertTrue(issubclass(skyrl_glue.LegatoGenerator, GeneratorInterface))
        self.assertIs(skyrl_glue.TrajectoryID, TrajectoryID)

        c = self.service()
        c.serve("v2")
        templates = [Sample(index=i, group_index=0, metadata={"legato_task": dict(TASK), "src": "x"}) for i in range(G)]
        out, _, ended = slime_glue.rollout_groups(c, [templates], layout="trajectory")
        got = out[0]
        self.assertEqual(len(got), G)
        for s, t in zip(got, templates):
            self.assertIsInstance(s, Sample)
            self.assertIsNot(s, t, "the data source's sample must not be changed in place")
            self.assertEqual(s.status, Status.COMPLETED)
            self.assertEqual(s.metadata["src"], "x")
            self.assertEqual(s.index, t.index)
        self.assertEqual(templates[0].tokens, [])
        g1, _ = with_first_unmasked_masked(ended[0])
        conv = slime_glue.group_to_samples(g1, templates, layout="trajectory")
        self.assertEqual([s.status for s in conv if s.remove_sample], [Status.FAILED])
        # Samples built without a slime template are slime's too.
        conv = slime_glue.group_to_samples(ended[0], [None] * G, layout="step")
        self.assertTrue(all(isinstance(s, Sample) for e in conv for s in e))
        args = types.SimpleNamespace(legato_url=c.base_url, legato_run_dir=self.out, rollout_batch_size=1, n_samples_per_prompt=G)
        self.assertIsInstance(slime_glue.generate_rollout(args, 0, FakeDataSource(G), evaluation=False),
                              RolloutFnTrainOutput)


def check_skyrl_output(test: unittest.TestCase, n_prompts: int, out: Dict[str, Any], step_wise: bool) -> None:
    """The invariants SkyRL's validate_generator_output enforces."""
    n = len(out["response_ids"])
    if not step_wise:
        test.assertEqual(n, n_prompts)
    for key in ("prompt_token_ids", "loss_masks", "rewards", "rollout_logprobs", "stop_reasons", "env_metrics"):
        test.assertEqual(len(out[key]), n, key)
    for i in range(n):
        test.assertEqual(len(out["response_ids"][i]), len(out["loss_masks"][i]), i)
        test.assertEqual(len(out["response_ids"][i]), len(out["rewards"][i]), i)
        test.assertEqual(len(out["response_ids"][i]), len(out["rollout_logprobs"][i]), i)
        test.assertTrue(out["response_ids"][i], f"row {i}: empty response")
    if step_wise:
        last, tids = out["is_last_step"], out["trajectory_ids"]
        test.assertEqual(len(last), n)
        test.assertEqual(len(tids), n)
        test.assertTrue(last[-1])
        seen, prev = set(), None
        for i, t in enumerate(tids):
            k = t.to_string()
            if k != prev:
                test.assertNotIn(k, seen, f"trajectory {k} not contiguous")
                if i > 0:
                    test.assertTrue(last[i - 1], f"row {i - 1} ends trajectory {prev} but is not its last step")
                seen.add(k)
            prev = k


def skyrl_batch(instances: int) -> Dict[str, Any]:
    """A GeneratorInput as SkyRL's prepare_generator_input lays it out."""
    prompts, extras, tids = [], [], []
    for u in range(instances):
        for r in range(G):
            prompts.append([{"role": "user", "content": "write a note"}])
            extras.append({"legato_task": dict(TASK)})
            tids.append(skyrl_glue.TrajectoryID(instance_id=f"uid{u}", repetition_id=r))
    return {"prompts": prompts, "env_classes": ["legato"] * len(prompts), "env_extras": extras,
            "sampling_params": None, "trajectory_ids": tids,
            "batch_metadata": types.SimpleNamespace(global_step=5, training_phase="train")}


class TestSkyRLGlue(GlueCase):
    def test_trajectory_layout(self) -> None:
        c = self.service("--history", "contiguous")
        c.serve("skyrl-step-5")  # the weight sync's; generate() leaves it alone
        gen = skyrl_glue.LegatoGenerator(c, layout="trajectory")
        batch = skyrl_batch(2)
        out = asyncio.run(gen.generate(batch))
        check_skyrl_output(self, len(batch["prompts"]), out, step_wise=False)
        self.assertIsNone(out["is_last_step"])
        groups = gen.last_groups
        self.assertEqual(len(groups), 2)
        self.assert_has_masked(groups)
        self.assertEqual(out["rollout_metrics"]["legato/trained_attempts"], 2 * G)
        for u, g in enumerate(groups):
            rows = range(u * G, (u + 1) * G)
            self.assertEqual({out["env_metrics"][i]["legato_group_id"] for i in rows}, {g.id})
            raw = {a["rollout_id"]: a for a in raw_group(c, g.id)["attempts"]}
            by_id = {a.rollout_id: a for a in g.attempts}
            trained = [i for i in rows if not out["env_metrics"][i].get("legato_placeholder")]
            self.assertEqual([out["env_metrics"][i]["legato_rollout_id"] for i in trained],
                             [a.rollout_id for a in sorted(g.attempts, key=lambda a: a.attempt) if not a.masked])
            for i in trained:
                m = out["env_metrics"][i]
                a = by_id[m["legato_rollout_id"]]
                self.assertFalse(a.masked)
                resp, mask, rew = out["response_ids"][i], out["loss_masks"][i], out["rewards"][i]
                self.assertEqual(sum(mask), gen_tokens(a))
                self.assertEqual(rew[-1], a.reward)
                self.assertEqual(sum(rew), a.reward)
                self.assertEqual(m["legato_advantage"], a.advantage)
                self.assertEqual(m["legato_policy_versions"], ["skyrl-step-5"] * len(a.steps))
                self.assertEqual(out["stop_reasons"][i], a.steps[-1]["finish_reason"])
                seq = raw[a.rollout_id]["sequence"]
                self.assertEqual(out["prompt_token_ids"][i] + resp, seq["token_ids"])
                self.assertEqual(mask, mask_bytes(seq["loss_mask"])[seq["prompt_length"]:])
                self.assertEqual(out["rollout_logprobs"][i], seq["logprobs"][seq["prompt_length"]:])
            mean = sum(by_id[out["env_metrics"][i]["legato_rollout_id"]].reward for i in trained) / len(trained)
            for i in rows:
                if out["env_metrics"][i].get("legato_placeholder"):
                    self.assertEqual(sum(out["loss_masks"][i]), 0)
                    self.assertAlmostEqual(sum(out["rewards"][i]), mean)

        # A masked attempt that kept its steps gets a placeholder row only.
        g1, victim = with_first_unmasked_masked(groups[0])
        slots = gen.group_rows(g1, G)
        self.assertEqual([len(s) for s in slots], [1] * G)
        kept = [r for s in slots for r in s if not r.env_metrics.get("legato_placeholder")]
        self.assertNotIn(victim.rollout_id, {r.env_metrics["legato_rollout_id"] for r in kept})
        self.assertEqual(len(kept), G - 1)
        kept_mean = sum(r.env_metrics["legato_reward"] for r in kept) / len(kept)
        holders = [r for s in slots for r in s if r.env_metrics.get("legato_placeholder")]
        self.assertEqual(len(holders), 1)
        self.assertEqual(holders[0].env_metrics["legato_rollout_id"], victim.rollout_id)
        self.assertEqual(sum(holders[0].loss_mask), 0)
        self.assertEqual(len(holders[0].loss_mask), len(holders[0].response_ids))
        self.assertAlmostEqual(sum(holders[0].rewards), kept_mean, msg="a placeholder must not move the group mean")

    def test_step_layout(self) -> None:
        c = self.service()
        gen = skyrl_glue.LegatoGenerator(c, layout="step")
        c.serve("v4")
        batch = skyrl_batch(2)
        out = asyncio.run(gen.generate(batch))
        check_skyrl_output(self, len(batch["prompts"]), out, step_wise=True)
        groups = gen.last_groups
        self.assert_has_masked(groups)
        attempts = {a.rollout_id: a for g in groups for a in g.attempts}
        # Rows follow the input: instance by instance, attempt by attempt,
        # step by step; masked attempts have none.
        want = [(a.rollout_id, s["step"]) for g in groups for a in sorted(g.attempts, key=lambda a: a.attempt)
                if not a.masked for s in a.steps]
        got = [(m["legato_rollout_id"], m["legato_step"]) for m in out["env_metrics"]]
        self.assertEqual(got, want)
        self.assertEqual([t.instance_id for t in out["trajectory_ids"]][0], "uid0")
        for i, m in enumerate(out["env_metrics"]):
            a = attempts[m["legato_rollout_id"]]
            self.assertFalse(a.masked)
            step = a.steps[m["legato_step"]]
            self.assertEqual(out["prompt_token_ids"][i], step["prompt_token_ids"])
            self.assertEqual(out["response_ids"][i], step["response_token_ids"])
            self.assertEqual(out["rollout_logprobs"][i], step["response_logprobs"])
            self.assertEqual(out["loss_masks"][i], [1] * len(step["response_token_ids"]))
            last = m["legato_step"] == a.steps[-1]["step"]
            self.assertEqual(out["is_last_step"][i], last)
            self.assertEqual(sum(out["rewards"][i]), a.reward if last else 0.0)
            self.assertEqual(m["legato_advantage"], a.advantage)
            self.assertEqual(m["legato_policy_versions"], ["v4"])
        # Each uid's trajectories are the group's unmasked attempts.
        for u, g in enumerate(groups):
            tids = {t.to_string() for t in out["trajectory_ids"] if t.instance_id == f"uid{u}"}
            self.assertEqual(len(tids), sum(1 for a in g.attempts if not a.masked))

        g1, victim = with_first_unmasked_masked(groups[0])
        slots = gen.group_rows(g1, G)
        self.assertEqual(sum(1 for s in slots if s), G - 1)
        self.assertNotIn(victim.rollout_id, {r.env_metrics["legato_rollout_id"] for s in slots for r in s})

        # A group with no attempt left still has one row (loss mask 0), so
        # its uid stays in the batch.
        c.pause()
        g = c.submit(TASK, group_size=2)
        c.cancel(g.id)
        c.serve()
        done = c.group(g.id, wait=30)
        slots = gen.group_rows(done, 2)
        self.assertEqual([len(s) for s in slots], [1, 0])
        self.assertEqual(sum(slots[0][0].loss_mask), 0)
        self.assertEqual(sum(slots[0][0].rewards), 0.0)
        self.assertTrue(slots[0][0].is_last_step)


if __name__ == "__main__":
    unittest.main()
