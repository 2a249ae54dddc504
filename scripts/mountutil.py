"""Helpers shared by the benchmark and evaluation scripts."""
import json
import os
import sys


def wait_sync(mnt):
    """Read .ctxfs/sync until it says ok (it fails with ETIMEDOUT after its timeout)."""
    while True:
        try:
            with open(os.path.join(mnt, ".ctxfs/sync")) as f:
                assert f.read() == "ok\n"
                return
        except TimeoutError:
            with open(os.path.join(mnt, ".ctxfs/status")) as f:
                s = json.load(f)
            print(f"  still indexing: outbox {s['outbox_depth']}, indexed {s['indexer']['indexed_nodes']}", file=sys.stderr)


def query_name(q, opts):
    """A search file name for query `q` with options, within NAME_MAX."""
    q = q.replace("/", " ").replace("\0", " ").strip()
    name = f"{q}?{opts}"
    while len(name.encode()) > 250:
        q = q[:-1]
        name = f"{q}?{opts}"
    return name


def mount_with_llm(bin_path, model_dir, prefix, accounts, url, summaries=False, memories=None):
    """Mount ctxfs in a new temporary directory, with `accounts` (each
    writable by root) and the LLM server at `url`; returns (tmp, mnt).
    Directory summaries by the LLM are off unless asked for: the model's
    one slot is the extraction's, whose time the evaluations report.
    `memories` sets `[llm] memories` ("quoted", "written"; the daemon's
    default when None)."""
    import subprocess
    import tempfile
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    mnt, data = os.path.join(tmp, "mnt"), os.path.join(tmp, "data")
    os.makedirs(mnt)
    cfg = os.path.join(tmp, "config.toml")
    with open(cfg, "w") as f:
        for a in accounts:
            f.write(f'[[account]]\nid = "{a}"\nwriters = [0]\n')
        f.write(f'[llm]\nurl = "{url}"\nmodel = "eval"\ntimeout_s = 600\n'
                f'summaries = {"true" if summaries else "false"}\n')
        if memories:
            f.write(f'memories = "{memories}"\n')
    subprocess.run([bin_path, "mount", mnt, "--data", data, "--config", cfg,
                    "--model-dir", os.path.abspath(model_dir)], check=True)
    return tmp, mnt
