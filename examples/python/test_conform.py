"""The glue against the trainers' interfaces, and their weight syncs.

    LEGATO_BIN=/path/to/legato python3 -m unittest -v test_conform

The descriptors (descriptors/*.json) were read from slime's, SkyRL's and
verl's source at the commits they name (descriptors/extract.py); here each
glue runs on ended groups of a real `legato rl serve` on fake desktops
(masked attempts included) and its output is checked against them. Each
check is shown to fail on a descriptor with a field renamed or its type
changed. The weight-sync tests drive each glue's sync as its trainer does,
SkyRL's fully-async ordering included.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import tempfile
import types
import unittest
from typing import Any, Dict, List

import glue_conform as gc
import harness
import skyrl_glue
import slime_glue
import verl_glue
from legato_client import Client, WeightSync


class LiveService:
    """One `legato rl serve` (and a scripted model server standing for the
    trainer's weights) for a test class."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "run")
        self.log = os.path.join(self.dir.name, "legato.log")
        self.procs = []
        # Where the "new weights" are served: another model server.
        self.weights = harness.policy_server("--no-latency", log_path=self.log)
        self.procs.append(self.weights)
        self.svc = harness.service(self.out, harness.free_port(), *gc.FIXTURE_FLAGS, log_path=self.log)
        self.procs.append(self.svc)
        self.client = Client(self.svc.url, run_dir=self.out)
        self.client.wait_ready()

    def close(self) -> None:
        for p in reversed(self.procs):
            p.close()
        self.dir.cleanup()


def _fields(desc: Dict[str, Any], name: str) -> Dict[str, Any]:
    return desc["types"][name]["fields"]


class TestConformance(unittest.TestCase):
    """Each glue's output on the same legato groups, against each
    framework's descriptor."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.live = LiveService()
        cls.desc = {n: gc.load(n) for n in gc.FRAMEWORKS}
        # SkyRL's input as a GeneratorInput: reading a key it lacks fails.
        fields = _fields(cls.desc["skyrl"], "GeneratorInput")
        cls.out = gc.glue_outputs(cls.live.client, skyrl_input=lambda v: gc.strict_input(fields, v))

    @classmethod
    def tearDownClass(cls) -> None:
        cls.live.close()

    def problems(self, name: str, desc: Dict[str, Any]) -> List[str]:
        return [f"{what}: {p}" for what, probs in gc.conformance(name, self.out, desc) for p in probs]

    def test_glue_fits_descriptors(self) -> None:
        masked = [a for g in self.out.groups for a in g.attempts if a.masked]
        self.assertTrue(masked, "no masked attempt: placeholders would go unchecked")
        self.assertTrue(all(a.sequence for g in self.out.groups for a in g.attempts if not a.masked))
        for name in gc.FRAMEWORKS:
            with self.subTest(framework=name):
                self.assertEqual(self.problems(name, self.desc[name]), [])
        # The outputs hold placeholders and images: both were checked.
        self.assertTrue(any(s.remove_sample for g in self.out.slime["trajectory"] for s in g))
        self.assertTrue(any(o.extra_fields["legato"].get("placeholder") for o in self.out.verl))
        self.assertTrue(all(o.multi_modal_data.get("images") for o in self.out.verl))
        _, sky = self.out.skyrl["trajectory"]
        self.assertTrue(all(m["legato_images"] for m in sky["env_metrics"]))

    def test_descriptors_name_their_commit(self) -> None:
        """Each descriptor comes from a pinned commit, the one its glue's
        docstring says it was read at."""
        glue = {"slime": slime_glue, "skyrl": skyrl_glue, "verl": verl_glue}
        for name, d in self.desc.items():
            with self.subTest(framework=name):
                self.assertRegex(d["commit"], r"^[0-9a-f]{40}$")
                self.assertEqual(d["repository"], {"slime": "THUDM/slime", "skyrl": "NovaSky-AI/SkyRL",
                                                   "verl": "volcengine/verl"}[name])
                self.assertIn(f"{d['repository']} {d['commit'][:8]}", " ".join(glue[name].__doc__.split()))

    def fields_set(self, name: str) -> Dict[str, Dict[str, Any]]:
        """The fields the glue sets, by type name in the descriptor."""
        if name == "slime":
            s = self.out.slime["trajectory"][0][0]
            return {"Sample": gc._items(s)}
        if name == "skyrl":
            return {"GeneratorOutput": dict(self.out.skyrl["step"][1])}
        return {"AgentLoopOutput": gc._items(self.out.verl[0]),
                "AgentLoopMetrics": gc._items(self.out.verl[0].metrics)}

    def test_renamed_field_fails(self) -> None:
        """Every field the glue sets, renamed in the descriptor: the check
        fails (the glue sets a field the framework lacks)."""
        for name in gc.FRAMEWORKS:
            for tname, items in self.fields_set(name).items():
                for field in items:
                    with self.subTest(framework=name, field=f"{tname}.{field}"):
                        d = copy.deepcopy(self.desc[name])
                        fs = d["types"][tname]["fields"]
                        fs[field + "_renamed"] = fs.pop(field)
                        probs = self.problems(name, d)
                        self.assertTrue(any(repr(field) in p for p in probs), probs)

    def test_changed_type_fails(self) -> None:
        """Every field the glue sets, given a type its value is not (bytes),
        and a few element types changed: the check fails."""
        for name in gc.FRAMEWORKS:
            for tname, items in self.fields_set(name).items():
                for field in items:
                    with self.subTest(framework=name, field=f"{tname}.{field}"):
                        d = copy.deepcopy(self.desc[name])
                        d["types"][tname]["fields"][field]["type"] = "bytes"
                        self.assertTrue(any(f".{field}" in p for p in self.problems(name, d)))
        for name, tname, field, old, new in (
                ("slime", "Sample", "tokens", "list[int]", "list[str]"),
                ("slime", "Sample", "weight_versions", "list[str]", "list[int]"),
                ("slime", "Status", None, "completed", "done"),
                ("skyrl", "GeneratorOutput", "loss_masks", "List[List[int]]", "List[List[bool]]"),
                ("skyrl", "TrajectoryID", "repetition_id", "int", "str"),
                ("skyrl", "GeneratorOutput", "rewards", "Union[List[float], List[List[float]]]", "List[float]"),
                ("verl", "AgentLoopOutput", "response_mask", "list[int]", "list[str]"),
                ("verl", "AgentLoopMetrics", "num_preempted", "int", "str")):
            with self.subTest(framework=name, field=f"{tname}.{field}", new=new):
                d = copy.deepcopy(self.desc[name])
                t = d["types"][tname]
                if field is None:  # an enum value
                    self.assertIn(old, t["values"])
                    t["values"] = [new if v == old else v for v in t["values"]]
                else:
                    self.assertEqual(t["fields"][field]["type"], old, "the descriptor's type changed: update this test")
                    t["fields"][field]["type"] = new
                self.assertTrue(self.problems(name, d))

    def test_renamed_rule_key_fails(self) -> None:
        """A key of SkyRL's validate rules renamed (the glue's output keeps
        the old name): the rules' check fails; and so does a weight-sync
        seam renamed."""
        for key in ("loss_masks", "rollout_logprobs", "is_last_step", "trajectory_ids", "prompt_token_ids"):
            with self.subTest(key=key):
                d = copy.deepcopy(self.desc["skyrl"])
                text = json.dumps(d["validate_generator_output"]).replace(f'"{key}"', f'"{key}_renamed"')
                d["validate_generator_output"] = json.loads(text)
                probs = []
                for layout, step_wise in (("trajectory", False), ("step", True)):
                    n, o = self.out.skyrl[layout]
                    probs += [p for r in d["validate_generator_output"]["rules"] for p in gc._skyrl_rule(r, o, n, step_wise)]
                self.assertTrue(probs)
        seams = (("slime", ["weight_sync", "trainer_group", "methods"], ["update_weights_v2"]),
                 ("slime", ["weight_sync", "router_args"], ["sglang_router_host", "sglang_router_port"]),
                 ("skyrl", ["weight_sync", "trainers", "FullyAsyncRayPPOTrainer", "train_awaits"], ["self.dispatch.sync"]),
                 ("skyrl", ["weight_sync", "engine_client_fields"], ["router_url"]),
                 ("verl", ["weight_sync", "manager_methods"], ["sync_weights"]),
                 ("verl", ["weight_sync", "manager_address_fields"], ["addresses"]))
        for name, path, value in seams:
            with self.subTest(seam=".".join(path)):
                d = copy.deepcopy(self.desc[name])
                node = d
                for p in path[:-1]:
                    node = node[p]
                node[path[-1]] = value
                self.assertTrue(self.problems(name, d))

    def test_broken_output_fails(self) -> None:
        """The rules' check sees what validate_generator_output would
        refuse, and verl's misaligned lengths."""
        n, o = self.out.skyrl["step"]
        bad = copy.deepcopy(o)
        bad["loss_masks"][0] = bad["loss_masks"][0][:-1]
        self.assertTrue(any("loss_masks" in p for p in gc.check_skyrl(bad, n, True, self.desc["skyrl"])))
        bad = copy.deepcopy(o)
        bad["trajectory_ids"] = bad["trajectory_ids"][1:] + bad["trajectory_ids"][:1]
        self.assertTrue(gc.check_skyrl(bad, n, True, self.desc["skyrl"]))
        bad = copy.deepcopy(o)
        bad["is_last_step"][-1] = False
        self.assertTrue(gc.check_skyrl(bad, n, True, self.desc["skyrl"]))
        n, o = self.out.skyrl["trajectory"]
        bad = dict(o, response_ids=o["response_ids"][1:])
        self.assertTrue(gc.check_skyrl(bad, n, False, self.desc["skyrl"]))
        bad = {k: v for k, v in o.items() if k != "pixel_values"}
        self.assertTrue(any("pixel_values" in p for p in gc.check_skyrl(bad, n, False, self.desc["skyrl"])))
        v = copy.deepcopy(self.out.verl[0])
        v.response_mask = v.response_mask[:-1]
        self.assertTrue(gc.check_verl([v], self.desc["verl"]))
        s = copy.deepcopy(self.out.slime["step"])
        s[0][0][0].rollout_id = None
        self.assertTrue(any("rollout_id" in p for p in gc.check_slime(s, self.desc["slime"])))
        s = copy.deepcopy(self.out.slime["trajectory"])
        s[0][0].loss_mask = s[0][0].loss_mask[:-1]
        self.assertTrue(any("loss_mask" in p for p in gc.check_slime(s, self.desc["slime"])))

    def test_skyrl_reads_only_generator_input(self) -> None:
        fields = _fields(self.desc["skyrl"], "GeneratorInput")
        batch = gc.strict_input(fields, gc.skyrl_batch(1, skyrl_glue.TrajectoryID, None))
        with self.assertRaises(KeyError):
            batch["legato_task"]
        renamed = dict(fields)
        renamed["env_extra"] = renamed.pop("env_extras")
        values = gc.skyrl_batch(1, skyrl_glue.TrajectoryID, None)
        values["env_extra"] = values.pop("env_extras")
        gen = skyrl_glue.LegatoGenerator(self.live.client)
        with self.assertRaises(KeyError):
            gen.output_for(gc.strict_input(renamed, values), self.out.groups[:1])


