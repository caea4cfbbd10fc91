"""Shared fixtures live in tests/fixtures/, one module per real component they start."""

pytest_plugins = [
    "tests.fixtures.redis",
    "tests.fixtures.speech",
    "tests.fixtures.models",
    "tests.fixtures.gateway",
    "tests.fixtures.browser",
]
