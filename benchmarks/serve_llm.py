"""Continuous batching under concurrent streams: a TinyLlama-1.1B-shaped model (random weights, as
benchmarks.llm builds it) in int4, N concurrent clients each generating 128 new tokens after a
128-token prompt.

    python -m benchmarks.serve_llm [--clients 1,2,4,8] [--requests-per-client 2] [--threads 2] [--small]
                                   [--systems cuvil,cuvil-http,llamacpp-http] [--shared-prefix N] [--rounds R]

Systems:
  cuvil          cuvil.serve.continuous.ContinuousBatcher in this process (the scheduler behind `cuvil
                 serve`'s OpenAI APIs, without HTTP)
  cuvil-http     `cuvil serve ARTIFACT` in its own process, streamed /v1/completions (token-id prompts:
                 the checkpoint has no tokenizer)
  llamacpp-http  llama-cpp-python's OpenAI server (`python -m llama_cpp.server`) with its default settings
                 on the same weights as GGUF Q4_0 (benchmarks.gguf_export), streamed /v1/completions with
                 text prompts of one token per byte (the export's byte tokens), 128 tokens with the BOS
                 and SentencePiece's leading space. It has no parallel-sequence option: it runs one
                 request at a time, and by default (interrupt_requests) a new request ends the one
                 running, whose client gets the tokens it had so far
  llamacpp-http-queued  the same with --interrupt_requests False: requests wait their turn

--shared-prefix N: every prompt starts with the same N tokens (a system prompt), the rest random;
--no-prefix-reuse: the in-process batcher reads every prompt whole (the A/B of prefix reuse).

Reports, per system and client count, aggregate generated tokens/s, time to first token (p50/p99) and
inter-token latency (p50/p99), each count's aggregate against the system's 1-client one, and at the
largest count cuvil-http against llamacpp-http."""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .llm import OUT, SMALL, TINYLLAMA, make_checkpoint
from .scratch import temp_dir
from .serve import free_port, start_server
from .timing import machine_line

LLAMACPP_PROMPT_OVERHEAD = 4      # BOS and the leading space's 3 bytes (U+2581)


def _prompts(rng, count, length, shared, make):
    """count prompts of `length` units, the first `shared` of them the same in all; make(rng, n) draws n."""
    head = make(np.random.default_rng(12345), shared)
    return [head + make(rng, length - shared) for _ in range(count)]


def _ids(rng, n, vocab):
    return rng.integers(300, vocab, n).tolist()


def _text(rng, n):
    return "".join(chr(c) for c in rng.integers(ord("a"), ord("z") + 1, n))


def run_level(generate, clients, per_client, prompts):
    """clients threads, each running per_client of prompts through generate(prompt) -> an iterator whose
    items arrive as tokens do; timestamps per item."""
    ttft, itl, counts = [], [], []
    lock = threading.Lock()

    def client(k):
        for j in range(per_client):
            prompt = prompts[k * per_client + j]
            t0 = time.perf_counter()
            stamps = [time.perf_counter() for _ in generate(prompt)]
            with lock:
                ttft.append(stamps[0] - t0)
                itl.extend(np.diff(stamps).tolist())
                counts.append(len(stamps))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    pct = lambda v, q: float(np.percentile(np.array(v) * 1e3, q)) if v else float("nan")  # noqa: E731
    return {"tok_s": sum(counts) / seconds, "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99),
            "itl50": pct(itl, 50), "itl99": pct(itl, 99), "tokens": sum(counts)}


