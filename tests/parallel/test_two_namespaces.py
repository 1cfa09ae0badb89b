"""Two nodes that share neither a loopback nor a memory segment: two network namespaces on this machine joined by a
veth pair, each with its own /dev/shm. Node 0 runs rank 0 (tests/parallel/namespace_node.py), node 1 runs
`ember serve --nnodes 2 --node-rank 1`; the ranks meet over gloo on TCP across the pair. The group must find that
the shared-memory fast path is not there (the segment rank 0 offers is not in node 1's /dev/shm) and fall back to
gloo, and its greedy tokens must equal one process's, for tensor and for pipeline parallelism.

Made and removed by the test with `ip netns` (root); skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ember.llm import LLM
from tests.model_factory import save_tiny_model
from tests.parallel.namespace_node import OPTIONS, PROMPTS
from tests.parallel.tp_parity import greedy_tokens

REPO_ROOT = Path(__file__).resolve().parents[2]
MASTER_PORT = 29500  # inside a fresh namespace every port is free
NODE_TIMEOUT_S = 180


@dataclass(frozen=True)
class TwoNodes:
    """The namespaces' names and node 0's address (node 1 reaches it over the veth pair)."""

    namespaces: tuple[str, str]
    master_addr: str

    def command(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run in node `node`'s namespace with a /dev/shm of its own (`ip netns exec` gives the command its
        own mount namespace, whose mounts do not reach the host's)."""
        return ["ip", "netns", "exec", self.namespaces[node], "sh", "-c",
                'mount -t tmpfs ember-node-shm /dev/shm && exec "$@"', "sh", *argv]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    """Two namespaces, 10.231.0.1 and 10.231.0.2 on the two ends of a veth pair; removed after the test."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    tag = str(os.getpid())
    namespaces = (f"ember-node0-{tag}", f"ember-node1-{tag}")
    ends = (f"ev{tag}a", f"ev{tag}b")
    made = []
    try:
        for namespace in namespaces:
            _ip("netns", "add", namespace)
            made.append(namespace)
        _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
        for node, (namespace, end) in enumerate(zip(namespaces, ends, strict=True)):
            _ip("link", "set", end, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"10.231.0.{node + 1}/24", "dev", end)
            _ip("-n", namespace, "link", "set", end, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as error:
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
        detail = error.stderr.strip() if isinstance(error, subprocess.CalledProcessError) else str(error)
        pytest.skip(f"cannot make two network namespaces joined by a veth pair (needs root): {detail}")
    nodes = TwoNodes(namespaces, "10.231.0.1")
    try:
        probe = subprocess.run(nodes.command(0, ["true"]), capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"cannot give a namespace its own /dev/shm (mount needs CAP_SYS_ADMIN): {probe.stderr.strip()}")
        yield nodes
    finally:
        for namespace in namespaces:  # deleting a namespace deletes the veth end in it, and so the pair
            subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)


@pytest.mark.parametrize("mode, split_flag", [("tensor", "--tensor-parallel-size"), ("pipeline", "--pipeline-parallel-size")])
def test_two_nodes_in_two_namespaces_generate_what_one_process_does(
    two_nodes: TwoNodes, mode: str, split_flag: str, tmp_path: Path, single_thread_torch
):
    folder = save_tiny_model("llama", tmp_path / "llama")
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    rendezvous = ["--master-addr", two_nodes.master_addr, "--master-port", str(MASTER_PORT)]
    node_one = subprocess.Popen(
        two_nodes.command(1, [sys.executable, "-m", "ember.cli.main", "serve", "--model", str(folder), split_flag, "2",
                              "--nnodes", "2", "--node-rank", "1", "--threads-per-rank", "1", *rendezvous]),
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        node_zero = subprocess.run(
            two_nodes.command(0, [sys.executable, "-m", "tests.parallel.namespace_node", str(folder), "--mode", mode,
                                  *rendezvous]),
            cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
        )  # fmt: skip
        assert node_zero.returncode == 0, node_zero.stderr[-4000:]
        assert node_one.wait(60) == 0, node_one.stdout.read()[-4000:]  # told to stop by rank 0, node 1 exits cleanly
    finally:
        if node_one.poll() is None:
            node_one.kill()
            node_one.wait()
    result = json.loads(node_zero.stdout.strip().splitlines()[-1])
    assert result["shared_exchange"] is False  # rank 0's segment is not in node 1's /dev/shm: gloo carries everything
    assert result["tokens"] == greedy_tokens(LLM(str(folder), **OPTIONS), PROMPTS)
