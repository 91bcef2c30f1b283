#!/usr/bin/env python3
"""Interface descriptors of the trainers legato's glue feeds, read from their source.

    python3 extract.py --slime PATH --skyrl PATH --verl PATH            # write slime.json, skyrl.json, verl.json here
    python3 extract.py --check --slime PATH --skyrl PATH --verl PATH    # compare, then run the glue against them

Each PATH is a checkout of the framework (THUDM/slime, NovaSky-AI/SkyRL,
volcengine/verl); any of the three may be left out. The script reads the
source with ``ast`` and imports nothing of it: it writes facts, not code.
Per framework, a small JSON file with the commit it came from (``git -C PATH
rev-parse HEAD``, or ``--slime-commit`` and the like for a tree that is not
a git checkout):

* slime: the fields and annotated types of ``Sample`` (slime/utils/types.py)
  and of the rollout function's outputs (slime/rollout/base_types.py), the
  rollout function's parameters, and the rules the rollout manager applies to
  the samples it gets (slime/ray/rollout.py, slime/observability/
  rollout_data_utils.py); where the weights are synced and served from.
* skyrl: ``GeneratorInput`` and ``GeneratorOutput`` (skyrl/train/generators/
  base.py) with the types they name, ``generate``'s signature, and the rules
  ``validate_generator_output`` (skyrl/train/utils/trainer_utils.py) checks,
  as data; where the trainers save their weights for the engines.
* verl: ``AgentLoopOutput`` and ``AgentLoopMetrics`` (verl/experimental/
  agent_loop/agent_loop.py), what an agent loop's ``run`` takes and returns,
  and what the worker reads of its output; where the weights are updated.

A rule the script does not recognise is an error naming its file and line:
teach the script the new rule (and glue_conform.py to check it) before the
descriptor is trusted.

``--check`` extracts anew, compares with the committed descriptors (every
difference listed), then starts ``legato rl serve`` on fake desktops
(``--legato``, default $LEGATO_BIN or ``legato`` on PATH), runs each glue on
its groups and checks the output against the freshly extracted descriptor,
then runs the framework's own code on it where it runs without a GPU: the
definitions are executed from the checkout's files (slime's ``Sample``,
rollout-id validation and sample conversion; SkyRL's ``TrajectoryID``,
``GeneratorInterface`` and ``validate_generator_output``; verl's
``AgentLoopOutput``, a pydantic model, when pydantic is importable), with
stand-ins only for torch when it is missing. Exit status 0 when everything
matches and passes, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import re
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the glue beside this directory

REPOS = {"slime": "THUDM/slime", "skyrl": "NovaSky-AI/SkyRL", "verl": "volcengine/verl"}


class Unrecognized(Exception):
    """A rule in the framework's source this script cannot encode."""


# -- reading source -----------------------------------------------------------


