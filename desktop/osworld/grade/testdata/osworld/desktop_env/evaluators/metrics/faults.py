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
