"""Metrics that misbehave, and probes."""

import os
import sys
import time


def raise_value_error(result, expected=None, **options):
    raise ValueError("metric exploded on %r" % (result,))


def sleep_forever(result, expected=None, **options):
    while True:
        time.sleep(3600)


def exit_process(result, expected=None, **options):
    sys.stderr.write("exit_process: leaving with status 3\n")
    sys.stderr.flush()
    os._exit(3)


def return_none(result, expected=None, **options):
    return None


def noisy_exact_match(result, rules):
    print("noise on stdout", result, rules)
    sys.stdout.write("{\"id\": 999, \"score\": 0.25}\n")
    sys.stdout.flush()
    return float(result == rules["expected"])


def options_match(result, expected, **options):
    """1 when the keyword arguments are exactly the expected ones."""
    return float(options == expected)


def value_equals(result, expected):
    return float(result == expected)


def uses_package_attribute(result, rules):
    """Reaches another metric through the package, as some OSWorld modules
    do."""
    from desktop_env.evaluators.metrics import exact_match
    import desktop_env.evaluators.metrics as metrics

    assert not hasattr(metrics, "no_such_metric")
    return exact_match(result, rules)


def crash_once(result, rules):
    """Kills its process the first time it runs for rules["marker"] (a file
    it creates), and scores 1 afterwards: a worker that dies in the middle
    of a grade."""
    marker = rules["marker"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(4)
    return 1.0


def write_relative(result, rules):
    """Writes a file by a relative path, as some OSWorld metrics do, and
    scores 1 when it reads back what it wrote: two processes sharing a
    working directory would overwrite each other's file."""
    with open("temp.txt", "w") as f:
        f.write(str(result))
    time.sleep(0.05)
    with open("temp.txt") as f:
        return float(f.read() == str(result))