class Source:
    """A checkout: its files parsed on demand."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._mods: Dict[str, ast.Module] = {}

    def module(self, rel: str) -> ast.Module:
        if rel not in self._mods:
            path = os.path.join(self.root, rel)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path}: not in this checkout (is it {rel}'s framework, at a commit "
                                        "this script knows?)")
            with open(path) as f:
                self._mods[rel] = ast.parse(f.read(), filename=path)
        return self._mods[rel]

    def text(self, rel: str) -> str:
        with open(os.path.join(self.root, rel)) as f:
            return f.read()


def find(body: List[ast.stmt], name: str, kind: Tuple[type, ...] = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) -> Any:
    """The definition of ``name`` in ``body``: a class or function, or (with
    kind including ast.Assign) a module-level assignment to it."""
    for node in body:
        if isinstance(node, kind) and getattr(node, "name", None) == name:
            return node
        if ast.Assign in kind and isinstance(node, ast.Assign) and \
                any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if ast.Assign in kind and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == name:
            return node
    raise KeyError(name)


def fields_of(cls: ast.ClassDef) -> Dict[str, Dict[str, Any]]:
    """The annotated fields of a class body: type as written, and whether
    it must be given (no default)."""
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            t = ast.unparse(node.annotation)
            if t.startswith("ClassVar"):
                continue
            out[node.target.id] = {"type": t, "required": node.value is None}
    return out


def enum_values(cls: ast.ClassDef) -> List[Any]:
    return [n.value.value for n in cls.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]


def class_kind(cls: ast.ClassDef) -> str:
    bases = {ast.unparse(b) for b in cls.bases}
    decos = {ast.unparse(d).split("(")[0] for d in cls.decorator_list}
    if bases & {"Enum", "enum.Enum", "str, Enum"}:
        return "enum"
    if "TypedDict" in bases:
        return "typeddict"
    if "BaseModel" in bases:
        return "model"
    if decos & {"dataclass", "dataclasses.dataclass"}:
        return "dataclass"
    return "class"


def describe_class(cls: ast.ClassDef) -> Dict[str, Any]:
    kind = class_kind(cls)
    if kind == "enum":
        return {"kind": "enum", "values": enum_values(cls)}
    fields = fields_of(cls)
    if kind == "typeddict":
        total = not any(k.arg == "total" and isinstance(k.value, ast.Constant) and k.value.value is False
                        for k in cls.keywords)
        for f in fields.values():
            f["required"] = total  # every key of a total TypedDict must be there (its value may be None)
    return {"kind": kind, "fields": fields}


def aliases(mod: ast.Module) -> Dict[str, Dict[str, Any]]:
    """Module-level type aliases: ``X = List[...]``, ``X: TypeAlias = ...``."""
    out = {}
    for node in mod.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                ast.unparse(node.annotation) == "TypeAlias" and node.value is not None:
            target, value = node.target.id, node.value
        if target and value is not None and isinstance(value, (ast.Subscript, ast.Name, ast.Attribute, ast.BinOp)) \
                and target[0].isupper():
            out[target] = {"kind": "alias", "type": ast.unparse(value)}
    return out


def signature(fn: ast.AST) -> Dict[str, Any]:
    a = fn.args
    params = [p.arg for p in a.posonlyargs + a.args if p.arg not in ("self", "cls")]
    return {"async": isinstance(fn, ast.AsyncFunctionDef), "params": params,
            "defaults": len(a.defaults), "kwargs": a.kwarg is not None,
            "returns": ast.unparse(fn.returns) if fn.returns is not None else None}


def methods(cls: ast.ClassDef) -> List[str]:
    return sorted(n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def awaited_calls(fn: ast.AST) -> List[str]:
    out = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Await) and isinstance(n.value, ast.Call):
            out.append(ast.unparse(n.value.func))
    return sorted(set(out))


def calls_to(mod: ast.Module, func_text: str) -> int:
    return sum(1 for n in ast.walk(mod) if isinstance(n, ast.Call) and ast.unparse(n.func) == func_text)


# -- rules: asserts as data ------------------------------------------------------


class Canon:
    """Checks of a function as canonical text: a name stands for what it
    was last bound to where the check is, so ``len(response_ids) ==
    len(loss_masks)`` in a loop over zip(out["response_ids"], ...) reads
    ``len(out['response_ids'][i]) == len(out['loss_masks'][i])``."""

    def __init__(self, env: Dict[str, ast.expr]) -> None:
        self.env = dict(env)

    def bind(self, name: str, value: ast.expr) -> "Canon":
        c = Canon(self.env)
        if isinstance(value, (ast.List, ast.Dict, ast.Set)) or \
                isinstance(value, ast.Call) and ast.unparse(value.func) in ("set", "list", "dict"):
            c.env.pop(name, None)  # a container it fills: its name says more than its first value
        else:
            c.env[name] = ast.parse(self.text(value), mode="eval").body
        return c

    def loop(self, n: ast.For) -> "Canon":
        """The names a for loop binds, for its body."""
        c = Canon(self.env)
        # A name the body binds differs per iteration: unbound until bound.
        for x in ast.walk(n):
            if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store):
                c.env.pop(x.id, None)
        it = n.iter
        idx = ast.Name(id="i", ctx=ast.Load())
        # for i, (a, b, c) in enumerate(zip(X, Y, Z)): a is X[i] ...
        if isinstance(it, ast.Call) and ast.unparse(it.func) == "enumerate" and isinstance(n.target, ast.Tuple):
            ivar, inner = n.target.elts
            src = it.args[0]
            if isinstance(inner, ast.Tuple) and isinstance(src, ast.Call) and ast.unparse(src.func) == "zip":
                for name, seq in zip(inner.elts, src.args):
                    c.env[name.id] = ast.parse(self.text(ast.Subscript(value=seq, slice=idx, ctx=ast.Load())),
                                               mode="eval").body
            elif isinstance(inner, ast.Name):
                c.env[inner.id] = ast.parse(self.text(ast.Subscript(value=src, slice=idx, ctx=ast.Load())),
                                            mode="eval").body
            if isinstance(ivar, ast.Name):
                c.env[ivar.id] = idx
        elif isinstance(n.target, ast.Name):
            c.env.pop(n.target.id, None)  # for key in ...: key stays key
            if isinstance(it, ast.Call) and ast.unparse(it.func) == "range":
                c.env[n.target.id] = idx
        return c

    def text(self, node: ast.AST) -> str:
        env = self.env

        class Sub(ast.NodeTransformer):
            def visit_Name(self, n: ast.Name) -> ast.AST:
                return copy.deepcopy(env[n.id]) if n.id in env else n
        return ast.unparse(Sub().visit(copy.deepcopy(node)))


def asserts_with_conditions(body: List[ast.stmt], canon: Canon, conds: Tuple[Tuple[str, bool], ...] = ()):
    """Every assert, raise and call statement in ``body``, in order, with
    the if-tests around it as canonical text: (node, ((test, taken
    branch), ...), canon)."""
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            canon = canon.bind(node.targets[0].id, node.value)
        elif isinstance(node, (ast.Assert, ast.Raise)):
            yield node, conds, canon
        elif isinstance(node, ast.If):
            t = canon.text(node.test)
            yield from asserts_with_conditions(node.body, canon, conds + ((t, True),))
            yield from asserts_with_conditions(node.orelse, canon, conds + ((t, False),))
        elif isinstance(node, ast.For):
            yield from asserts_with_conditions(node.body, canon.loop(node), conds)
        elif isinstance(node, (ast.While, ast.With)):
            yield from asserts_with_conditions(node.body, canon, conds)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            yield node, conds, canon  # a call: maybe a helper that checks more


def skyrl_rules(src: Source, rel: str) -> Dict[str, Any]:
    mod = src.module(rel)
    fn = find(mod.body, "validate_generator_output")
    out_param, prompts_param = fn.args.args[1].arg, fn.args.args[0].arg
    rules: List[Dict[str, Any]] = []
    base_env = {out_param: ast.Name(id="out")}
    helpers = {n.name for n in mod.body if isinstance(n, ast.FunctionDef)}

    def walk(f: ast.AST, env: Dict[str, ast.expr], outer_when: str) -> None:
        for node, conds, canon in asserts_with_conditions(f.body, Canon(env)):
            if isinstance(node, ast.Expr) and ast.unparse(node.value.func) not in helpers:
                continue  # a warning or a container filled, not a check
            when = outer_when
            extra: Dict[str, Any] = {}
            consumed = False
            for ct, taken in conds:
                if ct in ("not step_wise", "step_wise"):
                    when = ct if taken else ("step_wise" if ct == "not step_wise" else "not step_wise")
                elif re.fullmatch(r"isinstance\(out\['(\w+)'\]\[i\], list\)", ct) and taken:
                    extra["when_row_list"] = re.fullmatch(r"isinstance\(out\['(\w+)'\]\[i\], list\)", ct).group(1)
                elif re.fullmatch(r"out\['(\w+)'\]", ct) and taken:
                    extra["when_set"] = re.fullmatch(r"out\['(\w+)'\]", ct).group(1)
                elif m := re.fullmatch(r"isinstance\(out\[key\], list\) and key in (\[.*\])", ct):
                    extra["list_keys"] = ast.literal_eval(m.group(1))
                elif re.fullmatch(r"isinstance\(out\['(\w+)'\]\[0\], list\)", ct):
                    consumed = True  # the two branches of the uniform-nesting rule
                elif "!=" in ct and "trajectory_ids" in ct and "[i + 1]" in ct:
                    extra["boundary"] = True
                elif re.fullmatch(r".*out\['trajectory_ids'\]\[i\].* != \w+", ct):
                    pass  # a new trajectory starts: the contiguity check below
                elif re.fullmatch(r"len\(out\['(\w+)'\]\) <= 0", ct):
                    extra["nonempty"] = re.fullmatch(r"len\(out\['(\w+)'\]\) <= 0", ct).group(1)
                elif ct.startswith("len(out[key])"):
                    pass
                else:
                    raise Unrecognized(f"{rel}:{node.lineno}: condition {ct!r} around a check")
            if isinstance(node, ast.Expr):
                call = node.value
                name = ast.unparse(call.func)
                if name in ("logger.warning", "logger.info", "logger.debug"):
                    continue
                try:
                    helper = find(mod.body, name, (ast.FunctionDef,))
                except KeyError:
                    continue
                henv = {}
                for p, a in zip([p.arg for p in helper.args.args], call.args):
                    henv[p] = ast.parse(canon.text(a), mode="eval").body
                walk(helper, henv, when)
                continue
            if isinstance(node, ast.Raise):
                if "nonempty" in extra:
                    rules.append({"rule": "nonempty", "key": extra["nonempty"]})
                    continue
                raise Unrecognized(f"{rel}:{node.lineno}: a raise this script does not know")
            t = canon.text(node.test)
            rule = _skyrl_rule(t, extra, prompts_param)
            if rule is None:
                if consumed and re.fullmatch(r"all\(\((not )?isinstance\(\w+, list\) for \w+ in out\['(\w+)'\]\)\)", t):
                    key = re.fullmatch(r".* in out\['(\w+)'\]\)\)", t).group(1)
                    rule = {"rule": "uniform_nesting", "key": key}
                else:
                    raise Unrecognized(f"{rel}:{node.lineno}: check {t!r}")
            if when:
                rule["when"] = when
            if rule not in rules:
                rules.append(rule)

    walk(fn, base_env, "")
    return {"source": rel, "params": [p.arg for p in fn.args.args], "rules": rules}


def _skyrl_rule(t: str, extra: Dict[str, Any], prompts: str) -> Optional[Dict[str, Any]]:
    k = r"out\['(\w+)'\]"
    if m := re.fullmatch(rf"{prompts} == len\({k}\)", t):
        return {"rule": "rows_equal_prompts", "key": m.group(1)}
    if m := re.fullmatch(rf"len\({k}\) == len\({k}\)", t):
        return {"rule": "same_length", "keys": [m.group(1), m.group(2)]}
    if m := re.fullmatch(rf"len\(out\[key\]\) == len\({k}\)", t):
        if "list_keys" not in extra:
            return None
        return {"rule": "list_keys_same_length", "keys": extra["list_keys"], "as": m.group(1)}
    if m := re.fullmatch(rf"len\({k}\[i\]\) == len\({k}\[i\]\)", t):
        r = {"rule": "row_same_length", "keys": [m.group(1), m.group(2)]}
        for c in ("when_row_list", "when_set"):
            if c in extra:
                r[c] = extra[c]
        return r
    if m := re.fullmatch(rf"out\.get\('(\w+)'\) is not None", t):
        return {"rule": "required", "key": m.group(1)}
    if m := re.fullmatch(rf"{k}\[-1\] is True", t):
        return {"rule": "last_true", "key": m.group(1)}
    if m := re.fullmatch(rf"sum\(\(1 for (\w+) in {k} if \1\)\) >= 1", t):
        return {"rule": "some_true", "key": m.group(2)}
    if m := re.fullmatch(rf".*{k}\[i\].* not in \w+", t):
        return {"rule": "contiguous", "key": m.group(1)}
    if extra.get("boundary") and (m := re.fullmatch(rf"{k}\[i\] is (not )?True", t)):
        return {"rule": "flag_at_boundaries", "flag": m.group(1), "key": "trajectory_ids"}
    return None


def slime_rules(src: Source) -> List[Dict[str, Any]]:
    rules: List[Dict[str, Any]] = []
    rel = "slime/ray/rollout.py"
    mgr = find(src.module(rel).body, "RolloutManager")
    fn = find(mgr.body, "_convert_samples_to_train_data")
    for node, conds, canon in asserts_with_conditions(fn.body, Canon({})):
        if not isinstance(node, ast.Assert):
            continue
        gate = next((g for t, _ in conds for g in re.findall(r"self\.args, '(\w+)'", t)), None)
        t = canon.text(node.test)
        if gate:
            rule = {"rule": "gated", "by": gate}
        elif m := re.fullmatch(r"len\(sample\.(\w+)\) == sample\.(\w+)", t):
            rule = {"rule": "length_equals_field", "field": m.group(1), "equals": m.group(2)}
        elif re.fullmatch(r"len\((raw_rewards|rewards)\) == len\(samples\)", t):
            rule = {"rule": "post_process_lengths"}
        else:
            raise Unrecognized(f"{rel}:{node.lineno}: check {t!r}")
        if rule not in rules:
            rules.append(rule)
    rel = "slime/observability/rollout_data_utils.py"
    fn = find(src.module(rel).body, "validate_rollout_id_annotated")
    for node, conds, canon in asserts_with_conditions(fn.body, Canon({})):
        if not isinstance(node, ast.Assert):
            continue
        t = canon.text(node.test)
        depth = [re.fullmatch(r"depth >= (\d+) and len\(node\) > 1", c) for c, _ in conds]
        depth = [m for m in depth if m]
        if re.fullmatch(r"isinstance\(node, list\)", t):
            continue  # the nesting is lists down to samples: checked as the output's shape
        if depth and re.search(r"\.rollout_id", t):
            rule = {"rule": "siblings_share", "field": "rollout_id", "min_depth": int(depth[0].group(1))}
        else:
            raise Unrecognized(f"{rel}:{node.lineno}: check {t!r}")
        if rule not in rules:
            rules.append(rule)
    return rules


# -- the three descriptors -------------------------------------------------------


def describe_slime(src: Source) -> Dict[str, Any]:
    types_rel, base_rel = "slime/utils/types.py", "slime/rollout/base_types.py"
    mod = src.module(types_rel)
    sample = find(mod.body, "Sample")
    types = {"Sample": describe_class(sample)}
    for inner in sample.body:
        if isinstance(inner, ast.ClassDef):
            types[inner.name] = describe_class(inner)
    for name in ("RolloutFnTrainOutput", "RolloutFnEvalOutput"):
        types[name] = describe_class(find(src.module(base_rel).body, name))
    rollout = find(src.module("slime/rollout/sglang_rollout.py").body, "generate_rollout")
    mgr = find(src.module("slime/ray/rollout.py").body, "RolloutManager")
    post = find(mgr.body, "_post_process_rewards")
    post_args = next(len(n.args) for n in ast.walk(post) if isinstance(n, ast.Call)
                     and ast.unparse(n.func) == "self.custom_reward_post_process_func")
    router = sorted(set(re.findall(r'"--(sglang-router-(?:ip|port))"', src.text("slime/backends/sglang_utils/arguments.py"))))
    group = find(src.module("slime/ray/actor_group.py").body, "RayTrainGroup")
    return {
        "types": types,
        "rollout_function": dict(signature(rollout), source="slime/rollout/sglang_rollout.py generate_rollout"),
        "reward_post_process": {"positional_args": post_args, "source": "slime/ray/rollout.py _post_process_rewards"},
        "rules": slime_rules(src),
        "weight_sync": {
            "trainer_group": {"class": "RayTrainGroup", "methods": [m for m in methods(group) if m == "update_weights"]},
            "update_weights_calls": {f: calls_to(src.module(f), "actor_model.update_weights")
                                     for f in ("train.py", "train_async.py")},
            "router_args": [r.replace("-", "_") for r in router],
        },
    }


def describe_skyrl(src: Source) -> Dict[str, Any]:
    base_rel = "skyrl/train/generators/base.py"
    mod = src.module(base_rel)
    types: Dict[str, Any] = {}
    for name in ("GeneratorInput", "GeneratorOutput", "TrajectoryID", "BatchMetadata"):
        types[name] = describe_class(find(mod.body, name))
    types.update({k: v for k, v in aliases(mod).items() if k == "TrainingPhase"})
    inf = aliases(src.module("skyrl/backends/skyrl_train/inference_servers/base.py"))
    types.update({k: v for k, v in inf.items() if k in ("MessageType", "ConversationType")})
    iface = find(mod.body, "GeneratorInterface")
    trainers = {}
    for rel, name in (("skyrl/train/trainer.py", "RayPPOTrainer"),
                      ("skyrl/train/fully_async_trainer.py", "FullyAsyncRayPPOTrainer")):
        cls = find(src.module(rel).body, name)
        train = find(cls.body, "train")
        trainers[name] = {"bases": [ast.unparse(b) for b in cls.bases],
                          "defines": [m for m in methods(cls) if m in ("init_weight_sync_state", "train")],
                          "train_awaits": [c for c in awaited_calls(train) if c.startswith("self.dispatch.")]}
    client = find(src.module("skyrl/backends/skyrl_train/inference_servers/remote_inference_client.py").body,
                  "RemoteInferenceClient")
    return {
        "types": types,
        "generate": dict(signature(find(iface.body, "generate")), source=f"{base_rel} GeneratorInterface.generate"),
        "validate_generator_output": skyrl_rules(src, "skyrl/train/utils/trainer_utils.py"),
        "weight_sync": {"trainers": trainers,
                        "engine_client_fields": [f for f in fields_of(client) if f == "proxy_url"]},
    }


def describe_verl(src: Source) -> Dict[str, Any]:
    rel = "verl/experimental/agent_loop/agent_loop.py"
    mod = src.module(rel)
    types = {name: describe_class(find(mod.body, name)) for name in ("AgentLoopOutput", "AgentLoopMetrics")}
    base = find(mod.body, "AgentLoopBase")
    worker = find(mod.body, "AgentLoopWorker")
    reads, mm = set(), set()
    for meth in ("_agent_loop_postprocess", "_compute_multi_modal_inputs", "_compute_score"):
        for n in ast.walk(find(worker.body, meth)):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "output":
                reads.add(n.attr)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "output.multi_modal_data.get":
                mm.add(n.args[0].value)
    register = find(mod.body, "register")
    reg_keys = sorted({k.value for n in ast.walk(register) if isinstance(n, ast.Dict) for k in n.keys
                       if isinstance(k, ast.Constant)})
    trainer = find(src.module("verl/trainer/ppo/ray_trainer.py").body, "RayPPOTrainer")
    fit = find(trainer.body, "fit")
    mgr = find(src.module("verl/checkpoint_engine/base.py").body, "CheckpointEngineManager")
    agent_mgr = find(mod.body, "AgentLoopManager")
    return {
        "types": types,
        "run": dict(signature(find(base.body, "run")), source=f"{rel} AgentLoopBase.run"),
        "init": dict(signature(find(base.body, "__init__")), source=f"{rel} AgentLoopBase.__init__"),
        "worker_reads": {"output": sorted(reads), "multi_modal_data": sorted(mm)},
        "registry": {"config_keys": sorted(set(reg_keys) | {"name"})},
        "weight_sync": {
            "fit_calls_update_weights": calls_to(fit, "self.checkpoint_manager.update_weights"),
            "manager_methods": [m for m in methods(mgr) if m == "update_weights"],
            "manager_address_fields": sorted({n.attr for n in ast.walk(agent_mgr) if isinstance(n, ast.Attribute)
                                              and isinstance(n.ctx, ast.Store) and "address" in n.attr}),
        },
    }


DESCRIBE: Dict[str, Callable[[Source], Dict[str, Any]]] = {
    "slime": describe_slime, "skyrl": describe_skyrl, "verl": describe_verl}


def commit_of(path: str, given: Optional[str]) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"extract.py: {path}: not a git checkout ({e}); name its commit with --<framework>-commit")


def extract(name: str, path: str, commit: str) -> Dict[str, Any]:
    d = {"framework": name, "repository": REPOS[name], "commit": commit,
         "generated_by": "examples/python/descriptors/extract.py"}
    d.update(DESCRIBE[name](Source(path)))
    return d


def dump(d: Dict[str, Any]) -> str:
    return json.dumps(d, indent=1, sort_keys=False) + "\n"


# -- comparing ----------------------------------------------------------------------


def differences(old: Any, new: Any, where: str = "") -> List[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in old:
            if k not in new:
                out.append(f"{where}.{k}: gone (was {json.dumps(old[k])[:80]})")
            else:
                out += differences(old[k], new[k], f"{where}.{k}")
        out += [f"{where}.{k}: new ({json.dumps(new[k])[:80]})" for k in new if k not in old]
        return out
    if old != new:
        return [f"{where or '.'}: {json.dumps(old)[:80]} -> {json.dumps(new)[:80]}"]
    return []


# -- running the glue and the frameworks' own code ------------------------------------


def _stand_in_torch() -> Any:
    """A stand-in for torch where it is missing: names for annotations."""
    import types as _t
    try:
        import torch  # noqa: F401
        return sys.modules["torch"]
    except Exception:
        m = _t.ModuleType("torch")
        m.Tensor = type("Tensor", (), {})
        m.dtype = type("dtype", (), {})
        return m


def exec_defs(path: str, names: List[str], glb: Dict[str, Any]) -> Dict[str, Any]:
    """Execute the top-level definitions ``names`` (``Class.method`` for a
    method, as a function) of the file ``path`` in a namespace holding
    ``glb``; returns the namespace."""
    with open(path) as f:
        mod = ast.parse(f.read(), filename=path)
    ns = dict(glb)
    for name in names:
        parts = name.split(".")
        node = find(mod.body, parts[0], (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign))
        for p in parts[1:]:
            node = find(node.body, p)
        # dont_inherit: their annotations evaluated as in their module, not
        # as strings (this file's from __future__ import annotations).
        code = compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])), path, "exec",
                       dont_inherit=True)
        exec(code, ns)
    return ns


class Report:
    def __init__(self) -> None:
        self.failed = False

    def line(self, ok: Optional[bool], text: str) -> None:
        tag = {True: "ok  ", False: "FAIL", None: "skip"}[ok]
        if ok is False:
            self.failed = True
        print(f"{tag} {text}", flush=True)

    def problems(self, what: str, probs: List[str]) -> None:
        self.line(not probs, f"{what}" + (f": {len(probs)} problems" if probs else ""))
        for p in probs[:10]:
            print(f"       {p}")


def run_glue(rep: Report, fresh: Dict[str, Dict[str, Any]], paths: Dict[str, str], legato: str) -> None:
    import importlib
    import glue_conform as gc
    import harness
    harness.LEGATO_BIN = legato
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        svc = harness.service(os.path.join(tmp, "run"), harness.free_port(), *gc.FIXTURE_FLAGS,
                              log_path=os.path.join(tmp, "legato.log"))
        try:
            from legato_client import Client
            client = Client(svc.url, run_dir=os.path.join(tmp, "run"))
            client.wait_ready()
            out = gc.glue_outputs(client)
            rep.line(True, f"legato rl serve ({legato}): {len(out.groups)} groups, "
                     f"{sum(len(g.attempts) for g in out.groups)} attempts, "
                     f"{sum(1 for g in out.groups for a in g.attempts if a.masked)} masked")
            for name in fresh:
                for what, probs in gc.conformance(name, out, fresh[name]):
                    rep.problems(f"{name}: glue vs descriptor: {what}", probs)
            if "slime" in paths:
                run_slime(rep, paths["slime"], client, out)
            if "skyrl" in paths:
                run_skyrl(rep, paths["skyrl"], client)
            if "verl" in paths:
                run_verl(rep, paths["verl"], out)
        finally:
            svc.close()
            importlib.invalidate_caches()


def run_slime(rep: Report, root: str, client: Any, out: Any) -> None:
    import dataclasses as dc
    import enum as en
    import importlib
    import typing
    import glue_conform as gc
    glb = {"dataclass": dc.dataclass, "field": dc.field, "Enum": en.Enum, "Any": typing.Any,
           "torch": _stand_in_torch()}
    ns = exec_defs(os.path.join(root, "slime/utils/types.py"), ["Sample"], glb)
    Sample = ns["Sample"]
    bt = exec_defs(os.path.join(root, "slime/rollout/base_types.py"), ["RolloutFnTrainOutput", "RolloutFnEvalOutput"],
                   {"dataclass": dc.dataclass, "Any": typing.Any, "Sample": Sample})
    remove = gc.stub_modules({"slime.utils.types": {"Sample": Sample},
                       "slime.rollout.base_types": {k: bt[k] for k in ("RolloutFnTrainOutput", "RolloutFnEvalOutput")}})
    import slime_glue
    try:
        importlib.reload(slime_glue)
        rep.line(slime_glue._SlimeSample is Sample, "slime: the glue builds slime's own Sample "
                 "(slime/utils/types.py Sample and slime/rollout/base_types.py, executed)")
        vd = exec_defs(os.path.join(root, "slime/observability/rollout_data_utils.py"),
                       ["validate_rollout_id_annotated"], {"Sample": Sample})
        src = exec_defs(os.path.join(root, "slime/utils/data.py"), ["get_source"], {"Sample": Sample})
        conv = exec_defs(os.path.join(root, "slime/ray/rollout.py"),
                         ["RolloutManager._convert_samples_to_train_data", "RolloutManager._post_process_rewards"],
                         {"Sample": Sample, "torch": _stand_in_torch(), "get_source": src["get_source"]})
        # The rollout manager's conversion, on a stand-in of the manager
        # (slime/ray/rollout.py's own methods, without Ray and SGLang).
        manager = type("RolloutManager", (), {k: conv[k] for k in ("_convert_samples_to_train_data",
                                                                   "_post_process_rewards")})
        fields = {f.name for f in dc.fields(Sample)}
        for layout in ("trajectory", "step"):
            groups = [slime_glue.group_to_samples(g, [None] * gc.G, layout=layout) for g in out.groups]
            flat = [s for s, _ in gc._walk_samples(groups)]
            extra = sorted({k for s in flat for k in vars(s) if k not in fields})
            rep.line(not extra, f"slime {layout}: every attribute of the samples is a field of Sample"
                     + (f" (not: {extra})" if extra else ""))
            try:
                vd["validate_rollout_id_annotated"](groups)
                rep.line(True, f"slime {layout}: validate_rollout_id_annotated (slime/observability/"
                         "rollout_data_utils.py) passes")
            except AssertionError as e:
                rep.line(False, f"slime {layout}: validate_rollout_id_annotated: {e}")
            mgr = manager()
            mgr.args = type("Args", (), {"rollout_top_p": 1.0})()
            mgr.custom_convert_samples_to_train_data_func = None
            mgr.custom_reward_post_process_func = slime_glue.reward_post_process
            try:
                data = mgr._convert_samples_to_train_data(flat)
                trained = sum(1 for m in data["loss_masks"] if sum(m))
                rep.line(True, f"slime {layout}: RolloutManager._convert_samples_to_train_data (slime/ray/rollout.py) "
                         f"takes {len(flat)} samples, {trained} with a loss mask")
            except Exception as e:
                rep.line(False, f"slime {layout}: _convert_samples_to_train_data: {type(e).__name__}: {e}")
    finally:
        remove()
        importlib.reload(slime_glue)


def run_skyrl(rep: Report, root: str, client: Any) -> None:
    import abc
    import asyncio
    import dataclasses as dc
    import importlib
    import logging
    import typing
    import glue_conform as gc
    try:
        import numpy as np
    except ImportError:
        rep.line(None, "skyrl: numpy is not importable: validate_generator_output not run")
        return
    tg = {k: getattr(typing, k) for k in ("Any", "Dict", "List", "Literal", "Optional", "TypedDict", "Union",
                                          "Hashable", "Tuple", "TypeAlias")}
    ns = exec_defs(os.path.join(root, "skyrl/backends/skyrl_train/inference_servers/base.py"),
                   ["MessageType", "ConversationType"], tg)
    rx = exec_defs(os.path.join(root, "skyrl/backends/skyrl_train/utils/routed_experts.py"),
                   ["RoutedExpertIndices"], dict(tg, np=np))
    glb = dict(tg, ABC=abc.ABC, abstractmethod=abc.abstractmethod, dataclass=dc.dataclass,
               torch=_stand_in_torch(), ConversationType=ns["ConversationType"],
               RoutedExpertIndices=rx["RoutedExpertIndices"])
    base = os.path.join(root, "skyrl/train/generators/base.py")
    b = exec_defs(base, ["TrainingPhase", "TrajectoryID", "BatchMetadata", "GeneratorInput", "GeneratorOutput",
                         "GeneratorInterface"], glb)
    v = exec_defs(os.path.join(root, "skyrl/train/utils/trainer_utils.py"),
                  ["validate_generator_output", "_validate_step_wise_fields"],
                  {"np": np, "logger": logging.getLogger("skyrl"), "GeneratorOutput": b["GeneratorOutput"]})
    remove = gc.stub_modules({"skyrl.train.generators.base": {"GeneratorInterface": b["GeneratorInterface"],
                                                        "TrajectoryID": b["TrajectoryID"]}})
    import skyrl_glue
    try:
        importlib.reload(skyrl_glue)
        ok = issubclass(skyrl_glue.LegatoGenerator, b["GeneratorInterface"]) and skyrl_glue.TrajectoryID is b["TrajectoryID"]
        rep.line(ok, "skyrl: LegatoGenerator subclasses SkyRL's GeneratorInterface, with its TrajectoryID "
                 "(skyrl/train/generators/base.py, executed)")
        for layout, step_wise in (("trajectory", False), ("step", True)):
            gen = skyrl_glue.LegatoGenerator(client, layout=layout)
            batch = gc.skyrl_batch(2, b["TrajectoryID"], b["BatchMetadata"](global_step=1, training_phase="train"))
            output = asyncio.run(gen.generate(batch))
            try:
                v["validate_generator_output"](len(batch["prompts"]), output, step_wise=step_wise)
                rep.line(True, f"skyrl {layout}: validate_generator_output (skyrl/train/utils/trainer_utils.py) "
                         f"passes on {len(output['response_ids'])} rows, step_wise={step_wise}")
            except (AssertionError, RuntimeError) as e:
                rep.line(False, f"skyrl {layout}: validate_generator_output: {e}")
    finally:
        remove()
        importlib.reload(skyrl_glue)


def run_verl(rep: Report, root: str, out: Any) -> None:
    import typing
    import glue_conform as gc
    try:
        import pydantic
    except ImportError:
        rep.line(None, "verl: pydantic is not importable: AgentLoopOutput not executed")
        return
    glb = {"BaseModel": pydantic.BaseModel, "Any": typing.Any, "Optional": typing.Optional}
    ns = exec_defs(os.path.join(root, "verl/experimental/agent_loop/agent_loop.py"),
                   ["AgentLoopMetrics", "AgentLoopOutput"], glb)
    import verl_glue
    n = 0
    for g in out.groups:
        for o in verl_glue.group_outputs(g, gc.G):
            d = gc._items(o)
            d["metrics"] = gc._items(d["metrics"])
            try:
                ns["AgentLoopOutput"](**d)
                n += 1
            except Exception as e:
                rep.line(False, f"verl: AgentLoopOutput(**output) refuses the glue's output: {e}")
                return
    rep.line(True, f"verl: AgentLoopOutput (verl/experimental/agent_loop/agent_loop.py, a pydantic "
             f"{pydantic.VERSION} model, executed) validates all {n} outputs")


# -- main ------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    for name in REPOS:
        ap.add_argument(f"--{name}", metavar="PATH", help=f"a checkout of {REPOS[name]}")
        ap.add_argument(f"--{name}-commit", metavar="SHA", help="its commit, when PATH is not a git checkout")
    ap.add_argument("--out", default=HERE, help="where the descriptors are (default: beside this script)")
    ap.add_argument("--check", action="store_true",
                    help="compare with the descriptors in --out and run the glue against them; write nothing")
    ap.add_argument("--legato", default=os.environ.get("LEGATO_BIN", "legato"),
                    help="the legato binary --check runs (default: $LEGATO_BIN, else legato on PATH)")
    args = ap.parse_args(argv)
    paths = {n: getattr(args, n) for n in REPOS if getattr(args, n)}
    if not paths:
        ap.print_usage(sys.stderr)
        print("extract.py: give at least one of --slime, --skyrl, --verl", file=sys.stderr)
        return 2
    for n, p in paths.items():
        if not os.path.isdir(p):
            print(f"extract.py: --{n} {p}: not a directory", file=sys.stderr)
            return 2
    fresh = {}
    try:
        for n, p in paths.items():
            fresh[n] = extract(n, p, commit_of(p, getattr(args, f"{n}_commit")))
    except (Unrecognized, KeyError, FileNotFoundError) as e:
        print(f"extract.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not args.check:
        for n, d in fresh.items():
            path = os.path.join(args.out, f"{n}.json")
            with open(path, "w") as f:
                f.write(dump(d))
            print(f"wrote {path} ({d['repository']} {d['commit'][:12]})")
        return 0

    rep = Report()
    for n, d in fresh.items():
        path = os.path.join(args.out, f"{n}.json")
        with open(path) as f:
            old = json.load(f)
        diffs = differences({k: v for k, v in old.items() if k != "commit"},
                            {k: v for k, v in d.items() if k != "commit"})
        same_commit = old.get("commit") == d["commit"]
        rep.line(not diffs, f"{n}: {d['repository']} at {d['commit'][:12]} "
                 f"({'the committed descriptor' + chr(39) + 's commit' if same_commit else 'committed: ' + old.get('commit', '?')[:12]}): "
                 + ("interface as committed" if not diffs else f"{len(diffs)} differences from {path}"))
        for x in diffs[:20]:
            print(f"       {x}")
    run_glue(rep, fresh, paths, args.legato)
    print("check: " + ("FAILED" if rep.failed else "passed"))
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
