"""A dead or stuck peer, recognised from what the backend raised and told in one line."""
import torch.distributed as dist

from training.errors import RankLost

# gloo raises a plain RuntimeError for both (torch 2.13), so for it only the wording tells; NCCL's
# watchdog reports its timeout as a DistBackendError whose message says so.
TIMEOUT_WORDS = ("timed out", "timeout")
CONNECTION_WORDS = ("connection closed by peer", "connection reset by peer")


def explain_lost_rank(exc, rank, timeout_s):
    """Raise RankLost in place of `exc` when it reports a lost rank; return when it does not.

    torch's DistError family names the kind where a backend raises it (NCCL, the rendezvous
    store): a store that timed out waited for a rank that never came, a network or backend
    error means a peer went away. gloo raises RuntimeError, recognised by its messages."""
    text = str(exc).lower()
    if isinstance(exc, dist.DistStoreError) or any(words in text for words in TIMEOUT_WORDS):
        raise RankLost(f"rank {rank} waited more than --dist-timeout {timeout_s:g} s for the other ranks: one "
                       "is stuck or has died. Check the other ranks' output; raise --dist-timeout only if a "
                       "step is legitimately that slow") from None
    if isinstance(exc, dist.DistError) or any(words in text for words in CONNECTION_WORDS):
        raise RankLost(f"rank {rank} lost its connection to another rank, which has most likely crashed (see its "
                       "output). With torchrun --max-restarts the group restarts and resumes from the last "
                       "checkpoint; otherwise run the same command again") from None
