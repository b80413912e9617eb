"""(d) Peak memory of a pre-training step: each framework in a fresh subprocess, so that neither
sees the other's allocations. The peak is the kernel's high-water mark of the process's resident
set, VmHWM in /proc/self/status (no tracing). getrusage's ru_maxrss is recorded too, but on Linux
it carries over the parent's high-water mark through fork + exec, so it only bounds the peak from
below by whatever the benchmark process held when it started the child.

Run as a script, it is that subprocess:
    python benchmarks/bench_memory.py --framework bertkit --size base --batch-size 32 --precision fp32
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def status_mb(field: str) -> float:
    """VmRSS (resident now) or VmHWM (resident high-water mark) from /proc/self/status, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def getrusage_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(framework: str, size: str, batch_size: int, precision: str, steps: int) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    import bench_common as C

    config = C.bench_config(size)
    torch.manual_seed(0)
    if framework == "bertkit":
        from bertkit import BertForPreTraining

        model = BertForPreTraining(config).train()
        optimizer = C.bertkit_optimizer(model)
    else:
        import transformers

        transformers.logging.set_verbosity_error()
        their_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "bilstm_hidden_size"})
        their_config._attn_implementation = "sdpa"
        model = transformers.BertForPreTraining(their_config).train()
        optimizer = C.transformers_optimizer(model)
    batch = C.pretraining_batch(config, batch_size, 128)
    after_build = status_mb("VmRSS")
    peak_before = status_mb("VmHWM")  # building may have peaked above the steady size (initialisation)
    for _ in range(steps):
        C.training_step(model, optimizer, batch, precision)
    return {"framework": framework, "size": size, "batch_size": batch_size, "precision": precision, "steps": steps,
            "rss_after_build_mb": round(after_build, 1), "peak_before_steps_mb": round(peak_before, 1),
            "peak_rss_mb": round(status_mb("VmHWM"), 1), "rss_after_steps_mb": round(status_mb("VmRSS"), 1),
            "getrusage_maxrss_mb": round(getrusage_peak_mb(), 1)}


def memory_case(size: str, batch_size: int, precision: str, steps: int, log=print) -> dict:
    """Both frameworks, each in its own process (bertkit first, then transformers)."""
    results = {}
    for framework in ("bertkit", "transformers"):
        command = [sys.executable, str(Path(__file__).resolve()), "--framework", framework, "--size", size,
                   "--batch-size", str(batch_size), "--precision", precision, "--steps", str(steps)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"memory subprocess failed ({framework}):\n{done.stderr[-2000:]}")
        results[framework] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, theirs = results["bertkit"], results["transformers"]
    row = {"case": "d: peak memory, pre-training step", "size": size, "precision": precision,
           "shape": f"batch {batch_size} x 128", "bertkit_peak_mb": ours["peak_rss_mb"],
           "transformers_peak_mb": theirs["peak_rss_mb"],
           "ratio": ours["peak_rss_mb"] / theirs["peak_rss_mb"],
           "bertkit_step_mb": ours["peak_rss_mb"] - ours["rss_after_build_mb"],
           "transformers_step_mb": theirs["peak_rss_mb"] - theirs["rss_after_build_mb"],
           "bertkit_getrusage_mb": ours["getrusage_maxrss_mb"], "transformers_getrusage_mb": theirs["getrusage_maxrss_mb"],
           "details": results}
    log(f"{row['case']} {size} {precision}: bertkit {row['bertkit_peak_mb']:.0f} MB, transformers "
        f"{row['transformers_peak_mb']:.0f} MB, ratio {row['ratio']:.2f}")
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("bertkit", "transformers"), required=True)
    parser.add_argument("--size", default="base")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(child(args.framework, args.size, args.batch_size, args.precision, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
