# Test fixture laid out like OSWorld's desktop_env/evaluators/metrics: the
# package imports every metric from its module, as OSWorld's does, including
# one whose module cannot be imported here.
from .basic_os import check_gnome_favorite_apps, check_text_enlarged
from .broken import needs_missing_dependency
from .faults import (
    crash_once,
    exit_process,
    noisy_exact_match,
    options_match,
    raise_value_error,
    return_none,
    sleep_forever,
    uses_package_attribute,
    value_equals,
    write_relative,
)
from .general import (
    check_direct_json_object,
    check_include_exclude,
    diff_text_file,
    exact_match,
    is_in_list,
    literal_match,
    match_in_list,
)
from .vscode import compare_text_file


def infeasible():
    pass


def always_one(result, **options):
    return 1.0
