"""The model card's llama.cpp commands, run as a user copies them: `llama-mtmd-cli` and `llama-server`
(built by ./setup.sh from the llama.cpp inside llama-cpp-python) on the tiny run's files, answering a
smoke image; their answers are the ones smoke's llama-cpp-python run gave for that image and file."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import VENV_BIN

from vgrpo.prompts import prompt_text
from vgrpo.shapes import load_dataset

pytestmark = pytest.mark.slow  # reads the tiny pipeline's run


def card_command(card: str, program: str) -> str:
    """The card's bash block that runs `program`, continuation lines joined."""
    for block in re.findall(r"```bash\n(.*?)```", card, re.DOTALL):
        if block.startswith(program + " "):
            return block.replace("\\\n", " ").strip()
    raise AssertionError(f"the card has no {program} block")


@pytest.fixture(scope="module")
def as_a_user(tiny_pipeline, tmp_path_factory):
    """A folder laid out as models/ (the card's paths start at gguf/), the first smoke image that asks the
    card's question (about circles) saved as shapes.png, and smoke's answer to it from the file the card runs."""
    work = tmp_path_factory.mktemp("user")
    (work / "gguf").symlink_to(tiny_pipeline / "models/gguf")
    card = (tiny_pipeline / "models/README.md").read_text()
    smoke = [json.loads(line) for line in (tiny_pipeline / "reports/smoke/predictions.jsonl").read_text().splitlines()]
    test = load_dataset(tiny_pipeline / "data/shapes", splits=("test",))["test"]
    row = next(test[i] for i in range(len(test)) if test[i]["target_shape"] == "circles"
               and any(r["id"] == test[i]["id"] for r in smoke))
    row["image"].save(work / "shapes.png")
    file = re.search(r"-m gguf/(\S+\.gguf)", card_command(card, "llama-mtmd-cli"))[1]
    expected = next(r["completion"] for r in smoke if r["id"] == row["id"] and r["model"] == file)
    return work, card, row, expected


def user_env() -> dict:
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}


def test_the_cards_llama_mtmd_cli_line_answers_as_smoke_did(as_a_user):
    work, card, _, expected = as_a_user
    command = card_command(card, "llama-mtmd-cli")
    assert "--no-repack" in command  # this CPU kind may advertise AMX: the command carries what smoke does
    result = subprocess.run(command, shell=True, cwd=work, env=user_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == expected.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_cards_llama_server_line_answers_an_image_url_chat_as_smoke_did(as_a_user):
    work, card, row, expected = as_a_user
    port = free_port()
    command = card_command(card, "llama-server").replace("--port 8080", f"--port {port}")
    server = subprocess.Popen(command, shell=True, cwd=work, env=user_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "llama-server did not come up"
            time.sleep(0.5)
        image = base64.b64encode((work / "shapes.png").read_bytes()).decode()
        body = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
            {"type": "text", "text": prompt_text(row["question"])}]}], "temperature": 0, "max_tokens": 40}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())["choices"][0]["message"]["content"]
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    assert answer.strip() == expected.strip()


def test_setup_linked_the_tools_into_the_venv():
    for tool in ("llama-mtmd-cli", "llama-server"):
        path = Path(VENV_BIN) / tool
        assert path.exists() and os.access(path, os.X_OK), path
