"""`ember serve --data-parallel-size 2` as a real process (tiny random Llama, SmolLM2 tokenizer), driven by the
official openai client and httpx.

Given two replicas behind one API: requests are answered by both, /metrics labels each replica's series, /health
lists both. When one replica's engine process is killed mid-run: every request gets an answer or an error (none
hangs or vanishes), /health shows the replica down, then back with a new process, and later requests are answered.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ember.engine.data_parallel_config import replica_cores
from tests.server.harness import ServeProcess, is_running, tiny_server_process

NUM_REQUESTS = 12
RESTART_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def dp_server(tiny_model_dir: Path, smollm2_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[ServeProcess]:
    """One `ember serve -dp 2` for the module, each replica pinned to its share of the cores, one thread each."""
    log_path = tmp_path_factory.mktemp("dp-serve") / "serve.log"
    settings = ("--served-model-name", "tiny", "--data-parallel-size", "2", "--data-parallel-cpus", "all", "--threads", "1",
                "--num-kv-blocks", "64",
                "--block-size", "16", "--max-model-len", "256")
    with tiny_server_process(tiny_model_dir, smollm2_tokenizer_dir, log_path, *settings) as process:
        yield process
    assert process.returncode is not None, "the server did not stop when terminated"


def replica_metric(metrics_text: str, name: str) -> dict[str, float]:
    """`name`'s value per replica label, read from the Prometheus text."""
    pattern = re.compile(rf'^{re.escape(name)}\{{[^}}]*replica="(\d+)"[^}}]*\}} (\S+)$', re.MULTILINE)
    return {replica: float(value) for replica, value in pattern.findall(metrics_text)}


def health(server: ServeProcess) -> dict:
    response = httpx.get(f"{server.base_url}/health", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


async def complete_all(server: ServeProcess, prompts: list[str], max_tokens: int) -> list[str | BaseException]:
    """Each prompt's completion text, or the error it got (no retries: what the server answered is counted)."""
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(prompt: str) -> str | BaseException:
        try:
            completion = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                         temperature=0, extra_body={"ignore_eos": True})
        except openai.APIError as error:
            return error
        return completion.choices[0].text

    async with client:
        return await asyncio.gather(*(one(prompt) for prompt in prompts))


