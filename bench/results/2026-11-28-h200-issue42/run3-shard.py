"""pytest -p shard: keeps every n-th collected test from the i-th (SHARD=i/n), so n processes split a run."""
import os


def pytest_collection_modifyitems(config, items):
    i, n = (int(v) for v in os.environ["SHARD"].split("/"))
    keep = items[i::n]
    config.hook.pytest_deselected(items=[t for t in items if t not in keep])
    items[:] = keep
