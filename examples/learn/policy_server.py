"""The learning example's model server: tinyvl's policy behind an
OpenAI-compatible chat-completions endpoint, as vLLM answers it.

    python3 examples/learn/policy_server.py --addr 127.0.0.1:0 [--grid 4] [--weights FILE --version V]

It prints one line, "policy server http://HOST:PORT/v1 version V", then
serves:

- POST /v1/chat/completions: the policy looks at the prompt's last
  screenshot and samples a cell (at the request's temperature, 1 by
  default); the reply is that cell's action token and the text the Qwen
  harness turns into a click and "terminate". With "logprobs": true each
  token's logprob; with "return_token_ids": true (vLLM 0.10.2+) the
  response's "token_ids" and the prompt's "prompt_token_ids", exactly as
  tinyvl.prompt_ids makes them. "metadata.weight_version" names the weights
  that answered (SGLang's field, which legato records as the step's policy
  version).
- POST /reload {"path": FILE, "version": V}: load new weights (a state dict
  saved by train.py) and answer once calls are served by them.
- GET /v1/models, GET /health.

Loopback only; no key is needed or read. Standard library and PyTorch only.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict

import torch

import tinyvl


class PolicyState:
    """The weights in force and their version; calls and reloads take the
    lock, so a call is answered by one version from start to end."""

    def __init__(self, grid: int, seed: int, weights: str, version: str) -> None:
        torch.manual_seed(seed)
        self.model = tinyvl.Policy(grid)
        if weights:
            self.model.load_state_dict(torch.load(weights, map_location="cpu"))
        self.model.eval()
        self.version = version
        self.grid = grid
        self.lock = threading.Lock()
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.calls = 0

    def reload(self, path: str, version: str) -> None:
        state = torch.load(path, map_location="cpu")
        with self.lock:
            self.model.load_state_dict(state)
            self.version = version

    def answer(self, req: Dict[str, Any]) -> Dict[str, Any]:
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: want a non-empty list")
        ids, _ = tinyvl.prompt_ids(messages)
        urls = tinyvl.image_urls(messages)
        temperature = req.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        if urls:
            x = tinyvl.features(tinyvl.decode_png(tinyvl.png_from_data_url(urls[-1])), self.grid)
        else:
            # A prompt without a screenshot (legato's probe of a server that
            # came back): a blank screen.
            side = self.grid * tinyvl.CELL_PIXELS
            x = torch.zeros(3, side, side)
        with self.lock, torch.no_grad():
            self.calls += 1
            n, version = self.calls, self.version
            if temperature > 0:
                lp = tinyvl.logprobs(self.model, x.unsqueeze(0), temperature)[0]
                cell = int(torch.multinomial(lp.exp(), 1, generator=self.gen))
            else:
                lp = tinyvl.logprobs(self.model, x.unsqueeze(0), 1.0)[0]
                cell = int(lp.argmax())
        tok, text = tinyvl.reply(cell, self.grid)
        logprob = float(lp[cell])
        choice: Dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "stop_reason": None,
        }
        if req.get("logprobs"):
            name = tinyvl.token_text(tok)
            choice["logprobs"] = {"content": [{"token": name, "logprob": logprob,
                                               "bytes": list(name.encode()), "top_logprobs": []}]}
        resp: Dict[str, Any] = {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
            "model": req.get("model", ""), "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1},
            "metadata": {"weight_version": version},
        }
        if req.get("return_token_ids"):
            choice["token_ids"] = [tok]
            resp["prompt_token_ids"] = ids
        return resp


def handler(state: PolicyState, model_name: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: Dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> Dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            elif self.path == "/health":
                self._send(200, {"version": state.version, "calls": state.calls})
            else:
                self._send(404, {"error": {"message": f"no route GET {self.path}"}})

        def do_POST(self) -> None:
            try:
                body = self._body()
            except ValueError as e:
                self._send(400, {"error": {"message": f"body: {e}"}})
                return
            if self.path == "/v1/chat/completions":
                try:
                    self._send(200, state.answer(body))
                except (ValueError, KeyError, TypeError) as e:
                    self._send(400, {"error": {"message": str(e), "type": "BadRequestError"}})
            elif self.path == "/reload":
                try:
                    state.reload(body["path"], str(body["version"]))
                except (OSError, KeyError, RuntimeError) as e:
                    self._send(400, {"error": {"message": f"reload: {e}"}})
                    return
                self._send(200, {"version": state.version})
            else:
                self._send(404, {"error": {"message": f"no route POST {self.path}"}})

    return Handler


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", default="127.0.0.1:0", help="loopback HOST:PORT (port 0: any free)")
    ap.add_argument("--grid", type=int, default=4, help="the target tasks' grid")
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial weights and of sampling")
    ap.add_argument("--weights", default="", help="a state dict to start from (default: fresh weights)")
    ap.add_argument("--version", default="v0", help="the version of the weights it starts with")
    ap.add_argument("--model", default="tinyvl", help="the model name it serves")
    args = ap.parse_args(argv)
    host, _, port = args.addr.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"--addr {args.addr}: the example serves on loopback only", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    state = PolicyState(args.grid, args.seed, args.weights, args.version)
    srv = ThreadingHTTPServer((host, int(port)), handler(state, args.model))
    srv.daemon_threads = True
    print(f"policy server http://{host}:{srv.server_address[1]}/v1 version {state.version}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