class SpyClient(Client):
    """A client that records its policy calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: List[tuple] = []

    def pause(self, drain: bool = False) -> Any:
        self.calls.append(("pause", drain))
        return super().pause(drain)

    def serve(self, version: str = "", base_urls: Any = None, force: bool = False) -> Any:
        self.calls.append(("serve", version, list(base_urls or []), force))
        return super().serve(version, base_urls, force)


class TestWeightSync(unittest.TestCase):
    """Each glue's weight sync: legato paused and drained while the
    weights swap, then serving the next version where the weights are."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.live = LiveService()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.live.close()

    def setUp(self) -> None:
        self.client = SpyClient(self.live.svc.url, run_dir=self.live.out)
        self.seen: List[Dict[str, Any]] = []

    def update(self, *_: Any) -> str:
        """The trainer's weight update: what legato's policy is meanwhile."""
        self.seen.append(self.client.policy())
        return "updated"

    def assert_synced(self, version: str) -> None:
        during = self.seen[-1]
        self.assertEqual((during["state"], during["in_flight"]), ("paused", 0), "the weights swapped while serving")
        now = self.client.policy()
        self.assertEqual((now["state"], now["version"]), ("serving", version))
        self.assertEqual(now["servers"], [self.live.weights.url], "legato's calls must go where the new weights are")

    def steps_versions(self, groups: List[Any]) -> List[str]:
        return sorted({s["policy_version"] for g in groups for a in g.attempts for s in a.steps})

    def test_skyrl_fully_async_ordering(self) -> None:
        """SkyRL's fully-async trainer: a worker prepares its batch at step
        1 and gets its slot after step 2 started (the weights trained on step
        1 synced). Its steps carry the version of the weights in force,
        skyrl-step-2, not that of the step it was prepared at; generate()
        never touches the policy."""
        client = self.client
        router = self.live.weights.url[: -len("/v1")]

        class Dispatch:
            def __init__(self, test: "TestWeightSync") -> None:
                self.test = test

            async def save_weights_for_sampler(self) -> None:
                await asyncio.to_thread(self.test.update)

        class FullyAsyncStandIn:
            """The part of FullyAsyncRayPPOTrainer the sync touches: its
            dispatch, global_step and engine client; train() as it orders
            the calls (skyrl/train/fully_async_trainer.py)."""

            def __init__(self, test: "TestWeightSync") -> None:
                self.dispatch = Dispatch(test)
                self.global_step = 0
                self.inference_engine_client = types.SimpleNamespace(proxy_url=router)

            def init_weight_sync_state(self) -> None:
                pass

        trainer = skyrl_glue.legato_trainer(FullyAsyncStandIn, client)(self)
        gen = skyrl_glue.LegatoGenerator(client, layout="step")

        def batch(step: int) -> Dict[str, Any]:
            meta = types.SimpleNamespace(global_step=step, training_phase="train")
            return gc.skyrl_batch(1, skyrl_glue.TrajectoryID, meta)

        async def train() -> tuple:
            trainer.init_weight_sync_state()
            await trainer.dispatch.save_weights_for_sampler()  # before the loop
            self.assert_synced("skyrl-step-1")
            trainer.global_step += 1
            first = batch(trainer.global_step)
            late = batch(trainer.global_step)  # prepared now, slot later
            calls = len(client.calls)
            out1 = await gen.generate(first)
            groups1 = gen.last_groups
            self.assertEqual(len(client.calls), calls, "generate() changed the policy")
            # Step 1 trains; its weights are saved; step 2 starts.
            await trainer.dispatch.save_weights_for_sampler()
            self.assert_synced("skyrl-step-2")
            trainer.global_step += 1
            calls = len(client.calls)
            await gen.generate(late)  # the slot, granted now
            self.assertEqual(len(client.calls), calls, "generate() changed the policy")
            return out1, groups1, gen.last_groups

        out1, groups1, groups2 = asyncio.run(train())
        self.assertEqual(self.steps_versions(groups1), ["skyrl-step-1"])
        self.assertEqual(self.steps_versions(groups2), ["skyrl-step-2"],
                         "a batch prepared at step 1 and generated after step 2 began is generated by step 2's weights")
        self.assertEqual({v for m in out1["env_metrics"] for v in m["legato_policy_versions"]}, {"skyrl-step-1"})
        self.assertEqual([c[0] for c in client.calls], ["pause", "serve", "pause", "serve"])
        self.assertTrue(all(c[1] for c in client.calls if c[0] == "pause"), "every pause drains")
        self.assertEqual(trainer.legato_sync.synced, ["skyrl-step-1", "skyrl-step-2"])

    def test_slime_weight_sync(self) -> None:
        """slime's train.py: update_weights once before the loop, then after
        each rollout trains; generate_rollout leaves the policy alone."""
        host, port = re.match(r"http://([^:/]+):(\d+)/v1$", self.live.weights.url).groups()
        args = types.SimpleNamespace(legato_url=self.live.svc.url, legato_run_dir=self.live.out, start_rollout_id=4,
                                     sglang_router_ip=host, sglang_router_port=int(port), rollout_batch_size=1,
                                     n_samples_per_prompt=gc.G, legato_version_prefix="slime-rollout-")
        actor_model = types.SimpleNamespace(update_weights=self.update)
        sync = slime_glue.install_weight_sync(actor_model, args, client=self.client)
        self.assertEqual(actor_model.update_weights(), "updated")
        self.assert_synced("slime-rollout-4")
        before = self.client.policy()
        out = slime_glue.generate_rollout(args, 4, DataSource(), evaluation=False)
        self.assertEqual(self.client.policy()["since"], before["since"], "generate_rollout changed the policy")
        self.assertEqual({v for g in out.samples for s in g for v in s.weight_versions}, {"slime-rollout-4"})
        actor_model.update_weights()
        self.assert_synced("slime-rollout-5")
        self.assertEqual(sync.synced, ["slime-rollout-4", "slime-rollout-5"])
        self.assertEqual([c[0] for c in self.client.calls], ["pause", "serve", "pause", "serve"])
        # Without a router address and none given: a clear error.
        with self.assertRaisesRegex(ValueError, "legato_base_urls"):
            slime_glue.install_weight_sync(types.SimpleNamespace(update_weights=self.update),
                                           types.SimpleNamespace(legato_url=self.live.svc.url), client=self.client)

    def test_verl_weight_sync_and_agent_loop(self) -> None:
        """verl: the checkpoint manager's update_weights inside legato's
        pause and serve, the replicas' addresses as base_urls; then the agent
        loops of one uid share one legato group, one attempt each."""
        addr = self.live.weights.url[len("http://"): -len("/v1")]
        trainer = types.SimpleNamespace(global_steps=0, checkpoint_manager=types.SimpleNamespace(update_weights=self.update),
                                        async_rollout_manager=types.SimpleNamespace(server_addresses=[addr]))
        verl_glue.install_weight_sync(trainer, self.client)
        trainer.checkpoint_manager.update_weights()
        self.assert_synced("verl-step-1")
        trainer.global_steps = 1

        loop = verl_glue.LegatoAgentLoop(client=self.client, n=gc.G, response_length=None,
                                         image_loader=lambda png: png[:8])

        async def rollouts() -> List[Any]:
            kw = {"uid": "u-1", "extra_info": {"legato_task": json.dumps(gc.TASK)}, "raw_prompt": []}
            return await asyncio.gather(*(loop.run({}, **kw) for _ in range(gc.G)))

        outs = asyncio.run(rollouts())
        gids = {o.extra_fields["legato"]["group_id"] for o in outs}
        self.assertEqual(len(gids), 1, "the loops of one uid share one group")
        ids = [o.extra_fields["legato"].get("rollout_id") for o in outs if not o.extra_fields["legato"].get("placeholder")]
        self.assertEqual(len(ids), len(set(ids)), "each loop takes its own attempt")
        self.assertEqual(gc.check_verl(outs, gc.load("verl")), [])
        for o in outs:
            if not o.extra_fields["legato"].get("placeholder"):
                self.assertEqual(set(o.extra_fields["legato"]["policy_versions"]), {"verl-step-1"})
                self.assertTrue(all(img == b"\x89PNG\r\n\x1a\n" for img in o.multi_modal_data["images"]))
        trainer.checkpoint_manager.update_weights()
        self.assert_synced("verl-step-2")

    def test_restarted_trainer_goes_back_once(self) -> None:
        """A trainer restarted from an older checkpoint: its first sync
        goes back on purpose (forced); a later one that goes back fails."""
        self.client.serve("resume-test-7")
        sync = WeightSync(self.client, [self.live.weights.url])
        sync.around("resume-test-5", self.update)
        self.assert_synced("resume-test-5")
        self.assertEqual(self.client.calls[-1][3], True, "the first sync going back is forced")
        sync.around("resume-test-6", self.update)
        self.assert_synced("resume-test-6")
        from legato_client import LegatoError
        with self.assertRaises(LegatoError) as cm:
            sync.around("resume-test-2", self.update)
        self.assertEqual(cm.exception.status, 409)
        self.client.serve()


class DataSource:
    """slime's data source: get_samples(n) gives n groups of G copies."""

    def get_samples(self, num: int) -> List[List[Any]]:
        return [[slime_glue.LegatoSample(group_index=i, index=i * gc.G + j, prompt="write a note",
                                         metadata={"legato_task": dict(gc.TASK)}) for j in range(gc.G)]
                for i in range(num)]


if __name__ == "__main__":
    unittest.main()
