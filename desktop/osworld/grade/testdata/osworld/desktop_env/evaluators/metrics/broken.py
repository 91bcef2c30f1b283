"""A metric module whose dependency is not installed, as happens with
OSWorld's modules that need openpyxl, pptx, ..."""

import legato_fixture_module_that_does_not_exist  # noqa: F401


def needs_missing_dependency(result, expected, **options):
    return 1.0
