"""A pytest plugin for tools/diffusers_suite.sh: a run after a crash leaves out the tests an earlier
run of the same log already reached. The node ids listed in $SUITE_DONE (one a line) are deselected
by exact match; pytest's --deselect matches prefixes, and would drop test_x_y with test_x.
$SUITE_SHARD=i/n keeps every n-th test from the i-th (0-based): n processes share one file's tests."""
import os


def pytest_collection_modifyitems(config, items):
    done = set()
    if os.environ.get("SUITE_DONE"):
        with open(os.environ["SUITE_DONE"]) as f:
            done = {line.strip() for line in f if line.strip()}
    i, n = map(int, os.environ.get("SUITE_SHARD", "0/1").split("/"))
    keep = [it for j, it in enumerate(items) if j % n == i and it.nodeid not in done]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[it for it in items if id(it) not in kept])
        items[:] = keep
