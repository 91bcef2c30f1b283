#!/usr/bin/env python3
"""Writes advantages.json: GRPO group advantages computed independently of
legato, by Python's statistics module alone (no numpy), for
TestAdvantagesReference in export_test.go.

Each group's advantages are (reward - mean) / std with the population std
(statistics.pstdev, divide by n) and with the sample std (statistics.stdev,
divide by n - 1: torch.std's default, as slime and SkyRL compute theirs).
A group whose rewards are all equal, one reward included (whose sample std
is undefined), gets advantages 0, as legato defines them.

Regenerate with:  /usr/bin/python3 export/testdata/advantages.py
"""

import json
import os
import random
import statistics


def advantages(rewards, std):
    if len(set(rewards)) <= 1:
        return [0.0] * len(rewards)
    mean = statistics.mean(rewards)
    s = std(rewards)
    return [(r - mean) / s for r in rewards]


def groups():
    fixed = [
        ("single attempt", [1.0]),
        ("one of two solved", [1.0, 0.0]),
        ("two of four solved", [1.0, 0.0, 1.0, 0.0]),
        ("one of four solved", [0.0, 0.0, 1.0, 0.0]),
        ("three of four solved", [1.0, 1.0, 0.0, 1.0]),
        ("all four solved", [1.0, 1.0, 1.0, 1.0]),
        ("all four failed", [0.0, 0.0, 0.0, 0.0]),
        ("equal fractions", [0.1, 0.1, 0.1]),
        ("partial credit", [0.5, 1.0, 0.0]),
        ("one of eight solved", [0.0] * 7 + [1.0]),
        ("five of eight solved", [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]),
        ("negative rewards", [-1.0, 0.5, -0.25, 2.0]),
        ("large rewards", [100.0, 101.5, 99.25, 100.0, 102.0]),
    ]
    rng = random.Random(49)
    for g in (2, 3, 4, 5, 8, 16):
        fixed.append((f"binary G={g}", [float(rng.random() < 0.5) for _ in range(g)]))
        fixed.append((f"partial credit G={g}", [round(rng.random(), 3) for _ in range(g)]))
    return fixed


def main():
    out = {"groups": []}
    for name, rewards in groups():
        out["groups"].append({
            "name": name,
            "rewards": rewards,
            "population": advantages(rewards, statistics.pstdev),
            "sample": advantages(rewards, statistics.stdev),
        })
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "advantages.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