def streamed_completions(url, new_tokens):
    """generate(prompt) over an OpenAI /v1/completions stream: one item per event that carries text."""
    import httpx
    client = httpx.Client(timeout=600)

    def generate(prompt):
        body = {"prompt": prompt, "max_tokens": new_tokens, "temperature": 0.0, "stream": True}
        with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"])
                if event["choices"][0]["text"] not in ("", None):
                    yield event
    return generate


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--no-prefix-reuse", action="store_true", help="cuvil: read every prompt whole")
    ap.add_argument("--mix-rows", type=int, default=0, metavar="N",
                    help="cuvil: while streams decode, prompt tokens fill each decode step up to N rows")
    ap.add_argument("--pace-prefill", action="store_true",
                    help="cuvil: while streams decode, prompt chunks sized to take about one decode step")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--kv-cache", default="fp32", help="fp16: the opt-in half-size KV cache (cuvil only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill-chunk", type=int, default=64)
    ap.add_argument("--systems", default="cuvil")
    ap.add_argument("--rounds", type=int, default=1,
                    help="the client counts in turn this many times; medians, each ratio taken within a round")
    ap.add_argument("--small", action="store_true", help="a 4-layer 512-wide model (a quick check)")
    a = ap.parse_args(argv)
    import cuvil.llm
    from cuvil.serve.continuous import ContinuousBatcher
    levels = [int(c) for c in a.clients.split(",")]
    systems = a.systems.split(",")
    shape = SMALL if a.small else TINYLLAMA
    ckpt = make_checkpoint(shape, "llama-small" if a.small else "tinyllama-shape")
    llm = cuvil.llm.from_transformers(ckpt, precision=a.precision, max_batch=max(levels),
                                      max_seq_len=a.prompt + a.new_tokens + 8, num_threads=a.threads,
                                      cache_dir=temp_dir("cuvil-bench-serve-llm-"), measure_error=False,
                                      kv_cache=a.kv_cache)
    ids = lambda rng, n: _ids(rng, n, shape["vocab_size"])  # noqa: E731
    results, reuse, counted = {}, {}, {}
    for system in systems:
        server, close = None, lambda: None
        if system == "cuvil":
            batcher = ContinuousBatcher(llm, prefill_chunk=a.prefill_chunk, prefix_reuse=not a.no_prefix_reuse,
                                        pace_prefill=a.pace_prefill, mix_rows=a.mix_rows)
            generate, make, close = lambda p: batcher.submit(p, a.new_tokens, temperature=0.0), ids, batcher.close
        elif system == "cuvil-http":
            port, artifact = free_port(), Path(temp_dir("cuvil-bench-serve-llm-")) / "model.cuvil"
            llm.save(artifact)
            server = start_server([sys.executable, "-m", "cuvil", "serve", str(artifact), "--port", str(port),
                                   "--num-threads", str(a.threads), "--prefill-chunk", str(a.prefill_chunk)]
                                  + (["--pace-prefill"] if a.pace_prefill else [])
                                  + (["--mix-rows", str(a.mix_rows)] if a.mix_rows else []),
                                  port, "/v1/models")
            generate, make = streamed_completions(f"http://127.0.0.1:{port}", a.new_tokens), ids
        elif system.startswith("llamacpp-http"):
            from .gguf_export import export
            gguf = OUT / f"{ckpt.name}-q4_0.gguf"
            if not gguf.exists():
                export(ckpt, gguf, "q4_0", progress=lambda *_: None)
            port = free_port()
            server = start_server([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host",
                                   "127.0.0.1", "--port", str(port), "--n_ctx", str(a.prompt + a.new_tokens + 8),
                                   "--n_threads", str(a.threads), "--n_threads_batch", str(a.threads)]
                                  + (["--interrupt_requests", "False"] if system.endswith("queued") else []),
                                  port, "/v1/models")
            generate = streamed_completions(f"http://127.0.0.1:{port}", a.new_tokens)
            make = lambda rng, n: _text(rng, max(n, 0))  # noqa: E731
        else:
            raise SystemExit(f"unknown system {system!r}")
        overhead = LLAMACPP_PROMPT_OVERHEAD if system.startswith("llamacpp") else 0
        try:
            list(generate(make(np.random.default_rng(0), 16)))                     # warm-up
            rounds = []
            for r in range(a.rounds):           # the 1-client and N-client runs of a round minutes apart at most
                prompts = {c: _prompts(np.random.default_rng(c + 1000 * r), c * a.requests_per_client,
                                       a.prompt - overhead, max(a.shared_prefix - overhead, 0), make) for c in levels}
                rounds.append({c: run_level(generate, c, a.requests_per_client, prompts[c]) for c in levels})
            results[system] = rounds
            if system == "cuvil":
                reuse = dict(batcher.prompt_tokens)
            else:                          # what the server counted for the last prompt (its tokenizer's)
                import httpx
                r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=600,
                               json={"prompt": prompts[levels[-1]][-1], "max_tokens": 1}).json()
                counted[system] = r["usage"]["prompt_tokens"]
        finally:
            close()
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
    print(f"machine: {machine_line()}")
    print(f"{'TinyLlama-1.1B shape' if not a.small else 'small Llama'} {a.precision}, max_batch {max(levels)}, "
          f"{a.prompt}-token prompts ({a.shared_prefix} shared), {a.new_tokens} new tokens, "
          f"{a.requests_per_client} requests per client, {a.threads} threads, prefill chunk {a.prefill_chunk}, "
          f"{a.kv_cache} KV cache"
          f"{' (paced while streams decode)' if a.pace_prefill else ''}"
          f"{f', prompt tokens filling decode steps to {a.mix_rows} rows' if a.mix_rows else ''}")
    if reuse:
        print(f"cuvil prompt tokens: {reuse}")
    if counted:
        print(f"prompt tokens per request as the servers count them: {counted}")
    print("| system | clients | tokens/s | vs 1 client | TTFT p50 ms | TTFT p99 ms | inter-token p50 ms | "
          "inter-token p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    med = lambda rounds, f: float(np.median([f(r) for r in rounds]))  # noqa: E731
    for system, rounds in results.items():
        first, last = levels[0], levels[-1]
        for c in levels:
            m = {k: med(rounds, lambda r: r[c][k]) for k in rounds[0][c]}
            print(f"| {system} | {c} | {m['tok_s']:.1f} | {med(rounds, lambda r: r[c]['tok_s'] / r[first]['tok_s']):.2f}x"
                  f" | {m['ttft50']:.0f} | {m['ttft99']:.0f} | {m['itl50']:.1f} | {m['itl99']:.1f} |")
        each = lambda f: ", ".join(f"{f(r):.2f}x" for r in rounds)  # noqa: E731
        print(f"{system}: at {last} clients, tokens/s / 1-client's: "
              f"{each(lambda r: r[last]['tok_s'] / r[first]['tok_s'])}; inter-token p99 / 1-client median: "
              f"{each(lambda r: r[last]['itl99'] / r[first]['itl50'])} (round by round)")
    peers = [s for s in results if s.startswith("llamacpp")]
    if "cuvil-http" in results and peers:
        for c in levels:
            tok_s = {s: med(results[s], lambda r: r[c]["tok_s"]) for s in peers + ["cuvil-http"]}
            best = max(peers, key=tok_s.get)
            print(f"cuvil-http / {best} (the faster llama.cpp) aggregate tokens/s at {c} clients: "
                  f"{tok_s['cuvil-http'] / tok_s[best]:.2f}x")


if __name__ == "__main__":
    main()