async def until_replica_runs_requests(server: ServeProcess, replica: str, timeout_s: float = 60.0) -> None:
    """Return once `replica` reports running requests (so a kill lands mid-run, however fast the machine)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
        while replica_metric((await http.get("/metrics")).text, "ember:num_requests_running").get(replica, 0) == 0:
            assert time.monotonic() < deadline, f"replica {replica} never ran a request"
            await asyncio.sleep(0.02)


def test_two_replicas_both_answer_and_metrics_label_each(dp_server: ServeProcess) -> None:
    prompts = [f"{index} request about topic number {index * 7}" for index in range(NUM_REQUESTS)]
    answers = asyncio.run(complete_all(dp_server, prompts, max_tokens=8))
    assert all(isinstance(answer, str) for answer in answers), answers
    state = health(dp_server)
    assert state["status"] == "ok"
    assert [replica["replica"] for replica in state["replicas"]] == ["0", "1"]
    assert all(replica["is_up"] and replica["pid"] for replica in state["replicas"])
    metrics = httpx.get(f"{dp_server.base_url}/metrics", timeout=10).text
    generated = replica_metric(metrics, "ember:generation_tokens_total")
    assert set(generated) == {"0", "1"} and all(count > 0 for count in generated.values()), generated
    assert sum(generated.values()) == 8 * NUM_REQUESTS
    assert replica_metric(metrics, "ember:replica_up") == {"0": 1.0, "1": 1.0}
    cores = sorted(os.sched_getaffinity(0))  # the server's, inherited: --data-parallel-cpus all shares them out
    for replica in state["replicas"]:
        threads = Path(f"/proc/{replica['pid']}/task").iterdir()
        assert {frozenset(os.sched_getaffinity(int(thread.name))) for thread in threads} == {
            replica_cores(int(replica["replica"]), 2, cores)}


def test_a_shared_prefix_goes_to_one_replica(dp_server: ServeProcess) -> None:
    before = replica_metric(httpx.get(f"{dp_server.base_url}/metrics", timeout=10).text, "ember:prompt_tokens_total")
    shared = "You are a careful assistant who answers about the ember project in short sentences. " * 3
    for index in range(4):  # one at a time: no replica is above its load bound, so the prefix alone decides
        assert isinstance(asyncio.run(complete_all(dp_server, [shared + f"Question {index}?"], max_tokens=2))[0], str)
    after = replica_metric(httpx.get(f"{dp_server.base_url}/metrics", timeout=10).text, "ember:prompt_tokens_total")
    grown = [replica for replica in after if after[replica] > before.get(replica, 0)]
    assert len(grown) == 1, (before, after)


def test_a_client_that_leaves_mid_stream_frees_its_replica(dp_server: ServeProcess) -> None:
    body = {"model": "tiny", "prompt": "a long story", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=dp_server.base_url, timeout=60) as http, http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # streaming has begun; then the client leaves
    deadline = time.monotonic() + 30
    while any(replica_metric(httpx.get(f"{dp_server.base_url}/metrics", timeout=10).text, "ember:num_requests_running").values()):
        assert time.monotonic() < deadline, "the request kept running after its client left"
        time.sleep(0.1)


def test_killing_a_replica_mid_run_loses_no_request_and_it_comes_back(dp_server: ServeProcess) -> None:
    victim = health(dp_server)["replicas"][0]
    prompts = [f"story {index}: once upon a time" for index in range(NUM_REQUESTS)]

    async def run_and_kill() -> list[str | BaseException]:
        requests = asyncio.ensure_future(complete_all(dp_server, prompts, max_tokens=200))
        await until_replica_runs_requests(dp_server, victim["replica"])
        os.kill(victim["pid"], signal.SIGKILL)
        return await requests

    answers = asyncio.run(run_and_kill())
    assert len(answers) == NUM_REQUESTS
    errors = [answer for answer in answers if isinstance(answer, BaseException)]
    assert all(isinstance(error, openai.APIStatusError) and error.status_code == 503 for error in errors), errors
    assert sum(isinstance(answer, str) for answer in answers) >= 1, answers  # the other replica kept answering
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously: the server reaps it soon after
    while is_running(victim["pid"]):
        assert time.monotonic() < deadline, "the killed replica's process is still running"
        time.sleep(0.05)

    deadline = time.monotonic() + RESTART_DEADLINE_S
    seen_down = False
    while True:
        replica = health(dp_server)["replicas"][0]
        seen_down = seen_down or not replica["is_up"]
        if replica["is_up"] and replica["restarts"] == 1:
            break
        assert time.monotonic() < deadline, replica
        time.sleep(0.2)
    assert seen_down and replica["pid"] != victim["pid"]
    metrics = httpx.get(f"{dp_server.base_url}/metrics", timeout=10).text
    assert replica_metric(metrics, "ember:replica_restarts_total")["0"] == 1.0
    later = asyncio.run(complete_all(dp_server, [f"after {index}" for index in range(NUM_REQUESTS)], max_tokens=4))
    assert all(isinstance(answer, str) for answer in later), later


def test_requests_on_a_replica_that_dies_before_answering_are_answered_by_the_other(dp_server: ServeProcess) -> None:
    wait_until_both_up(dp_server)
    victim = health(dp_server)["replicas"][1]
    retries_before = dp_server.log_text().count("sending it to another replica")
    prompts = [f"question {index} about frozen replicas" for index in range(NUM_REQUESTS)]

    async def run_with_frozen_victim() -> list[str | BaseException]:
        os.kill(victim["pid"], signal.SIGSTOP)  # its requests are placed but stream nothing
        try:
            requests = asyncio.ensure_future(complete_all(dp_server, prompts, max_tokens=4))
            await asyncio.sleep(2.0)
        finally:
            os.kill(victim["pid"], signal.SIGKILL)
        return await requests

    answers = asyncio.run(run_with_frozen_victim())
    assert all(isinstance(answer, str) for answer in answers), answers
    assert dp_server.log_text().count("sending it to another replica") > retries_before  # some were on the victim
    wait_until_both_up(dp_server)


def wait_until_both_up(server: ServeProcess) -> None:
    """Poll /health until every replica is up (a restart reloads the model)."""
    deadline = time.monotonic() + RESTART_DEADLINE_S
    while not all(replica["is_up"] for replica in health(server)["replicas"]):
        assert time.monotonic() < deadline, health(server)
        time.sleep(0.2)
