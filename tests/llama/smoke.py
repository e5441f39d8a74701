"""Prove a llama-server install works: start it on a free 127.0.0.1 port, ask for one token
(POST /completion, n_predict 1), stop it. Usage: python3 smoke.py INSTALL_DIR BUILD_NAME.
Exit 0 when a token came back; otherwise print what happened and what to do, exit 1.
Called by scripts/llama-server.sh; standard library only."""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

STARTUP_SECONDS = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def what_to_do(build):
    if build == "prebuilt":
        return ("this prebuilt binary uses CPU instructions this machine lacks; use the portable "
                "build: RUNWARDEN_LLAMA_BUILD=portable bash scripts/llama-server.sh (compiles "
                "llama.cpp for x86-64-v3, several minutes on 2 cores)")
    return ("the portable build needs an x86-64-v3 CPU (AVX2, FMA, F16C, BMI2), the baseline "
            "README.md states; check /proc/cpuinfo")


def died(proc, build, log):
    code = proc.returncode
    tail = "\n".join(log[-15:])
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        description = signal.strsignal(-code) or name
        return (f"llama-server ({build} build) died by {name} ({description.lower()}) before "
                f"answering: {what_to_do(build) if name == 'SIGILL' else 'see its log below'}"
                f"\nits log:\n{tail}")
    return f"llama-server ({build} build) exited with status {code} before answering; its log:\n{tail}"


def main():
    directory, build = sys.argv[1], sys.argv[2]
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(directory, "bin"))
    proc = subprocess.Popen(
        [os.path.join(directory, "bin", "llama-server"), "--model",
         os.path.join(directory, "model.gguf"), "--host", "127.0.0.1", "--port", str(port),
         "--ctx-size", "512", "--threads", "1", "--no-webui"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        text=True, errors="replace")
    log = []
    lines = queue.Queue()

    def read_stderr():
        for line in proc.stderr:
            lines.put(line.rstrip())
        lines.put(None)  # stderr closed: the process is gone

    threading.Thread(target=read_stderr, daemon=True).start()
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        listening = False
        while not listening:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                print(f"llama-server ({build} build) did not listen within {STARTUP_SECONDS} s; "
                      "its log:\n" + "\n".join(log[-15:]), file=sys.stderr)
                return 1
            if line is None:
                proc.wait()
                print(died(proc, build, log), file=sys.stderr)
                return 1
            log.append(line)
            listening = "listening on http://" in line
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/completion",
            data=json.dumps({"prompt": "Hello", "n_predict": 1}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=STARTUP_SECONDS) as response:
                answer = json.load(response)
        except OSError as error:
            if proc.poll() is not None:
                print(died(proc, build, log), file=sys.stderr)
            else:
                print(f"llama-server ({build} build) did not answer a one-token completion: "
                      f"{error}", file=sys.stderr)
            return 1
        if answer.get("tokens_predicted") != 1:
            print(f"llama-server ({build} build) answered without a token: {answer}",
                  file=sys.stderr)
            return 1
        print(f"llama-server ({build} build): one-token completion answered "
              f"({answer.get('content')!r})", file=sys.stderr)
        return 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
