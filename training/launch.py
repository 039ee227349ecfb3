"""`--multi-gpu ddp` started without torchrun: hand the same command to torch.distributed.run."""
import os
import shlex
import sys

import torch

from training.errors import UsageError
from training.strategy import check_parallel_args


def processes_per_node(args):
    """--nproc-per-node, else one per GPU in use, else one CPU process."""
    device_type, _ = check_parallel_args(args)
    gpus = len(args.gpu_ids) if args.gpu_ids else (torch.cuda.device_count() if device_type == "cuda" else 0)
    if args.nproc_per_node is None:
        return max(1, gpus)
    if device_type == "cuda" and args.nproc_per_node > gpus:
        raise UsageError(f"--nproc-per-node {args.nproc_per_node} is more than the {gpus} GPU(s) in use; "
                         "lower it, or use --device cpu for CPU processes")
    return args.nproc_per_node


def torchrun_command(script, argv, nproc):
    """A single-node torchrun invocation; --standalone picks a free rendezvous port itself."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            script, *argv]


def relaunch_under_torchrun(args, script, argv):
    command = torchrun_command(script, argv, processes_per_node(args))
    print("launching: " + " ".join(shlex.quote(part) for part in command), flush=True)
    if args.gpu_ids:
        # Each worker then maps LOCAL_RANK onto the chosen GPUs in order.
        print(f"  (ranks map onto --gpu-ids {','.join(map(str, args.gpu_ids))} in order)", flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, command)
